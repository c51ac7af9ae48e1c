"""KeyService over AWS KMS: the cloud twin of the local master-key file.

Prepare asks KMS for a fresh AES-256 data key per backup, bound to an
encryption context naming the repository and the backup; only the wrapped
form (CiphertextBlob) is ever stored. Workers and restore unwrap it with
kms:Decrypt, passing the same context, so KMS refuses to hand the key of one
backup to a request made for another, and CloudTrail logs every use with the
backup's name.

Roles that only decrypt (Lambda workers, restore hosts) use
`KmsKeyService.for_unwrap(client)`: the key id comes from the wrapped key
itself, so they need neither kms:GenerateDataKey nor the repository's key id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from braid.adapters.aws.errors import AwsCall, aws_error
from braid.errors import BackupError, KeyAccessError
from braid.format.keys import DataKey, WrappedKey

if TYPE_CHECKING:  # the stubs are a development dependency: the Lambda layer does not ship them
    from types_boto3_kms.client import KMSClient


def _same_key(a: str, b: str) -> bool:
    """A key ARN and its bare id name the same key."""
    return a == b or a.endswith("/" + b) or b.endswith("/" + a)


class KmsKeyService:
    """KeyService over one customer-managed KMS key (or, unwrap-only, any key)."""

    def __init__(self, client: KMSClient, key_id: str | None) -> None:
        self.client = client
        self._key_id = key_id

    @classmethod
    def for_unwrap(cls, client: KMSClient) -> KmsKeyService:
        """Decrypt-only: for roles that hold kms:Decrypt and nothing else."""
        return cls(client, None)

    def __repr__(self) -> str:
        return f"KmsKeyService(key_id={self._key_id!r})"

    @property
    def key_id(self) -> str:
        if self._key_id is None:
            raise KeyAccessError("this KMS key service only unwraps data keys; give the repository's KMS key to make new ones")
        return self._key_id

    def generate_data_key(self, context: Mapping[str, str]) -> tuple[DataKey, WrappedKey]:
        key_id = self.key_id
        backup = context.get("braid:backup", "a backup")
        try:
            response = self.client.generate_data_key(KeyId=key_id, KeySpec="AES_256", EncryptionContext=dict(context))
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "make the data key of", backup, key_id, "kms:GenerateDataKey") from None
        wrapped = WrappedKey(key_id=str(response["KeyId"]), ciphertext=bytes(response["CiphertextBlob"]), context=dict(context))
        return DataKey(bytes(response["Plaintext"])), wrapped

    def unwrap(self, wrapped: WrappedKey) -> DataKey:
        try:
            return DataKey(self.unwrap_material(wrapped))
        except ValueError:
            backup = wrapped.context.get("braid:backup", "this backup")
            raise KeyAccessError(f"KMS returned a data key of the wrong size for {backup}: it was not made by Braid") from None

    def unwrap_material(self, wrapped: WrappedKey) -> bytes:
        """The data key's bytes (kms:Decrypt); `unwrap`, and braid copy's wrapping under another repository's key."""
        # A service bound to a key passes that key to Decrypt, so KMS refuses a
        # data key wrapped under another one (as the local key file does); an
        # unwrap-only service trusts the key id recorded with the backup.
        key_id = self._key_id or wrapped.key_id
        backup = wrapped.context.get("braid:backup", "this backup")
        try:
            response = self.client.decrypt(
                CiphertextBlob=wrapped.ciphertext, EncryptionContext=dict(wrapped.context), KeyId=key_id
            )
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "unwrap the data key of", backup, key_id, "kms:Decrypt", recorded=wrapped.key_id) from None
        return bytes(response["Plaintext"])

    def wrap_material(self, material: bytes, context: Mapping[str, str]) -> WrappedKey:
        """Wrap an existing data key (a copied backup's) under this key for `context` (kms:Encrypt)."""
        key_id = self.key_id
        backup = context.get("braid:backup", "a backup")
        try:
            response = self.client.encrypt(KeyId=key_id, Plaintext=material, EncryptionContext=dict(context))
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "wrap the copied data key of", backup, key_id, "kms:Encrypt") from None
        return WrappedKey(key_id=str(response["KeyId"]), ciphertext=bytes(response["CiphertextBlob"]), context=dict(context))

    def _error(
        self, exc: BaseException, action: str, backup: str, key_id: str, permission: str, recorded: str | None = None
    ) -> BackupError:
        """One line a DBA can act on: which backup, which key, what to fix."""
        other_key = recorded is not None and self._key_id is not None and not _same_key(recorded, key_id)

        def specific(code: str, message: str) -> BackupError | None:
            if code == "InvalidCiphertextException":
                return KeyAccessError(
                    f"KMS refused to {action} {backup}: the wrapped key or its encryption context does not match "
                    "(the key belongs to another backup or repository, or the manifest was altered)"
                )
            if code == "IncorrectKeyException" or (code == "AccessDeniedException" and other_key and "alias/" not in key_id):
                # KMS says IncorrectKeyException; some emulators say AccessDenied.
                return KeyAccessError(
                    f"{backup} was encrypted under KMS key {recorded}, not {key_id}: use the repository's original key "
                    "(or restore with the key the backup records)"
                )
            if code == "AccessDeniedException":
                also = f", or {backup} was wrapped under another key ({recorded})" if other_key else ""
                return KeyAccessError(
                    f"KMS denied {permission} on key {key_id} to {action} {backup}: grant {permission} to this role in the key policy{also}"
                )
            if code == "NotFoundException":
                return KeyAccessError(f"KMS key {key_id} not found (needed to {action} {backup}): check the key id or alias and the region")
            if code in ("DisabledException", "KMSInvalidStateException"):
                return KeyAccessError(f"KMS key {key_id} is disabled or pending deletion, so it cannot {action} {backup}: re-enable it")
            if code in ("ThrottlingException", "KMSInternalException", "KeyUnavailableException", "DependencyTimeoutException"):
                return KeyAccessError(f"KMS is unavailable or throttling ({code}) and could not {action} {backup}: run it again")
            return None

        call = AwsCall("KMS", f"trying to {action} {backup} with key {key_id}", permission)
        return aws_error(exc, call, KeyAccessError, specific)


