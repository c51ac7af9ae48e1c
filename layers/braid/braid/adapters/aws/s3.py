"""ObjectStore over S3 (boto3): where a cloud repository lives.

Every write carries a CRC64NVME checksum (S3's full-object checksum) so S3
verifies the bytes it received and keeps the value, which HEAD returns for a
quick verify without downloading. `create_only` is a conditional PUT
(`If-None-Match: *`): S3 answers 412 if the key exists, so a retried or late
worker can never replace a published chunk.

With the repository's Object Lock setting (`use_object_lock`, from its
config.json or the pipeline's environment) every chunk, manifest and
archived WAL object PUT also carries ObjectLockMode and
ObjectLockRetainUntilDate (braid.format.lock says which keys and until
when; a replacing PUT keeps the replaced version's date). S3 requires
Content-MD5 or an SDK checksum on such a PUT: the CRC64NVME every PUT here
sends is one. A PUT refused for want of s3:PutObjectRetention names it.

Errors are turned into Braid's typed errors with one line naming the bucket,
the key and, for access errors, the IAM permission the role lacks
(`map_error`, S3's codes on top of braid.adapters.aws.errors). Retries are
the client's (braid.adapters.aws.clients), plus retry_conflicts for the 409s
botocore does not retry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError

from braid.adapters.aws.clients import s3_client
from braid.adapters.aws.errors import AwsCall, aws_error, error_code, http_status
from braid.adapters.aws.retries import retry_conflicts
from braid.adapters.aws.s3_body import request_body
from braid.adapters.aws.s3_retention import extend_retention, lock_head
from braid.errors import AlreadyExistsError, BackupError, IntegrityError, NotFoundError, RepositoryError, StorageError, UsageError
from braid.format.buffers import WritableBuffer
from braid.format.checksum import checksum_from_header, crc64nvme, s3_checksum_value, stored_checksum, tagged_checksum
from braid.format.lock import ObjectLock, retention_until, rewrite_until
from braid.ports.progress_relay import ProgressRelay
from braid.ports.store import Buffer, ObjectInfo, Retained

if TYPE_CHECKING:  # the stubs are a development dependency: the Lambda layer does not ship them
    from types_boto3_s3.client import S3Client
    from types_boto3_s3.type_defs import ObjectIdentifierTypeDef

T = TypeVar("T")

DELETE_BATCH = 1000  # DeleteObjects' limit per request
_READ_BLOCK = 8 * 1024**2
_RANGE_BLOCK = 1024**2  # get_range_into's reads: urllib3 copies each through a temporary of this size

NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_CHECKSUM_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch", "InvalidChecksum"})
_SLOWDOWN_CODES = frozenset({"SlowDown", "503", "ServiceUnavailable"})
THROTTLE_ADVICE = "lower --concurrency or --rate-limit and resume"

_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")  # fullmatch: `$` admits a trailing newline


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split `s3://bucket/prefix` into (bucket, prefix without surrounding slashes)."""
    if not url.startswith("s3://"):
        raise UsageError(f"invalid S3 repository {url!r}: expected s3://BUCKET or s3://BUCKET/PREFIX")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not _BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
        raise UsageError(
            f"invalid S3 bucket name {bucket!r} in {url!r}: 3-63 lowercase letters, digits, '.' or '-', "
            "starting and ending with a letter or digit"
        )
    prefix = prefix.strip("/")
    if prefix:
        parts = prefix.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise UsageError(f"invalid S3 prefix {prefix!r} in {url!r}: no empty, '.' or '..' path segments")
    return bucket, prefix


