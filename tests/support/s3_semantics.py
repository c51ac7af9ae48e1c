"""S3 as AWS answers it, where moto's (5.2) differs and Braid depends on it.

ListObjectsV2 with a delimiter: AWS returns a CommonPrefix only for a
"folder" holding at least one current object ("ListObjectsV2 returns
some or all (up to 1,000) of the objects in a bucket"; in a versioned
bucket a deleted object is a delete marker, which the listing omits, and
so its folder too: https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/DeleteMarker.html).
moto builds common prefixes from every key, delete markers included, so a
pruned backup's `data/NAME/ID/` would still be listed. The scheduled prune
finds leftovers from exactly that listing (braid.ops.leftovers.
leftover_candidates). `install` fixes it.

UploadPart to an upload that was aborted (or never existed): AWS answers
404 `NoSuchUpload` ("The specified upload does not exist. The upload ID may
be invalid, or the upload may have been aborted or completed.", S3 API
Reference, UploadPart, Errors), which no SDK retries. moto looks the upload
up with a bare dict index, so its server answers 500 InternalError, which
botocore retries with backoff for minutes: an agent whose staging the
pipeline's Cleanup aborted would look, on the emulator only, as if it kept
retrying a transient fault. `AwsS3` makes moto raise NoSuchUpload there.
"""

from __future__ import annotations

from typing import Any

from moto.s3.exceptions import NoSuchUpload
from moto.s3.models import FakeDeleteMarker, S3Backend

_original: Any = None


def _current(bucket: Any, folder: str) -> bool:
    return any(name.startswith(folder) and not isinstance(key, FakeDeleteMarker) for name, key in bucket.keys.items())


def install() -> None:
    """Patch moto's S3 backend's delimiter listing in this process (idempotent)."""
    global _original
    if _original is not None:
        return
    _original = S3Backend.list_objects

    def list_objects(self: Any, bucket: Any, prefix: Any, delimiter: Any, marker: Any, max_keys: Any) -> Any:
        keys, folders, truncated, next_marker = _original(self, bucket, prefix, delimiter, marker, max_keys)
        return keys, [folder for folder in folders if _current(bucket, folder)], truncated, next_marker

    S3Backend.list_objects = list_objects  # type: ignore[method-assign]


class AwsS3:
    """UploadPart to an aborted or unknown upload answers NoSuchUpload, as on AWS (uninstall restores moto's)."""

    def __init__(self) -> None:
        self._saved: Any = None

    def install(self) -> AwsS3:
        original = S3Backend.upload_part
        self._saved = original

        def upload_part(backend: S3Backend, bucket_name: str, multipart_id: str, part_id: int, value: bytes) -> Any:
            if multipart_id not in backend.get_bucket(bucket_name).multiparts:
                raise NoSuchUpload(upload_id=multipart_id)
            return original(backend, bucket_name, multipart_id, part_id, value)

        S3Backend.upload_part = upload_part  # type: ignore[method-assign]
        return self

    def uninstall(self) -> None:
        if self._saved is not None:
            S3Backend.upload_part = self._saved  # type: ignore[method-assign]
            self._saved = None
