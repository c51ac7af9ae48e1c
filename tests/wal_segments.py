"""Synthetic PostgreSQL WAL segments for the archive's tests: a real long page header, database-like bytes (1 MiB segments by default: PostgreSQL's smallest)."""

from __future__ import annotations

import random
import struct
from pathlib import Path

from braid.format.wal import WalFile

SYSID = 7_412_345_678_901_234_567
_LONG_HEADER = struct.Struct("<HHIQI4xQII")


def segment_bytes(name: str, *, size: int = 1 << 20, sysid: int = SYSID, seed: int = 0, marker: bytes = b"") -> bytes:
    """A whole segment `name` of a cluster `sysid`: its long page header, then compressible pages (with `marker` in each)."""
    file = WalFile.parse(name)
    header = _LONG_HEADER.pack(0xD110, 0x0002 | 0x0004, file.timeline, file.segno(size) * size, 0, sysid, size, 8192)
    rng = random.Random(f"{name}/{seed}")
    page = (marker + rng.randbytes(512) + b"\0" * 3000) * 2
    body = (page * (size // len(page) + 1))[: size - len(header)]
    return header + body


def write_segment(directory: Path, name: str, **kwargs: object) -> Path:
    path = directory / name
    path.write_bytes(segment_bytes(name, **kwargs))  # type: ignore[arg-type]
    return path
