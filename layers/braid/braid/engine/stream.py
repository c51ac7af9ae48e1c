"""Cutting backup streams into fixed-size chunks, with bounded memory.

Each input (stdin, a file, a named pipe) is read by its own thread, so a
database writing to several pipes at once never blocks on one of them. All
readers draw from one `BufferPool`; when every buffer is in flight they wait,
which is what bounds memory to (pool size x chunk size) whatever the stream
length. Chunk indexes are assigned in arrival order by the single consumer,
the driver loop (braid.engine.driver).

The pool must hold at least one buffer per input (`pool_size`): Db2 writes
`backup db X to /p1, ..., /pN` moving blocks to each pipe in turn, so a
reader that holds a half-filled buffer waits for bytes the writer can only
send once it got past a pipe whose reader has no buffer. A reader holds at
most one buffer while it fills it, and handed-off buffers come back without
any reader's help (workers store them), so with (inputs + k) buffers every
open input always has somewhere to put its bytes.

A named pipe that no process opens within the open timeout fails the backup
(braid.engine.fifo_open) rather than hanging it.
"""

from __future__ import annotations

import os
import queue
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from io import RawIOBase

from braid.engine.fifo_open import DEFAULT_OPEN_TIMEOUT, is_fifo, open_fifo_for_reading
from braid.engine.pipe_buffer import widen
from braid.errors import BackupError, InputError
from braid.format.buffers import WritableBuffer, new_buffer, read_full
from braid.format.checksum import preload as preload_checksums

_FIRST_READ = 64 * 1024  # an input's first read: the checksum library loads once it returns bytes (StreamReader._read)


def _first_bytes(handle: RawIOBase, source: InputSource, size: int) -> bytearray:
    """An input's first read, up to `size` bytes (empty at its end): what decides whether it is empty."""
    first = bytearray(size)
    try:
        n = handle.readinto(first) or 0
    except OSError as exc:
        raise InputError(f"error reading input {source.label}: {exc.strerror or exc}") from None
    del first[n:]
    return first


def pool_size(inputs: int, in_flight: int) -> int:
    """Buffers for `inputs` streams: one each to read into, and `in_flight` more for chunks being stored.

    Memory is this many chunks. Fewer than one per input can deadlock a
    writer that feeds its pipes in turn (see the module docstring).
    """
    return inputs + in_flight


class BufferPool:
    """A fixed set of reusable chunk buffers; `acquire` blocks when all are out."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self.count = count
        self._free: queue.Queue[WritableBuffer] = queue.Queue()
        self._created = 0
        self._lock = threading.Lock()
        self.in_use = 0
        self.max_in_use = 0

    def acquire(self, cancelled: threading.Event) -> WritableBuffer | None:
        """A free buffer, or None once `cancelled` is set.

        Buffers are made only when every one made so far is out (or being
        made ahead), as mapped buffers whose pages are made without holding
        the GIL the workers need (braid.format.buffers).
        """
        while not cancelled.is_set():
            with self._lock:
                make = self._free.empty() and self._created < self.count
                if make:
                    self._created += 1
            if make:  # outside the lock: a worker giving a buffer back must not wait for the pages
                try:
                    buf = new_buffer(self.size)
                except BaseException:
                    with self._lock:
                        self._created -= 1
                    raise
            else:
                try:
                    buf = self._free.get(timeout=0.1)
                except queue.Empty:
                    continue
            with self._lock:
                self.in_use += 1
                self.max_in_use = max(self.max_in_use, self.in_use)
            return buf
        return None

    def release(self, buf: WritableBuffer) -> None:
        with self._lock:
            self.in_use -= 1
        self._free.put(buf)

    def make_ahead(self, count: int) -> None:
        """Make up to `count` more buffers on a helper thread, while the readers fill their first ones.

        For streams known to need them (regular files of several chunks):
        otherwise a reader makes each buffer when it needs it, and the second
        chunk's read waited for its pages, delaying the second worker's
        start by as much (measured, scripts/bench local).
        `acquire` waits for these rather than making more, so the pool still
        never holds more than its `count` buffers.
        """
        with self._lock:
            count = max(0, min(count, self.count - self._created))
            self._created += count
        if count:
            threading.Thread(target=self._make, args=(count,), name="braid-buffers", daemon=True).start()

    def _make(self, count: int) -> None:
        for _ in range(count):
            try:
                buf = new_buffer(self.size)
            except Exception:  # out of memory: a reader makes its own when it needs it, and reports that
                with self._lock:
                    self._created -= 1
                continue
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

    def open(
        self, *, timeout: float = DEFAULT_OPEN_TIMEOUT, note: Callable[[], None] | None = None, cancelled: threading.Event | None = None
    ) -> RawIOBase | None:
        """Unbuffered: reads go straight into pool buffers, with no copy through a Python buffer.

        A named pipe waits at most `timeout` seconds for its writer (calling
        `note` once if it takes a while); None if `cancelled` came first.
        """
        if self.path is None:
            fd = os.dup(sys.stdin.fileno())
            widen(fd)
            return os.fdopen(fd, "rb", buffering=0)
        if is_fifo(self.path):
            got = open_fifo_for_reading(self.path, timeout=timeout, note=note, cancelled=cancelled)
            if got is None:
                return None
            widen(got)
            return os.fdopen(got, "rb", buffering=0)
        try:
            return open(self.path, "rb", buffering=0)
        except OSError as exc:
            raise InputError(f"cannot open input {self.path}: {exc.strerror}") from None


def _remaining_lengths(sources: list[InputSource]) -> list[int] | None:
    """What is left to read of each input if all are regular files (fstat); None if any is not."""
    lengths = []
    for source in sources:
        try:
            if source.path is None:
                fd = sys.stdin.fileno()
                info = os.fstat(fd)
                remaining = info.st_size - os.lseek(fd, 0, os.SEEK_CUR)
            else:
                info = os.stat(source.path)
                remaining = info.st_size
        except (OSError, ValueError, AttributeError):
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        lengths.append(remaining)
    return lengths


def input_lengths(sources: list[InputSource]) -> list[int] | None:
    """Each input's length if every input is a regular file; None if any is not (a pipe, a terminal)."""
    return _remaining_lengths(sources)


