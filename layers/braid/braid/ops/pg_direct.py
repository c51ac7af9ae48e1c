"""Policy `direct-restore`: `restore --pgdata` writes a data directory's large files with O_DIRECT, past the page cache.

Contract: a `DirectWriter` receives one file's bytes in order (`put(fd, data,
offset)`, offset = the bytes given before), from one thread at a time. It
writes whole BLOCK-aligned blocks from a page-aligned buffer of its thread
and keeps the last partial block until the next range or `end`, which
writes it zero-padded and truncates the file to its size. Durability is
the caller's: the restore's final syncfs(2) makes the data and the sizes
stable, as for the files written through the page cache.

A file system that refuses O_DIRECT (EINVAL at open or at a write) gets the
rest of that file through the page cache: nothing is lost or written
twice. The policy applies to files of at least DIRECT_MIN bytes on local
block file systems (DIRECT_FILE_SYSTEMS; a network file system would wait a
round trip per write), and is off with ENV_DIRECT_RESTORE=off. Why, with
figures: docs/design/2026-11-29-direct-restore.md.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading

from braid.contract import ENV_DIRECT_RESTORE

__all__ = ["BLOCK", "DIRECT_MIN", "DirectWriter", "applies", "enabled", "open_direct"]

BLOCK = 4096
"""Offsets, lengths and buffer addresses are multiples of this: every Linux block device's logical block divides it."""
DIRECT_MIN = 1 << 20
"""Smaller files go through the page cache: their bytes are a small share of a data directory, their count large."""
PIECE = 1 << 20
"""One write's size, and each writer thread's aligned buffer (pgBackRest's restore writes 1 MiB too)."""
DIRECT_FILE_SYSTEMS = frozenset({"ext4", "xfs", "btrfs"})

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_buffers = threading.local()


def enabled() -> bool:
    """Whether the policy is on in this process (ENV_DIRECT_RESTORE unset or anything but "off")."""
    return bool(_O_DIRECT) and os.environ.get(ENV_DIRECT_RESTORE, "").strip().lower() != "off"


def applies(directory: str) -> bool:
    """Whether files under `directory` get O_DIRECT: the policy on, and the directory on a DIRECT_FILE_SYSTEMS mount."""
    return enabled() and file_system(directory) in DIRECT_FILE_SYSTEMS


def file_system(directory: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the file system holding `directory` (proc(5)'s mountinfo: the longest mount point above it)."""
    path = os.path.realpath(directory)
    best, kind = -1, None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields, _, rest = line.partition(" - ")
                parts = fields.split()
                if len(parts) < 5 or not rest:
                    continue
                point = parts[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) > best:
                    best, kind = len(point), rest.split()[0]
    except OSError:
        return None
    return kind


def open_direct(path: str, flags: int, mode: int) -> tuple[int, bool]:
    """Open `path` with O_DIRECT added to `flags`; (fd, True), or (fd, False) where the file system refuses it."""
    try:
        return os.open(path, flags | _O_DIRECT, mode), True
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    return os.open(path, flags, mode), False


Piece = tuple[int, tuple[memoryview | bytes, ...]]
"""A file position (a multiple of BLOCK) and the parts of the bytes that go there, BLOCK-whole, at most PIECE."""


class DirectWriter:
    """One file's O_DIRECT writes: its partial last block between ranges (see the module docstring)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.carry = b""
        self.direct = True

    def plan(self, data: memoryview, offset: int) -> list[Piece]:
        """Cut the range `data` at `offset` (the bytes given so far) into whole-block pieces; the rest waits.

        Called in file order, from one thread; the pieces it returns may then be written by any threads, in any
        order, before `end`."""
        pieces: list[Piece] = []
        parts: list[memoryview | bytes] = [self.carry] if self.carry else []
        filled, position, view = len(self.carry), offset - len(self.carry), data
        while view:
            take = min(len(view), PIECE - filled)
            parts.append(view[:take])
            filled += take
            view = view[take:]
            if filled == PIECE:
                pieces.append((position, tuple(parts)))
                position += PIECE
                parts, filled = [], 0
        whole, kept, self.carry = filled - filled % BLOCK, [], b""
        for index, part in enumerate(parts):
            if whole >= len(part):
                kept.append(part)
                whole -= len(part)
                continue
            if whole:
                kept.append(part[:whole])
            self.carry = bytes(part[whole:]) + b"".join(parts[index + 1 :])  # less than BLOCK bytes
            break
        if kept:
            pieces.append((position, tuple(kept)))
        return pieces

    def write(self, fd: int, position: int, parts: tuple[memoryview | bytes, ...]) -> None:
        """Write one planned piece, through this thread's page-aligned buffer."""
        buffer = _buffer()
        filled = 0
        for part in parts:
            buffer[filled : filled + len(part)] = part
            filled += len(part)
        self._write(fd, buffer[:filled], position)

    def end(self, fd: int) -> None:
        """Once every piece is written: the partial last block (zero-padded when direct), and the file cut to its size."""
        if not self.carry:
            return
        tail, self.carry = self.carry, b""
        position = self.size - len(tail)
        if not self.direct:
            _write_all(fd, memoryview(tail), position)
            return
        buffer = _buffer()
        buffer[: len(tail)] = tail
        buffer[len(tail) : BLOCK] = bytes(BLOCK - len(tail))
        self._write(fd, buffer[:BLOCK], position)
        os.ftruncate(fd, self.size)

    def _write(self, fd: int, data: memoryview, position: int) -> None:
        if self.direct:
            try:
                written = os.pwrite(fd, data, position)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.buffered(fd)
                written = 0
            if written % BLOCK == 0:
                _write_all(fd, data[written:], position + written)
                return
            self.buffered(fd)  # a short write off a block boundary: the rest through the page cache
            data, position = data[written:], position + written
        _write_all(fd, data, position)

    def buffered(self, fd: int) -> None:
        """The rest of this file through the page cache (writers racing here all clear the same flag)."""
        self.direct = False
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)


def _write_all(fd: int, data: memoryview, position: int) -> None:
    while data:
        written = os.pwrite(fd, data, position)
        data, position = data[written:], position + written


def _buffer() -> memoryview:
    """This thread's page-aligned PIECE-byte buffer (an anonymous mapping is page-aligned)."""
    buffer: memoryview | None = getattr(_buffers, "view", None)
    if buffer is None:
        buffer = _buffers.view = memoryview(mmap.mmap(-1, PIECE))
    return buffer
