"""PostgreSQL's incremental backup files, read as pg_combinebackup reads them (PostgreSQL 17+).

An incremental backup (`pg_basebackup --incremental`) holds, for a relation
segment that changed little, `INCREMENTAL.<name>` instead of `<name>`
(src/backend/backup/basebackup_incremental.c writes it,
src/bin/pg_combinebackup/reconstruct.c reads it), in host byte order:

    uint32 magic (0xd3ae1f0d)
    uint32 num_blocks                 (at most RELSEG_SIZE)
    uint32 truncation_block_length    (at most RELSEG_SIZE)
    uint32 block numbers[num_blocks]  (relative to the segment)
    zero padding to a multiple of BLCKSZ, only when num_blocks > 0
    num_blocks blocks of BLCKSZ bytes, in the order of the numbers

The rebuilt segment is `truncation_block_length` blocks of its previous
version (zeros past that version's end), then the file's blocks written at
their numbers: its length is the larger of truncation_block_length and the
highest block number + 1. BLCKSZ 8192 and RELSEG_SIZE 131072 are
PostgreSQL's defaults; a server built otherwise writes files whose length
does not add up here, refused as corrupt.

Each link's backup_label says where it starts (START WAL LOCATION, START
TIMELINE) and, for an incremental, what it was taken from (INCREMENTAL
FROM LSN, INCREMENTAL FROM TLI): `check_link` refuses a chain whose links
do not follow each other, as pg_combinebackup does.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from braid.errors import IntegrityError

__all__ = [
    "BLCKSZ", "FIXED_HEADER", "MAGIC", "RELSEG_SIZE", "BackupLabel", "ChainMismatchError", "IncrementalFileError",
    "IncrementalHeader", "check_link", "header_length", "parse_fixed", "parse_header", "parse_label", "strip_incremental_lines",
]

MAGIC = 0xD3AE1F0D
BLCKSZ = 8192
RELSEG_SIZE = 131072
FIXED_HEADER = 12  # magic, num_blocks, truncation_block_length


class IncrementalFileError(IntegrityError):
    """An INCREMENTAL.* file that is not what PostgreSQL writes (exit 6): nothing was written to the data directory."""


class ChainMismatchError(IntegrityError):
    """The links of a chain do not follow each other as PostgreSQL requires (exit 6): nothing was written to the data directory."""


@dataclass(frozen=True)
class IncrementalHeader:
    """An INCREMENTAL file's header: its block numbers, the truncation length, and the header's length with padding."""

    blocks: tuple[int, ...]
    truncation_block_length: int
    length: int

    @property
    def block_length(self) -> int:
        """The rebuilt segment's length in blocks (reconstruct.c's find_reconstructed_block_length)."""
        return max(self.truncation_block_length, max(self.blocks, default=-1) + 1)


def header_length(num_blocks: int) -> int:
    """The header's bytes for `num_blocks` blocks: 12 + 4 each, rounded up to BLCKSZ when there are blocks."""
    length = FIXED_HEADER + 4 * num_blocks
    return length + (-length % BLCKSZ if num_blocks else 0)


def parse_fixed(data: bytes | bytearray | memoryview, name: str) -> tuple[int, int]:
    """(num_blocks, truncation_block_length) from the first 12 bytes; IncrementalFileError if they are not PostgreSQL's."""
    if len(data) < FIXED_HEADER:
        raise IncrementalFileError(f"{name} is truncated: {len(data)} bytes, shorter than the 12-byte header of an incremental file")
    magic, count, truncation = struct.unpack_from("=III", data, 0)
    if magic != MAGIC:
        raise IncrementalFileError(f"{name} has bad incremental magic number 0x{magic:x} (PostgreSQL writes 0x{MAGIC:x})")
    if count > RELSEG_SIZE:
        raise IncrementalFileError(f"{name} has block count {count}, more than a segment's {RELSEG_SIZE} blocks")
    if truncation > RELSEG_SIZE:
        raise IncrementalFileError(f"{name} has truncation block length {truncation}, more than a segment's {RELSEG_SIZE} blocks")
    return count, truncation