class KmsRewrap:
    """KeyRewrapper over KMS ReEncrypt: the data key never leaves KMS in plaintext for the re-wrap.

    Needs kms:ReEncryptFrom on the key a backup records and kms:ReEncryptTo
    on the target (braid rekey); the encryption context is passed unchanged
    as both source and destination context.
    """

    def __init__(self, client: KMSClient, target_key_id: str) -> None:
        self.client = client
        self._target = target_key_id

    @classmethod
    def to_key(cls, client: KMSClient, key_id: str) -> KmsRewrap:
        """Towards `key_id` (an ARN, id or alias), recorded as its ARN, as GenerateDataKey records it."""
        try:
            arn = str(client.describe_key(KeyId=key_id)["KeyMetadata"]["Arn"])
        except (ClientError, BotoCoreError) as exc:
            raise KmsKeyService(client, key_id)._error(exc, "re-key to", "the repository's backups", key_id, "kms:DescribeKey") from None
        return cls(client, arn)

    @property
    def target_key_id(self) -> str:
        return self._target

    def rewrap(self, wrapped: WrappedKey) -> WrappedKey:
        backup = wrapped.context.get("braid:backup", "this backup")
        try:
            response = self.client.re_encrypt(
                CiphertextBlob=wrapped.ciphertext,
                SourceEncryptionContext=dict(wrapped.context),
                SourceKeyId=wrapped.key_id,
                DestinationKeyId=self._target,
                DestinationEncryptionContext=dict(wrapped.context),
            )
        except (ClientError, BotoCoreError) as exc:
            service = KmsKeyService(self.client, self._target)
            raise service._error(exc, "re-wrap the data key of", backup, self._target, "kms:ReEncryptFrom/kms:ReEncryptTo") from None
        return WrappedKey(key_id=str(response["KeyId"]), ciphertext=bytes(response["CiphertextBlob"]), context=dict(wrapped.context))


class KmsCopy:
    """DataKeyCopier between two KMS keys (braid copy): ReEncrypt to the target key and the copy's encryption context.

    The data key never leaves KMS in plaintext; needs kms:ReEncryptFrom on
    the source key and kms:ReEncryptTo on the target (another region's or
    account's key, by ARN, if its policy grants it).
    """

    def __init__(self, client: KMSClient, target_key_id: str) -> None:
        self.client = client
        self._target = target_key_id

    @property
    def target_key_id(self) -> str:
        return self._target

    def copy_wrapped(self, wrapped: WrappedKey, context: Mapping[str, str]) -> WrappedKey:
        backup = wrapped.context.get("braid:backup", "this backup")
        try:
            response = self.client.re_encrypt(
                CiphertextBlob=wrapped.ciphertext,
                SourceEncryptionContext=dict(wrapped.context),
                SourceKeyId=wrapped.key_id,
                DestinationKeyId=self._target,
                DestinationEncryptionContext=dict(context),
            )
        except (ClientError, BotoCoreError) as exc:
            service = KmsKeyService(self.client, self._target)
            raise service._error(exc, "re-wrap for the copy the data key of", backup, self._target, "kms:ReEncryptFrom/kms:ReEncryptTo") from None
        return WrappedKey(key_id=str(response["KeyId"]), ciphertext=bytes(response["CiphertextBlob"]), context=dict(context))
