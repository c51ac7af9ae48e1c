"""WalStaging over S3 (braid.ports.wal_staging): raw pushed WAL files, and the archived objects' SHA-256.

A staged PUT carries `ChecksumSHA256` (S3 refuses bytes that do not match,
and keeps the value: HEAD with ChecksumMode answers it without a download)
and `If-None-Match: *`. The WAL worker's archived object records the
plaintext's SHA-256 as user metadata `braid-sha256`, which is what lets a
host without a key tell a duplicate push from a conflicting one. Under the
repository's Object Lock it carries the retention braid.format.lock gives
archived WAL (S3Store.retention), beside the SHA-256 checksum S3 requires
on a PUT with retention. The staged
object goes by version id (the bucket is versioned: a plain DELETE would
keep the raw bytes as a noncurrent version behind a delete marker).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, cast

from botocore.exceptions import BotoCoreError, ClientError

from braid.adapters.aws.errors import error_code, http_status
from braid.adapters.aws.s3 import NOT_FOUND_CODES, S3Store
from braid.adapters.aws.s3_body import request_body
from braid.errors import AlreadyExistsError, IntegrityError
from braid.ports.wal_staging import StagedWal

SHA256_METADATA = "braid-sha256"  # x-amz-meta-braid-sha256 on an archived WAL object: its plaintext's SHA-256, hex


def _b64(hex_digest: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


def _hex(b64_digest: str | None) -> str | None:
    if not b64_digest or "-" in b64_digest:
        return None
    try:
        return base64.b64decode(b64_digest, validate=True).hex()
    except ValueError:
        return None


class S3WalStaging:
    def __init__(self, store: S3Store) -> None:
        self.store = store
        self.client = store.client
        self.bucket = store.bucket

    def _missing(self, exc: ClientError) -> bool:
        return error_code(exc) in NOT_FOUND_CODES or http_status(exc) == 404

    def put_staged(self, key: str, data: bytes | bytearray, sha256: str) -> None:
        """A bundle's bytearray (braid.ops.wal_bundled) is sent as it is, through either client (s3_body.request_body)."""
        try:
            self.client.put_object(
                Bucket=self.bucket, Key=self.store.object_key(key), Body=request_body(data), ChecksumAlgorithm="SHA256", ChecksumSHA256=_b64(sha256),
                IfNoneMatch="*",
            )
        except ClientError as exc:
            if error_code(exc) == "PreconditionFailed" or http_status(exc) in (409, 412):
                raise AlreadyExistsError(f"object {key} already exists in {self.store.url}") from None
            raise self.store.error(exc, "staging WAL to", key, "s3:PutObject on wal-staging/NAME/*") from None
        except BotoCoreError as exc:
            raise self.store.error(exc, "staging WAL to", key, "s3:PutObject on wal-staging/NAME/*") from None

    def _staged(self, response: dict[str, Any], key: str, data: bytes | None) -> StagedWal:
        recorded = _hex(response.get("ChecksumSHA256"))
        if recorded is None:
            raise IntegrityError(f"staged WAL {self.store.url}/{key} has no SHA-256 checksum: not staged by braid wal-push")
        return StagedWal(key, int(response["ContentLength"]), recorded, response.get("VersionId"), data)

    def staged(self, key: str) -> StagedWal | None:
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=self.store.object_key(key), ChecksumMode="ENABLED")
        except ClientError as exc:
            if self._missing(exc):
                return None
            raise self.store.error(exc, "reading metadata of", key, "s3:GetObject on wal-staging/NAME/*") from None
        except BotoCoreError as exc:
            raise self.store.error(exc, "reading metadata of", key, "s3:GetObject on wal-staging/NAME/*") from None
        return self._staged(dict(response), key, None)

    def read_staged(self, key: str, version: str | None = None) -> StagedWal | None:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self.store.object_key(key), "ChecksumMode": "ENABLED"}
        if version:
            params["VersionId"] = version
        got = self._get(key, params)
        if got is None:
            return None
        response, data = got
        staged = self._staged(response, key, data)
        actual = hashlib.sha256(data).hexdigest()
        if actual != staged.sha256 or len(data) != staged.size:
            raise IntegrityError(f"staged WAL {self.store.url}/{key} does not match its SHA-256 (stored {staged.sha256}, read {actual}): damaged")
        return staged

    def read_staged_range(self, key: str, version: str | None, start: int, length: int) -> bytes | None:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self.store.object_key(key), "Range": f"bytes={start}-{start + max(length, 1) - 1}"}
        if version:
            params["VersionId"] = version
        got = self._get(key, params)
        return None if got is None else got[1]

    def _get(self, key: str, params: dict[str, Any]) -> tuple[dict[str, Any], bytes] | None:
        """(the response, its body) of a GET of staged WAL; None when the object (or that version) is gone."""
        try:
            response = self.client.get_object(**params)
            return dict(response), bytes(response["Body"].read())
        except ClientError as exc:
            if self._missing(exc) or error_code(exc) in ("NoSuchVersion", "InvalidArgument"):
                return None
            raise self.store.error(exc, "reading staged WAL", key, "s3:GetObject (and s3:GetObjectVersion) on wal-staging/NAME/*") from None
        except BotoCoreError as exc:
            raise self.store.error(exc, "reading staged WAL", key, "s3:GetObject on wal-staging/NAME/*") from None

    def archived_sha256(self, key: str) -> str | None:
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=self.store.object_key(key))
        except ClientError as exc:
            if self._missing(exc):
                return None
            raise self.store.error(exc, "reading metadata of", key, "s3:GetObject on wal/NAME/*") from None
        except BotoCoreError as exc:
            raise self.store.error(exc, "reading metadata of", key, "s3:GetObject on wal/NAME/*") from None
        return str((response.get("Metadata") or {}).get(SHA256_METADATA, ""))

    def put_archived(self, key: str, blob: bytes | bytearray, sha256: str) -> None:
        try:
            self.client.put_object(
                # botocore takes a bytearray as a blob (its validator: bytes, bytearray, str): a pack is not copied again.
                Bucket=self.bucket, Key=self.store.object_key(key), Body=cast(bytes, blob), ChecksumAlgorithm="SHA256",
                ChecksumSHA256=base64.b64encode(hashlib.sha256(blob).digest()).decode(), IfNoneMatch="*",
                Metadata={SHA256_METADATA: sha256}, **self.store.retention(key),
            )
        except ClientError as exc:
            if error_code(exc) == "PreconditionFailed" or http_status(exc) in (409, 412):
                raise AlreadyExistsError(f"object {key} already exists in {self.store.url}") from None
            raise self.store.error(exc, "writing", key, self.store.permission_for_put(key, " on wal/*")) from None
        except BotoCoreError as exc:
            raise self.store.error(exc, "writing", key, self.store.permission_for_put(key, " on wal/*")) from None

    def remove_staged(self, key: str, version: str | None) -> None:
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self.store.object_key(key)}
        if version:
            params["VersionId"] = version
        try:
            self.client.delete_object(**params)
        except ClientError as exc:
            if self._missing(exc) or error_code(exc) == "NoSuchVersion":
                return  # removed by an earlier delivery of the same event
            raise self.store.error(exc, "removing staged WAL", key, "s3:DeleteObjectVersion on wal-staging/*") from None
        except BotoCoreError as exc:
            raise self.store.error(exc, "removing staged WAL", key, "s3:DeleteObjectVersion on wal-staging/*") from None