def expected_chunks(sources: list[InputSource], chunk_size: int) -> int | None:
    """How many chunks the inputs will make if they are regular files as long as they are now; None if any is not."""
    lengths = _remaining_lengths(sources)
    return None if lengths is None else sum(max(1, -(-length // chunk_size)) for length in lengths)


def expected_bytes(sources: list[InputSource]) -> int | None:
    """The stream's length if every input is a regular file (a progress bar's total); None if any is not."""
    lengths = _remaining_lengths(sources)
    return None if lengths is None else sum(lengths)


def _identity(path: str) -> tuple[object, ...]:
    """The file itself, however it is spelled: `d1`, `./d1` and a symlink to it are one input."""
    try:
        info = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    return ("file", info.st_dev, info.st_ino)


def sources_from_args(paths: list[str] | None) -> list[InputSource]:
    """One source per --input, labelled as the user typed it; the same file twice is refused.

    Two readers on one pipe would each get an arbitrary share of its bytes
    (a backup that restores to neither stream), and a file read twice is
    stored twice: so inputs are compared by identity, not spelling.
    """
    if not paths:
        return [InputSource(0, "stdin", None)]
    seen: dict[tuple[object, ...], str] = {}
    for path in paths:
        identity = _identity(path)
        first = seen.get(identity)
        if first is not None:
            also = f"{first} and {path}" if first != path else path
            raise InputError(f"the same input is named twice: {also}")
        seen[identity] = path
    return [InputSource(i, p, p) for i, p in enumerate(paths)]


@dataclass
class Piece:
    """A chunk's worth of one input, in a pool buffer the consumer must release."""

    input_index: int
    number: int  # chunk number within its input
    offset: int
    buffer: WritableBuffer
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


class StreamCutter:
    """Reads all inputs concurrently and yields pieces and ends as they come.

    `waiting(source)` is called (from the source's reader thread) when a
    named pipe has had no writer for a few seconds; `open_timeout` is when
    that becomes an InputError.
    """

    def __init__(
        self,
        sources: list[InputSource],
        pool: BufferPool,
        cancelled: threading.Event,
        *,
        open_timeout: float = DEFAULT_OPEN_TIMEOUT,
        waiting: Callable[[InputSource], None] | None = None,
    ) -> None:
        if pool.count < len(sources):
            raise ValueError(f"a pool of {pool.count} buffers for {len(sources)} inputs can deadlock a writer that feeds them in turn")
        self.sources = sources
        self.pool = pool
        self.cancelled = cancelled
        self.open_timeout = open_timeout
        self._waiting = waiting
        self._events: queue.Queue[Piece | InputEnd | ReadFailure] = queue.Queue()
        self._threads = [threading.Thread(target=self._read, args=(s,), name=f"braid-read-{s.index}", daemon=True) for s in sources]

    def _read(self, source: InputSource) -> None:
        try:
            waiting = self._waiting
            note = None if waiting is None else (lambda: waiting(source))
            opened = source.open(timeout=self.open_timeout, note=note, cancelled=self.cancelled)
            if opened is None:
                return  # cancelled while waiting for a writer
            with opened as handle:
                offset = 0
                number = 0
                # The first bytes are read before a chunk buffer is taken: an
                # empty input maps no chunk buffer (~64 MiB of pages) and loads
                # no checksum library. Every chunk read here is checksummed
                # when it is stored, so once bytes arrive awscrt loads (~80 ms,
                # holding the GIL) while this thread reads the rest of the
                # chunk, not later on a worker's critical path (braid.format.checksum).
                first = _first_bytes(handle, source, min(_FIRST_READ, self.pool.size))
                if first:
                    preload_checksums()
                while first:  # an empty input has no chunk
                    buf = self.pool.acquire(self.cancelled)
                    if buf is None:
                        return
                    view = memoryview(buf)
                    n = len(first) if number == 0 else 0
                    view[:n] = first[:n]
                    try:
                        n += read_full(handle, view[n:])
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