def parse_header(data: bytes | bytearray | memoryview, name: str, size: int) -> IncrementalHeader:
    """The header of an INCREMENTAL file of `size` bytes whose first bytes are `data` (at least the whole header).

    IncrementalFileError (exit 6) for a bad magic number, a count or length past a segment, a block number past a
    segment, or a size that is not exactly the header plus its blocks (a truncated or padded file)."""
    count, truncation = parse_fixed(data, name)
    length = header_length(count)
    if size != length + count * BLCKSZ:
        raise IncrementalFileError(
            f"{name} is {size} bytes, but its header ({count} blocks) makes it {length + count * BLCKSZ}: truncated or corrupt"
        )
    if len(data) < FIXED_HEADER + 4 * count:
        raise IncrementalFileError(f"{name} is truncated inside its header ({len(data)} of {FIXED_HEADER + 4 * count} bytes)")
    blocks = struct.unpack_from(f"={count}I", data, FIXED_HEADER)
    beyond = next((b for b in blocks if b >= RELSEG_SIZE), None)
    if beyond is not None:
        raise IncrementalFileError(f"{name} names block {beyond}, past a segment's {RELSEG_SIZE} blocks")
    return IncrementalHeader(tuple(blocks), truncation, length)


@dataclass(frozen=True)
class BackupLabel:
    """What a backup_label says about where its backup sits: start LSN and timeline, and its parent's for an incremental."""

    text: bytes
    start_lsn: int
    start_tli: int
    from_lsn: int | None
    from_tli: int | None

    @property
    def incremental(self) -> bool:
        return self.from_lsn is not None


_LSN = r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})"


def parse_label(text: bytes, where: str) -> BackupLabel:
    """Parse a backup_label as pg_combinebackup's backup_label.c does; ChainMismatchError (exit 6) if it cannot."""
    body = text.decode("utf-8", "replace")
    fields: dict[str, re.Match[str]] = {}
    for key, pattern in (
        ("START WAL LOCATION", rf"^START WAL LOCATION: {_LSN} "),
        ("START TIMELINE", r"^START TIMELINE: (\d+)\n"),
        ("INCREMENTAL FROM LSN", rf"^INCREMENTAL FROM LSN: {_LSN}\n"),
        ("INCREMENTAL FROM TLI", r"^INCREMENTAL FROM TLI: (\d+)\n"),
    ):
        found = re.search(pattern, body, re.MULTILINE)
        if found:
            fields[key] = found
    for key in ("START WAL LOCATION", "START TIMELINE"):
        if key not in fields:
            raise ChainMismatchError(f"the backup_label of {where} has no {key} line PostgreSQL can read")
    if ("INCREMENTAL FROM LSN" in fields) != ("INCREMENTAL FROM TLI" in fields):
        raise ChainMismatchError(f"the backup_label of {where} has one of INCREMENTAL FROM LSN and INCREMENTAL FROM TLI without the other")

    def lsn(match: re.Match[str]) -> int:
        return int(match.group(1), 16) << 32 | int(match.group(2), 16)

    start_tli = int(fields["START TIMELINE"].group(1))
    from_tli = int(fields["INCREMENTAL FROM TLI"].group(1)) if "INCREMENTAL FROM TLI" in fields else None
    if start_tli == 0 or from_tli == 0:
        raise ChainMismatchError(f"the backup_label of {where} names timeline 0")
    return BackupLabel(
        bytes(text), lsn(fields["START WAL LOCATION"]), start_tli,
        lsn(fields["INCREMENTAL FROM LSN"]) if "INCREMENTAL FROM LSN" in fields else None, from_tli,
    )


def _lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def check_link(position: int, label: BackupLabel, parent: BackupLabel | None, where: str) -> None:
    """Link `position` (0: the full) follows `parent` (the previous link's label): ChainMismatchError (exit 6) if not."""
    if position == 0 and label.incremental:
        raise ChainMismatchError(f"{where} is an incremental backup (its backup_label says INCREMENTAL FROM), but a chain starts with a full")
    if position > 0 and not label.incremental:
        raise ChainMismatchError(f"{where} is a full backup (its backup_label has no INCREMENTAL FROM LSN), but only the first link should be")
    if parent is None or label.from_lsn is None:
        return
    if label.from_tli != parent.start_tli:
        raise ChainMismatchError(f"{where} was taken from timeline {label.from_tli}, but its parent starts on timeline {parent.start_tli}")
    if label.from_lsn != parent.start_lsn:
        raise ChainMismatchError(
            f"{where} was taken from LSN {_lsn_text(label.from_lsn)}, but its parent starts at {_lsn_text(parent.start_lsn)}: not built on that backup"
        )


def strip_incremental_lines(text: bytes) -> bytes:
    """The newest link's backup_label as pg_combinebackup writes it: without the INCREMENTAL FROM LSN/TLI lines."""
    lines = text.splitlines(keepends=True)
    return b"".join(line for line in lines if not line.startswith((b"INCREMENTAL FROM LSN: ", b"INCREMENTAL FROM TLI: ")))