def map_error(exc: BaseException, *, action: str, bucket: str, key: str | None, permission: str) -> BackupError:
    """One actionable line for a failed S3 call (`key` is the full S3 key)."""
    where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    doing = f"{action} {where}"
    if isinstance(exc, FlexibleChecksumError):
        return StorageError(f"checksum mismatch while {doing}: the bytes changed on the way; run it again")

    def specific(code: str, message: str) -> BackupError | None:
        if code == "NoSuchBucket":
            return RepositoryError(f"bucket {bucket} does not exist (while {doing}); check the repository URL and region")
        if code in NOT_FOUND_CODES:
            return NotFoundError(f"object {key} not found in s3://{bucket}")
        if code.startswith("KMS.") and "AccessDenied" in code:
            return StorageError(f"access denied while {doing}: the role needs {permission} on it ({message})")
        if code.startswith("KMS."):
            return StorageError(f"S3 could not use the bucket's KMS key while {doing}: {message} (the role needs kms:GenerateDataKey/kms:Decrypt on it)")
        if code in _CHECKSUM_CODES:
            return StorageError(f"S3 rejected {where} while {action}: checksum mismatch, the bytes changed on the way; nothing was stored")
        if code == "InvalidRequest" and "objectlock" in message.replace(" ", "").lower():
            return StorageError(
                f"bucket {bucket} has no Object Lock, but the repository's config.json asks for retention (while {doing}):"
                " enable Object Lock on the bucket, or use a bucket that has it"
            )
        if code == "InvalidRange":
            return StorageError(f"range outside object {where} while {action}: the object is shorter than the repository expects")
        if code in _SLOWDOWN_CODES:
            return StorageError(f"S3 kept throttling while {doing} (SlowDown) after retries; {THROTTLE_ADVICE}")
        return None

    return aws_error(exc, AwsCall("S3", doing, permission, THROTTLE_ADVICE), StorageError, specific)


def checksum_from_response(response: Mapping[str, Any]) -> str | None:
    """A full-object CRC64NVME from a HEAD/PUT/Complete response, as "crc64nvme:<b64>"."""
    value = response.get("ChecksumCRC64NVME")
    if not value or "-" in str(value):
        return None
    if response.get("ChecksumType") not in (None, "FULL_OBJECT"):
        return None
    return checksum_from_header(str(value))


def batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """`items` in lists of up to `size` (DeleteObjects takes 1,000 keys a request)."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class S3Store:
    """ObjectStore over one bucket and key prefix.

    `retries` is where the client reports its retries, when it was built to
    (`from_url`); whoever runs an operation points it at its ProgressFn.
    """

    def __init__(
        self, client: S3Client, bucket: str, prefix: str = "", *, retries: ProgressRelay | None = None, object_lock: ObjectLock | None = None
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._base = f"{self.prefix}/" if self.prefix else ""
        self.retries = retries or ProgressRelay()
        self.object_lock = object_lock

    def use_object_lock(self, lock: ObjectLock) -> None:
        """Put every chunk and manifest from now on with `lock`'s retention (RetainingStore).

        A lock set already (the pipeline's, from the stack) is kept: the stack
        configured the bucket, and the config.json it wrote at init says the same.
        """
        if self.object_lock is None:
            self.object_lock = lock

    def retention(self, key: str) -> dict[str, Any]:
        """The Object Lock parameters of a PUT of `key` now ({} for an object that stays deletable)."""
        until = retention_until(self.object_lock, key) if self.object_lock is not None else None
        if until is None or self.object_lock is None:
            return {}
        return {"ObjectLockMode": self.object_lock.mode, "ObjectLockRetainUntilDate": until}

    def replacing_retention(self, key: str) -> dict[str, Any]:
        """The Object Lock parameters of a PUT replacing the current version of `key` (braid.format.lock.rewrite_until:
        the current version's date, read by a HEAD, so a rekeyed WAL object keeps the date of its write)."""
        if self.object_lock is None or not self.retention(key):
            return {}
        head = lock_head(self, key)
        if head is None:
            return self.retention(key)  # gone: the conditional PUT says so
        until = rewrite_until(self.object_lock, key, head.get("ObjectLockRetainUntilDate"))
        return {} if until is None else {"ObjectLockMode": head.get("ObjectLockMode") or self.object_lock.mode, "ObjectLockRetainUntilDate": until}

    def extend_retention(self, key: str, until: datetime) -> Retained | None:
        """braid.ports.store.RetentionExtending: never shortens, never bypasses (braid.adapters.aws.s3_retention)."""
        return extend_retention(self, key, until)

    def permission_for_put(self, key: str, where: str = "") -> str:
        """The IAM permissions a PUT of `key` takes: s3:PutObject, and s3:PutObjectRetention where it carries retention."""
        return f"s3:PutObject and s3:PutObjectRetention{where}" if self.retention(key) else f"s3:PutObject{where}"

    @classmethod
    def from_url(cls, url: str, client: S3Client | None = None, *, light: bool = False, **client_options: Any) -> S3Store:
        """The store an `s3://bucket/prefix` URL names, with a client of its own unless given one (`light`: s3_client's)."""
        bucket, prefix = parse_s3_url(url)
        if client is not None:
            return cls(client, bucket, prefix)
        relay = ProgressRelay()
        return cls(s3_client(on_retry=relay, light=light, **client_options), bucket, prefix, retries=relay)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def object_key(self, key: str) -> str:
        """The full S3 key of a repository-relative key."""
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"invalid object key {key!r}")
        return self._base + key

    def relative_key(self, s3_key: str) -> str:
        return s3_key[len(self._base) :] if self._base and s3_key.startswith(self._base) else s3_key

    def error(self, exc: BaseException, action: str, key: str | None, permission: str) -> BackupError:
        """map_error for a repository-relative key (None: the repository itself)."""
        return map_error(exc, action=action, bucket=self.bucket, key=self.object_key(key) if key else self._base or None, permission=permission)

    def sync(self, keys: Iterable[str]) -> None:
        """Nothing to do: S3 has stored an object durably when PUT returns."""

    def put(
        self, key: str, data: Buffer, *, checksum: str | None = None, create_only: bool = False, durable: bool = True, replacing: str | None = None
    ) -> None:
        self._put(key, data, stored_checksum(data), checksum=checksum, create_only=create_only, replacing=replacing)

    def put_pieces(self, key: str, pieces: Sequence[Buffer], *, checksum: str | None = None, create_only: bool = False) -> None:
        """braid.ports.store.PiecewisePut: one object of `pieces` back to back, sent from their own buffers (a pack's frames)."""
        value = 0
        for piece in pieces:
            value = crc64nvme(piece, value)
        self._put(key, list(pieces), tagged_checksum(value), checksum=checksum, create_only=create_only, replacing=None)

    def _put(
        self, key: str, data: Buffer | list[Buffer], actual: str, *, checksum: str | None, create_only: bool, replacing: str | None
    ) -> None:
        # Checked here too, not only by S3: a mismatch means the caller's
        # buffer changed after it was checksummed, and some S3-compatible
        # servers (and emulators) accept a wrong checksum without a word.
        if checksum is not None and actual != checksum:
            raise StorageError(
                f"checksum mismatch writing s3://{self.bucket}/{self.object_key(key)}: data changed in memory before it was stored; nothing was written"
            )
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self.object_key(key),
            "ChecksumAlgorithm": "CRC64NVME",
            "ChecksumCRC64NVME": s3_checksum_value(actual),
            **(self.replacing_retention(key) if replacing is not None else self.retention(key)),
        }
        if create_only:
            params["IfNoneMatch"] = "*"
        if replacing is not None:
            params["IfMatch"] = replacing

        def send() -> None:
            self.client.put_object(Body=request_body(data), **params)

        try:
            # A concurrent write to the same key answers 409; the next attempt
            # then succeeds or finds the object (412).
            retry_conflicts(send, operation="PutObject", on_retry=self.retries)
        except ClientError as exc:
            precondition = error_code(exc) == "PreconditionFailed" or http_status(exc) == 412
            if create_only and precondition:
                raise AlreadyExistsError(f"object {key} already exists in {self.url}") from None
            if replacing is not None and (precondition or error_code(exc) in NOT_FOUND_CODES):
                raise IntegrityError(f"object {key} in {self.url} changed or went since it was read; nothing was replaced") from None
            raise self.error(exc, "writing", key, self.permission_for_put(key)) from None
        except BotoCoreError as exc:
            raise self.error(exc, "writing", key, self.permission_for_put(key)) from None

    def get(self, key: str) -> bytes:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))
            return bytes(response["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "reading", key, "s3:GetObject") from None

    def get_into(self, key: str, buffer: WritableBuffer) -> memoryview:
        """The whole object, read into `buffer` when it fits (else into a new one).

        Never resizes `buffer`: views of its previous contents may still be
        alive in other threads (restore's reused buffers).

        Read in blocks through botocore's body, not `readinto` on the raw
        stream, so botocore still checks the length and the CRC64NVME S3
        returns with the object.
        """
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))
            size = int(response["ContentLength"])
            view = memoryview(buffer if len(buffer) >= size else bytearray(size))
            body = response["Body"]
            filled = 0
            while True:
                block = body.read(_READ_BLOCK)
                if not block:
                    break
                if filled + len(block) > size:
                    raise StorageError(f"s3://{self.bucket}/{self.object_key(key)} returned more bytes than its length {size}; run it again")
                view[filled : filled + len(block)] = block
                filled += len(block)
            if filled != size:
                raise StorageError(f"s3://{self.bucket}/{self.object_key(key)} ended after {filled} of {size} bytes; run it again")
            return view[:filled]
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "reading", key, "s3:GetObject") from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key), Range=f"bytes={start}-{start + length - 1}")
            return bytes(response["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "reading", key, "s3:GetObject") from None

    def get_range_into(self, key: str, start: int, length: int, buffer: WritableBuffer) -> memoryview:
        """`get_range`, read into `buffer` when it fits (else into a new one); never resizes `buffer`.

        Read through botocore's body (`readinto`), which counts what arrives
        and raises if the response ends short of its Content-Length; in
        blocks, since urllib3 reads each one into a temporary first: a
        block that fits the CPU cache is a cheap copy, a 64 MiB one is fresh
        pages (the cost this method exists to avoid).
        """
        if length <= 0:
            return memoryview(buffer)[:0]
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key), Range=f"bytes={start}-{start + length - 1}")
            size = int(response["ContentLength"])
            if size > length:
                raise StorageError(f"s3://{self.bucket}/{self.object_key(key)} returned {size} bytes for a range of {length}; run it again")
            view = memoryview(buffer if len(buffer) >= size else bytearray(size))[:size]
            body = response["Body"]
            filled = 0
            while filled < size:
                n = body.readinto(view[filled : min(size, filled + _RANGE_BLOCK)])  # type: ignore[arg-type]  # the stubs say IO[bytes]; botocore takes any writable buffer
                if not n:
                    break
                filled += n
            if filled != size or body.read(1):  # the last read also has botocore check the length it was promised
                raise StorageError(f"s3://{self.bucket}/{self.object_key(key)} returned {filled} bytes of a {size}-byte range; run it again")
            return view
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "reading", key, "s3:GetObject") from None

    def head(self, key: str) -> ObjectInfo | None:
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=self.object_key(key), ChecksumMode="ENABLED")
        except ClientError as exc:
            if error_code(exc) in NOT_FOUND_CODES or http_status(exc) == 404:
                return None
            # Without s3:ListBucket, S3 answers 403 for a missing key too.
            raise self.error(exc, "reading metadata of", key, "s3:GetObject (and s3:ListBucket, or S3 reports a missing key as 403)") from None
        except BotoCoreError as exc:
            raise self.error(exc, "reading metadata of", key, "s3:GetObject") from None
        return ObjectInfo(
            key,
            int(response["ContentLength"]),
            checksum_from_response(response),
            response.get("LastModified"),
            response.get("ETag"),
            str(response.get("StorageClass") or "STANDARD"),  # HEAD names no class for Standard
            response.get("ObjectLockRetainUntilDate"),  # only with s3:GetObjectRetention; S3 says nothing otherwise
        )

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """braid.ports.store.StorageClasses: CopyObject onto itself with StorageClass and MetadataDirective COPY.

        Same bytes, metadata and key; S3 computes a fresh full-object
        CRC64NVME, so HEAD still answers a quick verify. The bucket is
        versioned, so the copy is a new version. Under Object Lock the new
        version is then given the original's retention date
        (PutObjectRetention on its version id), and the old version stays,
        locked and billed in its old class, until that date passes and the
        noncurrent-version lifecycle removes it (infra/braid_infra/storage.py).
        Were the new version lost in between, the locked old one is current again.
        """
        full = self.object_key(key)
        retention = self.replacing_retention(key)  # read before the copy: a date recomputed at the move would differ
        try:
            response = self.client.copy_object(
                Bucket=self.bucket,
                Key=full,
                CopySource={"Bucket": self.bucket, "Key": full},
                StorageClass=storage_class,  # type: ignore[arg-type]  # one of braid.format.storage_class.MOVABLE
                MetadataDirective="COPY",
                ChecksumAlgorithm="CRC64NVME",
            )
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, f"moving to {storage_class}", key, "s3:GetObject and s3:PutObject") from None
        if not retention:
            return
        try:
            self.client.put_object_retention(
                Bucket=self.bucket,
                Key=full,
                VersionId=response["VersionId"],
                Retention={"Mode": retention["ObjectLockMode"], "RetainUntilDate": retention["ObjectLockRetainUntilDate"]},
            )
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "locking the moved version of", key, "s3:PutObjectRetention") from None

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        yield from self.list_after(prefix, "")

    def list_after(self, prefix: str, after: str) -> Iterator[ObjectInfo]:
        """braid.ports.store.ListingAfter: ListObjectsV2's StartAfter."""
        paginator = self.client.get_paginator("list_objects_v2")
        full = self._base + prefix
        pages = paginator.paginate(Bucket=self.bucket, Prefix=full, StartAfter=self.object_key(after)) if after else paginator.paginate(Bucket=self.bucket, Prefix=full)
        try:
            for page in pages:
                for item in page.get("Contents", []):
                    yield ObjectInfo(
                        self.relative_key(item["Key"]), int(item["Size"]), modified=item.get("LastModified"), storage_class=str(item.get("StorageClass") or "STANDARD")
                    )
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "listing", prefix or None, "s3:ListBucket") from None

    def list_prefixes(self, prefix: str) -> Iterator[str]:
        """braid.ports.store.PrefixListing: ListObjectsV2 with Delimiter "/" (1,000 prefixes a page)."""
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._base + prefix, Delimiter="/"):
                for common in page.get("CommonPrefixes", []):
                    yield self.relative_key(common["Prefix"])
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "listing", prefix or None, "s3:ListBucket") from None

    def delete(self, keys: Iterable[str]) -> None:
        for batch in batches(keys, DELETE_BATCH):
            self._delete_batch(batch)

    def _delete_batch(self, keys: Sequence[str]) -> None:
        objects: list[ObjectIdentifierTypeDef] = [{"Key": self.object_key(key)} for key in keys]
        try:
            response = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
        except (ClientError, BotoCoreError) as exc:
            raise self.error(exc, "deleting objects under", None, "s3:DeleteObject") from None
        errors = response.get("Errors") or []
        if errors:
            first = errors[0]
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            code = first.get("Code", "")
            hint = "; the role needs s3:DeleteObject" if code == "AccessDenied" else ""
            raise StorageError(f"S3 did not delete s3://{self.bucket}/{first.get('Key')}{more}: {code}: {first.get('Message', '')}{hint}")
