"""Human byte sizes (`64MiB`, `8M`, `1g`) for CLI options and reports."""

from __future__ import annotations

import re

from braid.errors import UsageError

MIN_CHUNK = 4 * 1024  # --chunk-size bounds: below, per-chunk overhead dominates; above, one chunk is a worker's whole memory
MAX_CHUNK = 1024**3
# --chunk-size when none is given follows where the chunks are stored.
# A directory: 16 MiB. A chunk is the unit each worker compresses, so the
# first compression waits for one chunk's read and the last chunk's workers
# run alone; at 64 MiB a 256 MiB stream is four chunks on two cores, and
# start-up, the first read and that tail were a fifth of its backup
# (scripts/bench local at 256 MiB: backup 0.87x of `zstd -T2 | openssl` at
# 64 MiB, 1.0x at 16 MiB; at 2 GiB both ~1.24x). Memory, (inputs + workers
# + 1) chunks, shrinks by four. zstd's window at level 3 is far below either
# size, so the ratio does not change.
# s3://: 64 MiB, with either engine. Every chunk is an S3 request (a PUT, and
# on the pipeline an UploadPart and a worker's GET), billed per request.
DEFAULT_CHUNK_DIRECTORY = 16 * 1024**2
DEFAULT_CHUNK_S3 = 64 * 1024**2

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}

_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)


def parse_size(text: str) -> int:
    """Parse a size; bare `K/M/G/T` are binary, as in dd and zstd."""
    match = _PATTERN.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise UsageError(f"invalid size {text!r}: use a number with an optional unit such as 64MiB, 8M or 1G")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value != int(value):
        raise UsageError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(n: float) -> str:
    """Format bytes with binary units: three significant figures below 100 of a unit, whole units from 100.

    Never in scientific notation: `.3g` would print 1000-1023.x of a unit
    (and any TiB count from 1000) as `1.02e+03` (tests/test_sizes.py).
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < (1024 if unit == "B" else 1023.5) or unit == "TiB":  # 1023.5 MiB would round to 1024 MiB: 1 GiB
            return f"{n:.0f} {unit}" if unit == "B" or abs(n) >= 100 else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def default_chunk_size(repository_url: str) -> int:
    """The chunk size of a backup to this repository when --chunk-size is not given (see DEFAULT_CHUNK_DIRECTORY)."""
    return DEFAULT_CHUNK_S3 if repository_url.startswith("s3://") else DEFAULT_CHUNK_DIRECTORY
