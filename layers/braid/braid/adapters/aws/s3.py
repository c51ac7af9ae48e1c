"""ObjectStore over S3 (boto3): where a cloud repository lives.

Every write carries a CRC64NVME checksum (S3's full-object checksum) so S3
verifies the bytes it received and keeps the value, which HEAD returns for a
quick verify without downloading. `create_only` is a conditional PUT
(`If-None-Match: *`): S3 answers 412 if the key exists, so a retried or late
worker can never replace a published chunk.

Errors are turned into Braid's typed errors with one line naming the bucket,
the key and, for access errors, the IAM permission the role lacks.
"""

from __future__ import annotations

import io
import random
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError, HTTPClientError, NoCredentialsError, NoRegionError
from botocore.exceptions import ConnectionError as BotoConnectionError

from braid.errors import AlreadyExistsError, BackupError, NotFoundError, RepositoryError, StorageError, UsageError
from braid.format.checksum import ALGORITHM, s3_checksum_value, stored_checksum
from braid.ports.store import Buffer, ObjectInfo

DELETE_BATCH = 1000  # DeleteObjects' limit per request
_READ_BLOCK = 8 * 1024**2
_CONFLICT_ATTEMPTS = 5  # 409 ConditionalRequestConflict: S3 asks us to retry

# S3 error codes worth another attempt after botocore's own retries gave up.
RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "503",
        "500",
        "ConditionalRequestConflict",
        "OperationAborted",
    }
)

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_ACCESS_CODES = frozenset({"AccessDenied", "403", "Forbidden", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch"})
_CHECKSUM_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch", "InvalidChecksum"})

_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split `s3://bucket/prefix` into (bucket, prefix without surrounding slashes)."""
    if not url.startswith("s3://"):
        raise UsageError(f"invalid S3 repository {url!r}: expected s3://BUCKET or s3://BUCKET/PREFIX")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not _BUCKET_NAME.match(bucket) or ".." in bucket:
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


def s3_client(
    *,
    concurrency: int = 10,
    region: str | None = None,
    endpoint_url: str | None = None,
    retry_mode: str = "standard",
    max_attempts: int = 8,
    session: Any = None,
) -> Any:
    """A boto3 S3 client sized for `concurrency` threads sharing it.

    boto3 clients are thread-safe; the pool must hold one connection per
    thread plus a few for records and listings, or urllib3 discards and
    reopens connections. Connections open lazily, so a generous floor costs
    nothing when a caller does not say how many threads it runs.
    `AWS_ENDPOINT_URL` (an emulator, s3proxy) is honoured by boto3 itself.
    "standard" retries back off with jitter on throttling, 5xx and connection
    errors; "adaptive" also rate-limits the client when S3 answers SlowDown.
    """
    import boto3

    if retry_mode not in ("standard", "adaptive", "legacy"):
        raise UsageError(f"invalid retry mode {retry_mode!r}: use standard or adaptive")
    config = Config(
        retries={"mode": retry_mode, "total_max_attempts": max_attempts},
        max_pool_connections=max(64, concurrency + 8),
        connect_timeout=10,
        read_timeout=120,
        tcp_keepalive=True,
        # We send CRC64NVME ourselves on every write; botocore's default
        # CRC32 (with aws-chunked trailers) would be redundant work, and some
        # S3-compatible servers do not accept trailers.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_supported",
        # SigV4 would otherwise SHA-256 every payload byte on http endpoints
        # (emulators, s3proxy): over 1 CPU-second per GiB on the host. Every
        # write carries a CRC64NVME that S3 verifies, which covers integrity.
        s3={"payload_signing_enabled": False},
    )
    factory = session or boto3.session.Session()
    kwargs: dict[str, Any] = {"config": config}
    if region:
        kwargs["region_name"] = region
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
    try:
        return factory.client("s3", **kwargs)
    except NoRegionError:
        raise UsageError("no AWS region configured: set AWS_DEFAULT_REGION or AWS_REGION") from None


def error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return ""


def http_status(exc: BaseException) -> int:
    if isinstance(exc, ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return 0


def is_retryable(exc: BaseException) -> bool:
    """Throttling, server errors and dropped connections: worth another attempt."""
    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return True
    if isinstance(exc, ClientError):
        return error_code(exc) in RETRYABLE_CODES or http_status(exc) >= 500
    return False


def map_error(exc: BaseException, *, action: str, bucket: str, key: str | None, permission: str) -> BackupError:
    """One actionable line for a failed S3 call."""
    where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    if isinstance(exc, NoCredentialsError):
        return StorageError(
            f"no AWS credentials found while {action} {where}: configure a profile, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an instance role"
        )
    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return StorageError(f"cannot reach S3 while {action} {where}: {exc}; check the network, proxy or AWS_ENDPOINT_URL")
    if isinstance(exc, ClientError):
        code = error_code(exc)
        message = exc.response.get("Error", {}).get("Message", "") or code
        if code == "NoSuchBucket":
            return RepositoryError(f"bucket {bucket} does not exist (while {action} {where}); check the repository URL and region")
        if code in _NOT_FOUND_CODES:
            return NotFoundError(f"object {key} not found in s3://{bucket}")
        if code in _ACCESS_CODES or code.startswith("KMS.") and "AccessDenied" in code:
            return StorageError(f"access denied while {action} {where}: the role needs {permission} on it ({message})")
        if code.startswith("KMS."):
            return StorageError(f"S3 could not use the bucket's KMS key while {action} {where}: {message} (the role needs kms:GenerateDataKey/kms:Decrypt on it)")
        if code in _CHECKSUM_CODES:
            return StorageError(f"S3 rejected {where} while {action}: checksum mismatch, the bytes changed on the way; nothing was stored")
        if code == "InvalidRange":
            return StorageError(f"range outside object {where} while {action}: the object is shorter than the repository expects")
        if code in ("SlowDown", "503", "ServiceUnavailable"):
            return StorageError(f"S3 kept throttling while {action} {where} (SlowDown) after retries; lower --concurrency or --rate-limit and resume")
        if is_retryable(exc):
            return StorageError(f"S3 kept failing while {action} {where} after retries: {code}: {message}")
        return StorageError(f"S3 refused {action} {where}: {code}: {message}")
    if isinstance(exc, FlexibleChecksumError):
        return StorageError(f"checksum mismatch while {action} {where}: the bytes changed on the way; run it again")
    if isinstance(exc, BotoCoreError):
        return StorageError(f"error while {action} {where}: {exc}")
    return StorageError(f"error while {action} {where}: {exc}")


def checksum_from_response(response: dict[str, Any]) -> str | None:
    """A full-object CRC64NVME from a HEAD/PUT/Complete response, as "crc64nvme:<b64>"."""
    value = response.get("ChecksumCRC64NVME")
    if not value or "-" in str(value):
        return None
    if response.get("ChecksumType") not in (None, "FULL_OBJECT"):
        return None
    return f"{ALGORITHM}:{value}"


_SEND_BLOCK = 1024 * 1024


class _ViewReader(io.RawIOBase):
    """A seekable file over a memoryview slice, so botocore sends it without a copy."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        # Direct, one copy per block (RawIOBase.read would copy twice). The
        # HTTP layer asks for 8-16 KiB at a time; answering with up to 1 MiB
        # (every caller sends or hashes whatever it gets) cuts a 64 MiB part
        # from ~8,000 Python calls and sends to 64: the agent's CPU per GiB
        # is mostly these calls otherwise (scripts/bench cloud).
        if size is not None and size >= 0:
            size = max(size, _SEND_BLOCK)
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        block = bytes(self._view[self._pos : end])
        self._pos = max(self._pos, end)
        return block

    def readinto(self, target: Any) -> int:
        n = min(len(target), len(self._view) - self._pos)
        if n <= 0:
            return 0
        memoryview(target)[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._view)


def request_body(data: Buffer) -> Any:
    """What botocore accepts without copying the whole buffer: bytes or a seekable file.

    botocore refuses memoryviews, and moto's in-process stub mishandles
    bytearrays, so anything but bytes goes through a reader over the caller's
    (pool) buffer: no second chunk-sized allocation, which keeps the agent's
    memory bound, and botocore can rewind it for its own retries.
    """
    if isinstance(data, bytes):
        return data
    return _ViewReader(memoryview(data))


class S3Store:
    """ObjectStore over one bucket and key prefix."""

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._base = f"{self.prefix}/" if self.prefix else ""

    @classmethod
    def from_url(cls, url: str, client: Any = None, **client_options: Any) -> S3Store:
        bucket, prefix = parse_s3_url(url)
        return cls(client or s3_client(**client_options), bucket, prefix)

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

    def _error(self, exc: BaseException, action: str, key: str | None, permission: str) -> BackupError:
        return map_error(exc, action=action, bucket=self.bucket, key=self.object_key(key) if key else self._base or None, permission=permission)

    def sync(self, keys: Iterable[str]) -> None:
        """Nothing to do: S3 has stored an object durably when PUT returns."""

    def put(self, key: str, data: Buffer, *, checksum: str | None = None, create_only: bool = False, durable: bool = True) -> None:
        # Checked here too, not only by S3: a mismatch means the caller's
        # buffer changed after it was checksummed, and some S3-compatible
        # servers (and emulators) accept a wrong checksum without a word.
        actual = stored_checksum(data)
        if checksum is not None and actual != checksum:
            raise StorageError(
                f"checksum mismatch writing s3://{self.bucket}/{self.object_key(key)}: data changed in memory before it was stored; nothing was written"
            )
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self.object_key(key),
            "ChecksumAlgorithm": "CRC64NVME",
            "ChecksumCRC64NVME": s3_checksum_value(actual),
        }
        if create_only:
            params["IfNoneMatch"] = "*"
        for attempt in range(_CONFLICT_ATTEMPTS):
            body = request_body(data)
            try:
                self.client.put_object(Body=body, **params)
                return
            except ClientError as exc:
                code = error_code(exc)
                if create_only and (code == "PreconditionFailed" or http_status(exc) == 412):
                    raise AlreadyExistsError(f"object {key} already exists in {self.url}") from None
                if code == "ConditionalRequestConflict" and attempt + 1 < _CONFLICT_ATTEMPTS:
                    # A concurrent write to the same key was in flight; S3 asks
                    # for a retry, which then succeeds or finds the object (412).
                    time.sleep(random.uniform(0, 0.05 * 2**attempt))
                    continue
                raise self._error(exc, "writing", key, "s3:PutObject") from None
            except BotoCoreError as exc:
                raise self._error(exc, "writing", key, "s3:PutObject") from None
        raise StorageError(f"writing {key} to {self.url} kept conflicting with concurrent writes; run it again")  # pragma: no cover

    def get(self, key: str) -> bytes:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))
            return response["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "reading", key, "s3:GetObject") from None

    def get_into(self, key: str, buffer: bytearray) -> memoryview:
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
            raise self._error(exc, "reading", key, "s3:GetObject") from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            response = self.client.get_object(
                Bucket=self.bucket, Key=self.object_key(key), Range=f"bytes={start}-{start + length - 1}"
            )
            return response["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "reading", key, "s3:GetObject") from None

    def head(self, key: str) -> ObjectInfo | None:
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=self.object_key(key), ChecksumMode="ENABLED")
        except ClientError as exc:
            if error_code(exc) in _NOT_FOUND_CODES or http_status(exc) == 404:
                return None
            # Without s3:ListBucket, S3 answers 403 for a missing key too.
            raise self._error(exc, "reading metadata of", key, "s3:GetObject (and s3:ListBucket, or S3 reports a missing key as 403)") from None
        except BotoCoreError as exc:
            raise self._error(exc, "reading metadata of", key, "s3:GetObject") from None
        return ObjectInfo(key, int(response["ContentLength"]), checksum_from_response(response))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        paginator = self.client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._base + prefix):
                for item in page.get("Contents", []):
                    yield ObjectInfo(self.relative_key(item["Key"]), int(item["Size"]))
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "listing", prefix or None, "s3:ListBucket") from None

    def delete(self, keys: Iterable[str]) -> None:
        batch: list[str] = []
        for key in keys:
            batch.append(key)
            if len(batch) == DELETE_BATCH:
                self._delete_batch(batch)
                batch = []
        if batch:
            self._delete_batch(batch)

    def _delete_batch(self, keys: list[str]) -> None:
        objects = [{"Key": self.object_key(key)} for key in keys]
        try:
            response = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "deleting objects under", None, "s3:DeleteObject") from None
        errors = response.get("Errors") or []
        if errors:
            first = errors[0]
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            code = first.get("Code", "")
            hint = "; the role needs s3:DeleteObject" if code == "AccessDenied" else ""
            raise StorageError(
                f"S3 did not delete s3://{self.bucket}/{first.get('Key')}{more}: {code}: {first.get('Message', '')}{hint}"
            )
