"""Capture a few small members of a backup's tar stream as it passes, in the engine's one read.

The driver loop (braid.engine.driver) shows each input's pieces, in order,
to one `StreamCapture` before handing them to the sink. If the input starts
with a tar header (pg_basebackup -Ft -D -), a push parser
(braid.format.tar_stream) follows its members and buffers only those named
in `CAPTURED` (`backup_label`, `backup_manifest`, `PG_VERSION`, the first
bytes of `global/pg_control`), each up to `MAX_CAPTURED` bytes: memory stays
bounded whatever the stream. Anything else, a stream that is not a tar, or
a tar the parser cannot follow, only ends the capture: a backup never fails
because of what it carries.

The stdlib's tarfile reads from a file object at its own pace; here the
bytes arrive as chunk buffers the sink owns once handed over, so the parser
is pushed each piece and keeps no reference to it (braid.format.tar_stream).

An input that starts as a MariaDB xbstream is followed by
braid.engine.xbstream instead, which keeps its `xtrabackup_checkpoints`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from braid.format.metadata import BACKUP_MANIFEST, CHECKPOINTS, MEMBER_LIMITS

if TYPE_CHECKING:
    from braid.engine.xbstream import XbstreamCapture
    from braid.format.pg_backup import WalInfo
    from braid.format.tar_stream import MemberConsumer, TarMember, TarStream

__all__ = ["CAPTURED", "MAX_CAPTURED", "Captured", "StreamCapture", "merge_captures"]

# member name -> bytes kept from a tar stream (braid.format.metadata.MEMBER_LIMITS; the xbstream's own is its parser's)
CAPTURED: dict[str, int] = {name: limit for name, limit in MEMBER_LIMITS.items() if name != CHECKPOINTS}
MAX_CAPTURED = sum(CAPTURED.values())
_SEGMENT = re.compile(r"^pg_wal/[0-9A-F]{24}$")


@dataclass
class Captured:
    """What one backup's inputs revealed: the captured members (by name) and a note per input whose capture stopped."""

    members: dict[str, bytes] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    wal_segments: int = 0  # WAL segments the base backup carries in pg_wal/ (-X fetch); 0 with -X none

    @property
    def wal(self) -> WalInfo | None:
        """A PostgreSQL base backup's WAL range (braid.format.pg_backup); None without a backup_label, as that reader says."""
        if "backup_label" not in self.members:
            return None  # not a base backup: its label parser is not loaded
        from braid.format.pg_backup import wal_info_from_members

        return wal_info_from_members(self.members)

    @property
    def backup_manifest(self) -> bytes | None:
        """PostgreSQL's backup_manifest, only when the stream also had a backup_label (a base backup, not any tar)."""
        return self.members.get("backup_manifest") if "backup_label" in self.members else None

    @property
    def metadata(self) -> dict[str, bytes]:
        """What is kept encrypted beside the chunks (braid.format.metadata): a PostgreSQL base backup's
        backup_manifest, an xbstream's checkpoints (an incremental's {parent_lsn}). Both engines keep exactly this."""
        manifest = self.backup_manifest
        kept = {BACKUP_MANIFEST: manifest} if manifest is not None else {}
        if CHECKPOINTS in self.members:
            kept[CHECKPOINTS] = self.members[CHECKPOINTS]
        return kept


class _Keep:
    def __init__(self, limit: int, size: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.complete = size <= limit

    def write(self, data: memoryview) -> None:
        room = self.limit - len(self.data)
        if room > 0:
            self.data += data[:room]

    def close(self) -> None:
        pass


class StreamCapture:
    """Follows one input; `feed` its pieces in order, `end()` once it ended, then read `members`."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.members: dict[str, bytes] = {}
        self.note: str | None = None
        self.wal_segments = 0
        self._start = bytearray()
        self._parser: TarStream | None = None
        self._open: dict[str, _Keep] = {}
        self._done = False
        self._xbstream: XbstreamCapture | None = None  # a MariaDB xbstream instead (braid.engine.xbstream)

    def feed(self, data: memoryview) -> None:
        if self._done:
            return
        if self._xbstream is not None:
            self._xbstream.feed(data)
            return
        # The parsers load with an input's first block: an empty input (and a cloud backup's start-up) needs neither.
        from braid.format.tar_stream import BLOCK, TarFormatError, TarStream, looks_like_tar

        try:
            if self._parser is None:
                used = BLOCK - len(self._start)
                self._start += data[:used]
                if len(self._start) < BLOCK:
                    return
                if not looks_like_tar(bytes(self._start)):
                    from braid.engine.xbstream import MAGIC as XBSTREAM_MAGIC
                    from braid.engine.xbstream import XbstreamCapture

                    if self._start.startswith(XBSTREAM_MAGIC):
                        self._xbstream = XbstreamCapture()
                        self._xbstream.feed(memoryview(bytes(self._start)))
                        self._xbstream.feed(data[used:])
                        return
                    self._done = True
                    return
                self._parser = TarStream(self._member)
                self._parser.feed(bytes(self._start))  # the first block, which may have come in several pieces
                data = data[used:]
            self._parser.feed(data)
            if self._parser.ended:
                self._finish()
        except TarFormatError as exc:
            self._stop(f"input {self.label}: stopped reading its tar ({exc}); no WAL information recorded from it")

    def end(self) -> None:
        if self._xbstream is not None and not self._done:
            if self._xbstream.checkpoints is not None:
                self.members[CHECKPOINTS] = self._xbstream.checkpoints
            elif self._xbstream.note is not None:
                self.note = f"input {self.label}: stopped reading its xbstream ({self._xbstream.note})"
        if self._parser is not None and not self._done:
            from braid.format.tar_stream import TarFormatError

            try:
                self._parser.end()
            except TarFormatError as exc:
                self._stop(f"input {self.label}: {exc}")
                return
            self._finish()
        self._done = True

    def _member(self, member: TarMember) -> MemberConsumer | None:
        name = member.name[2:] if member.name.startswith("./") else member.name
        if _SEGMENT.match(name):
            self.wal_segments += 1
        limit = CAPTURED.get(name)
        if limit is None or member.kind != "0":
            return None
        keep = _Keep(limit, member.size)
        self._open[name] = keep
        return keep

    def _finish(self) -> None:
        self._done = True
        for name, keep in self._open.items():
            if keep.complete or name == "global/pg_control":
                self.members[name] = bytes(keep.data)
            else:
                self.note = f"input {self.label}: {name} is larger than {CAPTURED[name]} bytes; it was not captured"
        self._open.clear()

    def _stop(self, note: str) -> None:
        self._done = True
        self._open.clear()
        self.members.clear()
        self.note = note


def merge_captures(captures: Mapping[int, StreamCapture]) -> Captured:
    """One result for the backup: the members of the input that had a backup_label (the first such), else of none."""
    result = Captured(notes=[c.note for c in captures.values() if c.note])
    for index in sorted(captures):
        if "backup_label" in captures[index].members:
            result.members = dict(captures[index].members)
            result.wal_segments = captures[index].wal_segments
            break
    for index in sorted(captures):  # MariaDB's, for an incremental's {parent_lsn} (braid.engine.xbstream)
        if CHECKPOINTS in captures[index].members:
            result.members.setdefault(CHECKPOINTS, captures[index].members[CHECKPOINTS])
            break
    return result
