"""S3 as AWS answers it, where moto's server (moto 5.2.5) differs and Braid depends on it.

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
from moto.s3.models import S3Backend


class AwsS3:
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
