"""Follow a MariaDB xbstream as it passes and keep its `xtrabackup_checkpoints` (for `{parent_lsn}`).

`mariadb-backup --backup --stream=xbstream` writes a sequence of chunks, all
little-endian: magic `XBSTCK01` (8 bytes), flags (1), type (1: `P` payload,
`S` sparse payload, `E` end of a file), path length (4) and path; an `E`
chunk ends there; a `S` chunk then has its sparse map's entry count (4);
`P` and `S` then have payload length (8), payload offset (8) and a CRC32
(4); a `S` chunk's map (8 bytes per entry) comes next, then the payload.
The file `xtrabackup_checkpoints` (text: `backup_type = ...`, `from_lsn =
N`, `to_lsn = N`, ...) is kept, up to `MAX_CHECKPOINTS` bytes; the parser is
pushed each piece of the stream and keeps no reference to it. Anything it
cannot follow ends the capture only: a backup never fails for what it carries.
"""

from __future__ import annotations

import re

from braid.format.metadata import CHECKPOINTS, MEMBER_LIMITS

__all__ = ["CHECKPOINTS", "MAGIC", "XbstreamCapture", "to_lsn"]

MAGIC = b"XBSTCK01"
MAX_CHECKPOINTS = MEMBER_LIMITS[CHECKPOINTS]
_FIXED = 14  # magic, flags, type, path length
_MAX_PATH = 1 << 12
_TO_LSN = re.compile(rb"^to_lsn\s*=\s*(\d+)\s*$", re.MULTILINE)


def to_lsn(checkpoints: bytes) -> str | None:
    """The `to_lsn` of an xtrabackup_checkpoints file, as its decimal text; None if it has none."""
    match = _TO_LSN.search(checkpoints)
    return match.group(1).decode() if match else None


class XbstreamCapture:
    """Push parser: `feed` the stream's pieces in order; `checkpoints` holds the file once seen whole, `note` why it stopped."""

    def __init__(self) -> None:
        self.checkpoints: bytes | None = None
        self.note: str | None = None
        self._head = bytearray()  # the current chunk's header, until whole
        self._skip = 0  # payload bytes of the current chunk still to pass
        self._keep: bytearray | None = None  # the payload being kept (xtrabackup_checkpoints)

    def feed(self, data: memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view) and self.note is None:
            if self._skip:
                take = min(self._skip, len(view))
                if self._keep is not None and len(self._keep) + take <= MAX_CHECKPOINTS:
                    self._keep += view[:take]
                self._skip -= take
                view = view[take:]
                if not self._skip and self._keep is not None:
                    self.checkpoints, self._keep = bytes(self._keep), None
                continue
            need = self._header_length()
            if need is None:
                return
            take = min(need - len(self._head), len(view))
            self._head += view[:take]
            view = view[take:]
            if len(self._head) == need and self._header_length() == need:  # whole: no field read so far asks for more
                self._chunk()

    def _header_length(self) -> int | None:
        """The current header's whole length, as far as its bytes so far tell (at least what is needed to learn more)."""
        head = self._head
        if len(head) < _FIXED:
            return _FIXED
        if head[:8] != MAGIC:
            self.note = "not an xbstream chunk (bad magic)"
            return None
        kind = chr(head[9])
        path = int.from_bytes(head[10:14], "little")
        if path > _MAX_PATH or kind not in "PSE":
            self.note = f"an xbstream chunk of type {kind!r} with a {path}-byte path"
            return None
        fixed = _FIXED + path
        if kind == "E":
            return fixed
        sparse = 4 if kind == "S" else 0
        base = fixed + sparse + 20
        if kind == "S" and len(head) >= fixed + 4:
            return base + 8 * int.from_bytes(head[fixed : fixed + 4], "little")
        return base

    def _chunk(self) -> None:
        head = bytes(self._head)
        self._head.clear()
        kind = chr(head[9])
        path_end = _FIXED + int.from_bytes(head[10:14], "little")
        if kind == "E":
            return
        lengths = path_end + (4 if kind == "S" else 0)
        self._skip = int.from_bytes(head[lengths : lengths + 8], "little")
        path = head[_FIXED:path_end].decode("utf-8", "replace")
        if path == CHECKPOINTS and self._skip <= MAX_CHECKPOINTS:
            self._keep = bytearray()
            if not self._skip:
                self.checkpoints, self._keep = b"", None
