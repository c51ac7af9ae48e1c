"""S3's multipart limits, and the segment size the agent picks within them.

Checked before anything is written, so a chunk size S3 would refuse fails
at once with the flag to change, not after the first segment.
"""

from __future__ import annotations

from braid.errors import UsageError

MAX_PARTS = 10_000  # S3's limit per multipart upload
MIN_PART_SIZE = 5 * 1024**2  # S3's minimum for every part but the last
MAX_PART_SIZE = 5 * 1024**3
MAX_OBJECT_SIZE = 5 * 1024**4
SEGMENT_TARGET_BYTES = 2 * 1024**3


def default_segment_parts(chunk_size: int) -> int:
    """Parts per segment: about 2 GiB, so the pipeline starts after the first 2 GiB.

    Smaller segments start the fan-out sooner but cost more records and
    CompleteMultipartUpload calls; 2 GiB keeps a TiB at ~512 segments. Any
    stream fits, as segments are unlimited; each stays within 10,000 parts.
    """
    return max(1, min(MAX_PARTS, -(-SEGMENT_TARGET_BYTES // chunk_size)))


def check_sizes(chunk_size: int, segment_parts: int, min_part_size: int = MIN_PART_SIZE) -> None:
    """Refuse chunk and segment sizes S3's multipart uploads cannot hold."""
    if not 0 < chunk_size <= MAX_PART_SIZE:
        raise UsageError(f"chunk size {chunk_size} is outside S3's part sizes (up to 5 GiB)")
    if segment_parts > 1 and chunk_size < min_part_size:
        raise UsageError(f"chunk size {chunk_size} is below S3's minimum part size of {min_part_size} bytes; use --chunk-size 5MiB or more")
    if not 1 <= segment_parts <= MAX_PARTS:
        raise UsageError(f"{segment_parts} parts per segment: S3 allows 1 to {MAX_PARTS}")
    if segment_parts * chunk_size > MAX_OBJECT_SIZE:
        raise UsageError(f"segments of {segment_parts} x {chunk_size} bytes exceed S3's 5 TiB object limit")
