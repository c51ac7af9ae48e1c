"""Where moto's S3 differs from AWS in what Braid relies on, the emulator follows AWS.

ListObjectsV2 with a delimiter: AWS returns a CommonPrefix only for a
"folder" holding at least one current object ("ListObjectsV2 returns
some or all (up to 1,000) of the objects in a bucket"; in a versioned
bucket a deleted object is a delete marker, which the listing omits, and
so its folder too: https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html,
https://docs.aws.amazon.com/AmazonS3/latest/userguide/DeleteMarker.html).
moto 5.2 builds common prefixes from every key, delete markers included,
so a pruned backup's `data/NAME/ID/` would still be listed. The scheduled
prune finds leftovers from exactly that listing (braid.ops.leftovers.
leftover_candidates).
"""

from __future__ import annotations

from typing import Any

from moto.s3.models import FakeDeleteMarker, S3Backend

_original: Any = None


def _current(bucket: Any, folder: str) -> bool:
    return any(name.startswith(folder) and not isinstance(key, FakeDeleteMarker) for name, key in bucket.keys.items())


def install() -> None:
    """Patch moto's S3 backend in this process (idempotent)."""
    global _original
    if _original is not None:
        return
    _original = S3Backend.list_objects

    def list_objects(self: Any, bucket: Any, prefix: Any, delimiter: Any, marker: Any, max_keys: Any) -> Any:
        keys, folders, truncated, next_marker = _original(self, bucket, prefix, delimiter, marker, max_keys)
        return keys, [folder for folder in folders if _current(bucket, folder)], truncated, next_marker

    S3Backend.list_objects = list_objects  # type: ignore[method-assign]
