"""PostgreSQL WAL file names, LSNs and where each archived file lives (docs/format.md, WAL archive).

A WAL segment's name is its timeline and its segment number, as PostgreSQL
spells them: `TTTTTTTTXXXXXXXXYYYYYYYY` (24 upper-case hex digits), where
XXXXXXXX and YYYYYYYY are the segment number divided and taken modulo the
number of segments in 4 GiB of WAL (256 at the default 16 MiB). The archive
also takes `.partial` and `.backup` files (named after a segment) and
`TTTTTTTT.history` files (one per timeline after the first).

Layout, below `wal/NAME/`:

    archive.json                      the archive's identity: system identifier, segment size (create-only)
    history/TTTTTTTT.history          timeline history files
    TTTTTTTTXXXXXXXX/FILE             segments, and .partial and .backup files, by their first 16 digits

So one directory holds at most 256 segments of 16 MiB (4 GiB of WAL), a
range of segments is a LIST of one or a few directories, and a timeline's
files are the directories that start with its 8 digits.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from braid.errors import UsageError

DEFAULT_SEGMENT_SIZE = 16 * 1024 * 1024
MIN_SEGMENT_SIZE = 1024 * 1024
MAX_SEGMENT_SIZE = 1024 * 1024 * 1024
SEGMENT = "segment"
PARTIAL = "partial"
BACKUP = "backup"
HISTORY = "history"

_SEGMENT = re.compile(r"([0-9A-F]{8})([0-9A-F]{8})([0-9A-F]{8})", re.ASCII)
_PARTIAL = re.compile(r"([0-9A-F]{24})\.partial", re.ASCII)
_BACKUP = re.compile(r"([0-9A-F]{24})\.([0-9A-F]{8})\.backup", re.ASCII)
_HISTORY = re.compile(r"([0-9A-F]{8})\.history", re.ASCII)
_LSN = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})", re.ASCII)


def check_segment_size(size: int) -> int:
    """`size` if PostgreSQL allows it as wal_segment_size (a power of two, 1 MiB to 1 GiB), else UsageError."""
    if not MIN_SEGMENT_SIZE <= size <= MAX_SEGMENT_SIZE or size & (size - 1):
        raise UsageError(f"WAL segment size {size} is not a power of two from 1 MiB to 1 GiB")
    return size


def segments_per_xlogid(segment_size: int) -> int:
    """Segments in 4 GiB of WAL: the modulus of a segment name's last 8 digits."""
    return 0x1_0000_0000 // check_segment_size(segment_size)


def parse_lsn(value: str | int) -> int:
    """An LSN as an integer, from PostgreSQL's `X/Y` text (or an integer already)."""
    if isinstance(value, int):
        if value < 0 or value >= 1 << 64:
            raise UsageError(f"LSN {value} is out of range")
        return value
    match = _LSN.fullmatch(value.strip())
    if not match:
        raise UsageError(f"invalid LSN {value!r}: expected PostgreSQL's form such as 0/3000028")
    return (int(match[1], 16) << 32) | int(match[2], 16)


def format_lsn(lsn: int) -> str:
    """PostgreSQL's text form of an LSN: `X/Y`, upper-case hex without leading zeros."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def segment_name(timeline: int, segno: int, segment_size: int = DEFAULT_SEGMENT_SIZE) -> str:
    """The file name of segment number `segno` on `timeline` (PostgreSQL's XLogFileName)."""
    per = segments_per_xlogid(segment_size)
    if not 1 <= timeline <= 0xFFFFFFFF or segno < 0:
        raise UsageError(f"invalid timeline {timeline} or segment number {segno}")
    return f"{timeline:08X}{segno // per:08X}{segno % per:08X}"


def segment_of(lsn: int, segment_size: int = DEFAULT_SEGMENT_SIZE) -> int:
    """The number of the segment holding the byte at `lsn`."""
    return lsn // check_segment_size(segment_size)


def segment_before(lsn: int, segment_size: int = DEFAULT_SEGMENT_SIZE) -> int:
    """The number of the segment holding the byte just before `lsn` (PostgreSQL's XLByteToPrevSeg).

    A backup's stop position (or any end of WAL) needs the bytes before it:
    a stop exactly on a segment boundary needs nothing of the segment it starts.
    """
    return max(lsn - 1, 0) // check_segment_size(segment_size)


@dataclass(frozen=True)
class WalFile:
    """What a WAL file name says: its kind, timeline and (but for history files) segment."""

    name: str
    kind: str  # SEGMENT, PARTIAL, BACKUP or HISTORY
    timeline: int
    segment: str | None  # the 24-digit segment name it belongs to; None for a history file

    @classmethod
    def parse(cls, name: str) -> WalFile:
        """The file `name` describes, or UsageError for a name that is not a WAL file's."""
        if _SEGMENT.fullmatch(name):
            return cls(name, SEGMENT, _timeline(name[:8], name), name)
        for pattern, kind in ((_PARTIAL, PARTIAL), (_BACKUP, BACKUP)):
            match = pattern.fullmatch(name)
            if match:
                return cls(name, kind, _timeline(name[:8], name), match[1])
        match = _HISTORY.fullmatch(name)
        if match:
            return cls(name, HISTORY, _timeline(match[1], name), None)
        raise UsageError(
            f"{name!r} is not a WAL file name: expected a segment (000000010000000000000003), a .partial, .backup or .history file"
        )

    def segno(self, segment_size: int = DEFAULT_SEGMENT_SIZE) -> int:
        """The segment number of a segment, .partial or .backup file."""
        if self.segment is None:
            raise ValueError(f"{self.name} is a history file: it has no segment number")
        per = segments_per_xlogid(segment_size)
        high, low = int(self.segment[8:16], 16), int(self.segment[16:24], 16)
        if low >= per:
            raise UsageError(f"{self.name} is not a segment name at a segment size of {segment_size} bytes")
        return high * per + low


def _timeline(digits: str, name: str) -> int:
    timeline = int(digits, 16)
    if timeline == 0:
        raise UsageError(f"{name!r} is not a WAL file name: timeline 0 does not exist")
    return timeline


def wal_context_name(name: str, file_name: str) -> str:
    """What binds a stored WAL file to its name: the encryption context's `braid:backup` and the frame header's backup id."""
    return f"{name}@wal/{file_name}"


# XLogLongPageHeaderData, the first page header of every segment (PostgreSQL's access/xlog_internal.h):
# magic u16, info u16, tli u32, pageaddr u64, rem_len u32, (padding 4), sysid u64, seg_size u32, xlog_blcksz u32.
_LONG_HEADER = struct.Struct("<HHIQI4xQII")
_XLP_LONG_HEADER = 0x0002


@dataclass(frozen=True)
class SegmentIdentity:
    """What a segment's first page header says: the cluster it belongs to and where it is."""

    system_identifier: int
    segment_size: int
    timeline: int
    page_address: int


def segment_identity(first_page: bytes | memoryview) -> SegmentIdentity | None:
    """The long page header at the start of a segment, or None when there is none to read (not a WAL segment's start).

    Read in the host's byte order as PostgreSQL writes it (little-endian here).
    """
    if len(first_page) < _LONG_HEADER.size:
        return None
    _magic, info, tli, pageaddr, _rem, sysid, seg_size, _blcksz = _LONG_HEADER.unpack_from(first_page)
    if not info & _XLP_LONG_HEADER or not MIN_SEGMENT_SIZE <= seg_size <= MAX_SEGMENT_SIZE or seg_size & (seg_size - 1):
        return None
    if pageaddr % seg_size:
        return None
    return SegmentIdentity(sysid, seg_size, tli, pageaddr)
