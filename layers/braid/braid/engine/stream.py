"""Cutting backup streams into fixed-size chunks, with bounded memory.

Each input (stdin, a file, a named pipe) is read by its own thread, so a
database writing to several pipes at once never blocks on one of them. All
readers draw from one `BufferPool`; when every buffer is in flight they wait,
which is what bounds memory to (pool size x chunk size) whatever the stream
length. Chunk indexes are assigned in arrival order by the single consumer,
the driver loop (braid.engine.driver).
"""

from __future__ import annotations

import os
import queue
import stat
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from io import FileIO, RawIOBase

from braid.errors import BackupError, InputError


class BufferPool:
    """A fixed set of reusable chunk buffers; `acquire` blocks when all are out."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self.count = count
        self._free: queue.Queue[bytearray] = queue.Queue()
        self._created = 0
        self._lock = threading.Lock()
        self.in_use = 0
        self.max_in_use = 0

    def acquire(self, cancelled: threading.Event) -> bytearray | None:
        """A free buffer, or None once `cancelled` is set."""
        while not cancelled.is_set():
            with self._lock:
                if self._free.empty() and self._created < self.count:
                    self._created += 1
                    self._free.put(bytearray(self.size))
            try:
                buf = self._free.get(timeout=0.1)
            except queue.Empty:
                continue
            with self._lock:
                self.in_use += 1
                self.max_in_use = max(self.max_in_use, self.in_use)
            return buf
        return None

    def release(self, buf: bytearray) -> None:
        with self._lock:
            self.in_use -= 1
        self._free.put(buf)


@dataclass(frozen=True)
class InputSource:
    """One backup input as the user named it."""

    index: int
    label: str  # "stdin" or the path
    path: str | None  # None for stdin

    def check(self) -> None:
        """Fail early, before any key is made or byte stored, on a path that cannot work."""
        if self.path is None:
            if sys.stdin is None or sys.stdin.isatty():
                raise InputError("stdin is a terminal, not a backup stream: pipe the stream in (pg_basebackup ... | braid backup) or give --input PATH")
            return
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError:
            raise InputError(f"input {self.path} does not exist (create the named pipe with mkfifo, or check the path)") from None
        except PermissionError:
            raise InputError(f"input {self.path} is not accessible by this user") from None
        if stat.S_ISDIR(mode):
            raise InputError(f"input {self.path} is a directory; give a file or a named pipe")
        if not os.access(self.path, os.R_OK):
            raise InputError(f"input {self.path} is not readable by this user")

    def open(self) -> FileIO:
        """Unbuffered: reads go straight into pool buffers, with no copy through a Python buffer."""
        if self.path is None:
            return os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0)
        try:
            return open(self.path, "rb", buffering=0)
        except OSError as exc:
            raise InputError(f"cannot open input {self.path}: {exc.strerror}") from None


def sources_from_args(paths: list[str] | None) -> list[InputSource]:
    if not paths:
        return [InputSource(0, "stdin", None)]
    if len(set(paths)) != len(paths):
        raise InputError("the same input is named twice")
    return [InputSource(i, p, p) for i, p in enumerate(paths)]


@dataclass
class Piece:
    """A chunk's worth of one input, in a pool buffer the consumer must release."""

    input_index: int
    number: int  # chunk number within its input
    offset: int
    buffer: bytearray
    length: int

    @property
    def data(self) -> memoryview:
        return memoryview(self.buffer)[: self.length]


@dataclass(frozen=True)
class InputEnd:
    input_index: int
    length: int


@dataclass(frozen=True)
class ReadFailure:
    error: BackupError


def _drop_cache(handle: RawIOBase, offset: int, length: int) -> None:
    """Backup input files are read once; don't let them evict the database's cache (no-op on pipes)."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(handle.fileno(), offset, length, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass  # pipes and sockets: nothing cached


def _read_full(handle: RawIOBase, view: memoryview) -> int:
    """Fill `view` unless EOF comes first; pipes return short reads."""
    filled = 0
    while filled < len(view):
        n = handle.readinto(view[filled:])
        if not n:
            break
        filled += n
    return filled


class StreamCutter:
    """Reads all inputs concurrently and yields pieces and ends as they come."""

    def __init__(self, sources: list[InputSource], pool: BufferPool, cancelled: threading.Event) -> None:
        self.sources = sources
        self.pool = pool
        self.cancelled = cancelled
        self._events: queue.Queue[Piece | InputEnd | ReadFailure] = queue.Queue()
        self._threads = [threading.Thread(target=self._read, args=(s,), name=f"braid-read-{s.index}", daemon=True) for s in sources]

    def _read(self, source: InputSource) -> None:
        try:
            with source.open() as handle:
                offset = 0
                number = 0
                while True:
                    buf = self.pool.acquire(self.cancelled)
                    if buf is None:
                        return
                    try:
                        n = _read_full(handle, memoryview(buf))
                    except OSError as exc:
                        self.pool.release(buf)
                        raise InputError(f"error reading input {source.label}: {exc.strerror or exc}") from None
                    if n == 0:
                        self.pool.release(buf)
                        break
                    _drop_cache(handle, offset, n)
                    self._events.put(Piece(source.index, number, offset, buf, n))
                    offset += n
                    number += 1
                    if n < len(buf):
                        break
            self._events.put(InputEnd(source.index, offset))
        except BackupError as exc:
            self._events.put(ReadFailure(exc))

    def __iter__(self) -> Iterator[Piece | InputEnd]:
        for thread in self._threads:
            thread.start()
        remaining = len(self._threads)
        while remaining:
            try:
                event = self._events.get(timeout=0.2)
            except queue.Empty:
                if self.cancelled.is_set():
                    return
                continue
            if isinstance(event, ReadFailure):
                raise event.error
            if isinstance(event, InputEnd):
                remaining -= 1
            yield event

    def join(self, timeout: float = 2.0) -> None:
        for thread in self._threads:
            thread.join(timeout)

