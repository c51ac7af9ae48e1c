"""MultipartStore over S3: the agent's segments, and the janitor's aborts and purges.

Same bucket, prefix, client and error mapping as the repository's S3Store,
so a multipart call fails with the same one line as any other S3 call. The
client retries throttling and server errors; NoSuchUpload is never retried
but becomes UploadGoneError, which the caller reads (the uploader: "the
pipeline's cleanup aborted it", or "an earlier attempt of this Complete
already completed it").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from braid.adapters.aws.errors import error_code
from braid.adapters.aws.light_wire import send_buffer_max
from braid.adapters.aws.s3 import DELETE_BATCH, S3Store, batches, checksum_from_response
from braid.adapters.aws.s3_body import request_body
from braid.errors import StorageError
from braid.ports.multipart import OpenUpload, SentPart, StoredPart, UploadGoneError, part_pieces
from braid.ports.store import Buffer

if TYPE_CHECKING:  # the stubs are a development dependency: the Lambda layer does not ship them
    from types_boto3_s3.type_defs import ObjectIdentifierTypeDef

T = TypeVar("T")

_WRITE = "s3:PutObject"
_Listing = Literal["list_multipart_uploads", "list_parts", "list_object_versions"]


class S3Multipart:
    """MultipartStore over one bucket and key prefix (an S3Store's)."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        self.client = store.client
        self.bucket = store.bucket

    def _call(self, action: str, key: str, permission: str, request: Callable[[], T]) -> T:
        try:
            return request()
        except ClientError as exc:
            if error_code(exc) == "NoSuchUpload":
                raise UploadGoneError(
                    f"the staging upload of s3://{self.bucket}/{self.store.object_key(key)} was aborted (by the pipeline's cleanup or "
                    f"the bucket lifecycle) while {action} it; start a new backup"
                ) from None
            if error_code(exc) == "InvalidPart" and action == "completing":
                # A part this agent sent is no longer the one S3 holds: another agent re-sent it (a concurrent --resume).
                raise StorageError(
                    f"S3 refused completing s3://{self.bucket}/{self.store.object_key(key)}: its parts were replaced meanwhile;"
                    " another agent is resuming this backup at the same time: let that one finish (see 'braid list --incomplete'"
                    " and 'braid status')"
                ) from None
            raise self.store.error(exc, action, key, permission) from None
        except BotoCoreError as exc:
            raise self.store.error(exc, action, key, permission) from None

    def path_sample(self) -> tuple[float, int] | None:
        """The light client's measured RTT and the host's tcp_wmem maximum; None for botocore's client (no RTT)."""
        measure = getattr(type(self.client), "round_trip_seconds", None)  # on the type: never the full client's fallback
        rtt = measure(self.client) if measure is not None else None
        window = send_buffer_max() if rtt else None
        return (rtt, window) if rtt and window else None

    def create_upload(self, key: str) -> str:
        response = self._call(
            "starting the upload of",
            key,
            _WRITE,
            lambda: self.client.create_multipart_upload(
                Bucket=self.bucket, Key=self.store.object_key(key), ChecksumAlgorithm="CRC64NVME", ChecksumType="FULL_OBJECT"
            ),
        )
        return str(response["UploadId"])

    def upload_part(self, key: str, upload_id: str, number: int, data: Buffer | Sequence[Buffer], checksum: str) -> str:
        pieces = part_pieces(data)
        response = self._call(
            f"uploading part {number} of",
            key,
            _WRITE,
            lambda: self.client.upload_part(
                Bucket=self.bucket,
                Key=self.store.object_key(key),
                UploadId=upload_id,
                PartNumber=number,
                Body=request_body(pieces),
                ContentLength=sum(memoryview(p).nbytes for p in pieces),
                ChecksumAlgorithm="CRC64NVME",
                ChecksumCRC64NVME=checksum,
            ),
        )
        echoed = response.get("ChecksumCRC64NVME")
        if echoed and echoed != checksum:
            raise StorageError(f"S3 stored part {number} of {key} with checksum {echoed}, expected {checksum}; run --resume to send it again")
        return str(response["ETag"])

    def complete_upload(self, key: str, upload_id: str, parts: Sequence[SentPart], checksum: str, size: int) -> str | None:
        response = self._call(
            "completing",
            key,
            _WRITE,
            lambda: self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self.store.object_key(key),
                UploadId=upload_id,
                MultipartUpload={"Parts": [{"PartNumber": p.number, "ETag": p.etag, "ChecksumCRC64NVME": p.checksum} for p in parts]},
                ChecksumCRC64NVME=checksum,
                ChecksumType="FULL_OBJECT",
                MpuObjectSize=size,
            ),
        )
        return checksum_from_response(response)

    def list_uploads(self, prefix: str) -> Iterator[OpenUpload]:
        full = self.store.object_key(prefix)
        for page in self._pages("list_multipart_uploads", "listing uploads under", prefix, "s3:ListBucketMultipartUploads", Prefix=full):
            for item in page.get("Uploads") or []:
                yield OpenUpload(self.store.relative_key(item["Key"]), str(item["UploadId"]))

    def list_parts(self, key: str, upload_id: str) -> Iterator[StoredPart]:
        pages = self._pages(
            "list_parts", "listing uploaded parts of", key, "s3:ListMultipartUploadParts", Key=self.store.object_key(key), UploadId=upload_id
        )
        for page in pages:
            for part in page.get("Parts") or []:
                yield StoredPart(int(part["PartNumber"]), int(part["Size"]), str(part["ETag"]), part.get("ChecksumCRC64NVME"))

    def abort_upload(self, key: str, upload_id: str) -> None:
        try:
            self._call(
                "aborting a stale upload of",
                key,
                "s3:AbortMultipartUpload",
                lambda: self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.store.object_key(key), UploadId=upload_id),
            )
        except UploadGoneError:
            pass  # aborted (or completed) meanwhile: nothing left to drop

    def purge_versions(self, prefix: str, exact: bool = False) -> int:
        purged = 0
        only = self.store.object_key(prefix) if exact else None
        pages = self._pages(
            "list_object_versions", "purging old versions under", prefix, "s3:ListBucketVersions and s3:DeleteObjectVersion",
            Prefix=self.store.object_key(prefix),
        )
        for page in pages:
            doomed: list[ObjectIdentifierTypeDef] = [
                {"Key": v["Key"], "VersionId": v["VersionId"]}
                for v in (page.get("Versions") or []) + (page.get("DeleteMarkers") or [])
                if only is None or v["Key"] == only
            ]
            for batch in batches(doomed, DELETE_BATCH):
                self._delete_versions(prefix, batch)
                purged += len(batch)
        return purged

    def _delete_versions(self, prefix: str, versions: list[ObjectIdentifierTypeDef]) -> None:
        response = self._call(
            "purging old versions under",
            prefix,
            "s3:DeleteObjectVersion",
            lambda: self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": versions, "Quiet": True}),
        )
        if response.get("Errors"):
            first = response["Errors"][0]
            raise StorageError(f"could not delete old versions of s3://{self.bucket}/{first.get('Key')}: {first.get('Code')} {first.get('Message')}")

    def _pages(self, operation: _Listing, action: str, key: str, permission: str, **params: Any) -> Iterator[Mapping[str, Any]]:
        """Every page of a listing, each failure mapped like any other call (NoSuchUpload too)."""
        pages = iter(self.client.get_paginator(operation).paginate(Bucket=self.bucket, **params))
        while True:
            page = self._call(action, key, permission, lambda: next(pages, None))
            if page is None:
                return
            yield page
