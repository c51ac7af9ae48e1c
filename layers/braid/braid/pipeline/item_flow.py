"""How one map item's chunks flow through a worker: read ahead, encode, PUT packs.

Reads run ahead of the codec, in chunk order, up to `lanes` ranged GETs at
once (each of the first FIRST_RANGED_CHUNKS chunks, which the codec waits
for, as up to CHUNK_RANGES ranged GETs: docs/design/2026-11-cloud-figures.md);
ENCODERS threads write each frame over its plaintext's buffer; a pack's PUT
starts once its last chunk is encoded, and its buffers return to the pool
when S3 answered. Packs are fixed by the item alone (MapItem.packs), so a
retried worker forms the same objects. Memory is bounded: `lanes` chunk
buffers read ahead plus two packs (braid.agent.limits budgets the same),
kept for the container's lifetime. Every task runs in the invocation's
context (braid.ports.usage.in_context); a failure waits for every task
already started, so no thread still writes into a buffer the next
invocation takes.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from braid.engine.chunk_worker import ChunkTask, encode_frame, put_pack
from braid.errors import IntegrityError
from braid.format.buffers import WritableBuffer, new_buffer
from braid.format.chunk import Buffer, ChunkCodec
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.manifest import ChunkEntry
from braid.format.staging import ChunkSlice
from braid.pipeline.worker_buffers import ENCODERS, buffers_per_item
from braid.pipeline.worker_buffers import chunk_buffers as chunk_buffers  # where tests and the docs look for it
from braid.ports.store import ObjectStore
from braid.ports.usage import in_context

R = TypeVar("R")

CHUNK_RANGES = 4  # ranged GETs at once for a chunk the codec waits for (about the NIC over one S3 stream)
FIRST_RANGED_CHUNKS = 3  # the item's first chunks, read that way one after the other; the rest have arrived by their turn
MIN_RANGE_BYTES = 8 * 1024**2  # no range smaller (small chunks are one GET)

# A ranged read into a buffer: (piece, start within the piece, length, destination view) -> filled view.
FetchRange = Callable[[ChunkSlice, int, int, memoryview], Buffer]
Check = Callable[[ChunkSlice, Buffer], None]


def ranges_of(length: int, ranges: int = CHUNK_RANGES) -> list[tuple[int, int]]:
    """(start, length) of up to `ranges` near-equal ranges covering `length` bytes, none under MIN_RANGE_BYTES (but one)."""
    count = max(1, min(ranges, length // max(1, MIN_RANGE_BYTES)))
    step = -(-length // count)
    return [(start, min(step, length - start)) for start in range(0, length, step)] or [(0, 0)]


class ChunkLanes:
    """The worker's threads, codecs and chunk buffers, kept for the container's lifetime.

    `lanes`: ranged GETs at once while reading ahead (and the I/O threads
    that also send packs); the encoders and the buffer pool are sized from it
    and the pack size (buffers_per_item)."""

    def __init__(self, lanes: int = 2) -> None:
        self.lanes = max(1, lanes)
        self._io = ThreadPoolExecutor(max_workers=self.lanes + CHUNK_RANGES, thread_name_prefix="braid-io")
        self._encoders = ThreadPoolExecutor(max_workers=ENCODERS, thread_name_prefix="braid-encode")
        self._local = threading.local()
        self._free: list[WritableBuffer] = []
        self._lock = threading.Lock()

    def codec(self, key: DataKey, level: int) -> ChunkCodec:
        """This thread's codec for `key` at `level` (its large buffers are reused from chunk to chunk)."""
        slot = (key.fingerprint, level)
        if getattr(self._local, "slot", None) != slot:
            self._local.codec = ChunkCodec(key, level)
            self._local.slot = slot
        codec: ChunkCodec = self._local.codec
        return codec

    def take(self, size: int) -> WritableBuffer:
        """A pooled buffer of at least `size` bytes (the pool's largest first), or a new one."""
        with self._lock:
            buffer = next((b for b in self._free if len(b) >= size), None)
            if buffer is not None:
                self._free.remove(buffer)
                return buffer
            if self._free:
                self._free.pop()  # too small for this chunk size: made again at the new size
        return new_buffer(size)

    def give_back(self, buffers: Sequence[WritableBuffer]) -> None:
        with self._lock:
            self._free.extend(buffers)

    @property
    def pooled(self) -> list[WritableBuffer]:
        """The buffers waiting for the next item (what a test checks is reused)."""
        with self._lock:
            return list(self._free)

    def io(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        return self._io.submit(in_context(fn), *args)

    def encode(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        return self._encoders.submit(in_context(fn), *args)


def store_item_chunks(
    lanes: ChunkLanes,
    store: ObjectStore,
    ref: BackupRef,
    packs: Sequence[Sequence[ChunkSlice]],
    *,
    chunks_per_pack: int,
    input_index: int,
    buffer_size: int,
    key: DataKey,
    level: int,
    fetch_range: FetchRange,
    check: Check,
    stop: Callable[[], bool] | None = None,
) -> list[ChunkEntry]:
    """Read, encode and store the chunks of `packs` (consecutive runs, in order); their entries, in order.

    `fetch_range` reads part of a chunk into the view it is given (or returns the bytes, then copied there) and
    raises if it gets fewer; `check` raises if a whole chunk is not what the agent staged. `stop` (a cut item's,
    MapItem.cut) is asked as the codec reaches each pack after the first: True ends the item there, its entries
    those of the packs before (a pack a racing encoder stored past the cut is stored again, create-only, by the
    items that finish the cut one)."""
    flow = _ItemFlow(lanes, store, ref, input_index, buffer_size, key, level, fetch_range, check, chunks_per_pack, stop)
    try:
        return flow.run([piece for pack in packs for piece in pack], packs)
    finally:
        flow.settle()


class _ItemFlow:
    """One item's run through the pipeline: the coordinator is the invocation's own thread."""

    def __init__(
        self, lanes: ChunkLanes, store: ObjectStore, ref: BackupRef, input_index: int, buffer_size: int, key: DataKey, level: int,
        fetch_range: FetchRange, check: Check, pack_chunks: int, stop: Callable[[], bool] | None = None,
    ) -> None:
        self.lanes, self.store, self.ref, self.input_index = lanes, store, ref, input_index
        self.stop = stop
        self.stopped_at: int | None = None  # the first pack a cut item does not store (set by the encoder that asked)
        self.stop_lock = threading.Lock()
        self.buffer_size, self.key, self.level = buffer_size, key, level
        self.fetch_range, self.check = fetch_range, check
        self.tokens = threading.Semaphore(buffers_per_item(lanes.lanes, pack_chunks))
        self.started: list[Future[Any]] = []
        self.held: list[WritableBuffer] = []  # every buffer this item took from the pool, returned when it settles
        self.spare: list[WritableBuffer] = []  # of those, the ones a finished PUT freed for the item's next reads
        self.spare_lock = threading.Lock()

    def run(self, pieces: Sequence[ChunkSlice], packs: Sequence[Sequence[ChunkSlice]]) -> list[ChunkEntry]:
        reads: deque[tuple[ChunkSlice, WritableBuffer, Future[Buffer]]] = deque()
        upcoming = iter(enumerate(pieces))
        encoded: dict[int, Future[tuple[ChunkEntry, Buffer] | None]] = {}
        puts: list[tuple[int, Future[list[ChunkEntry]]]] = []
        pack_of = {piece.index: n for n, pack in enumerate(packs) for piece in pack}
        buffers_of: dict[int, list[WritableBuffer]] = {n: [] for n in range(len(packs))}
        for position, piece in enumerate(pieces):
            if self.stopped_at is not None:
                break  # a cut item: the reads already started are waited for (settle) and dropped
            self._read_ahead(reads, upcoming, position)
            read_piece, buffer, read = reads.popleft()
            assert read_piece is piece
            plaintext = read.result()
            n = pack_of[piece.index]
            boundary = n > 0 and piece is packs[n][0]
            encoded[piece.index] = self._start(self.lanes.encode, self._encode, piece, plaintext, buffer, n, boundary)
            buffers_of[n].append(buffer)
            if piece is packs[n][-1]:
                frames = [encoded.pop(p.index) for p in packs[n]]
                puts.append((n, self._start(self.lanes.io, self._put, frames, buffers_of.pop(n), n)))
        stored = [(n, put.result()) for n, put in puts]
        return [entry for n, entries in stored if self.stopped_at is None or n < self.stopped_at for entry in entries]
    def settle(self) -> None:
        """Wait for every started task (a failure must not leave one writing into a pooled buffer), then pool the buffers."""
        wait(self.started)
        self.lanes.give_back(self.held)

    def _start(self, submit: Callable[..., Future[R]], fn: Callable[..., R], *args: Any) -> Future[R]:
        future = submit(fn, *args)
        self.started.append(future)
        return future

    def _read_ahead(self, reads: deque[tuple[ChunkSlice, WritableBuffer, Future[Buffer]]], upcoming: Iterator[tuple[int, ChunkSlice]], position: int) -> None:
        """Start reads up to `lanes` chunks past `position`; the chunk at `position` itself waits for a free buffer.

        Chunks before FIRST_RANGED_CHUNKS are read in ranges, and nothing else
        is read beside them: the codec is waiting for each."""
        while True:
            needed = not reads
            ranged = position < FIRST_RANGED_CHUNKS
            if not needed and (ranged or len(reads) >= self.lanes.lanes):
                return
            if not self.tokens.acquire(blocking=needed):
                return
            following = next(upcoming, None)
            if following is None:
                self.tokens.release()
                return
            index, piece = following
            buffer = self._buffer()
            if index < FIRST_RANGED_CHUNKS:
                read: Future[Buffer] = Future()
                read.set_result(self._read_ranges(piece, buffer))
            else:
                read = self._start(self.lanes.io, self._read_whole, piece, buffer)
            reads.append((piece, buffer, read))

    def _buffer(self) -> WritableBuffer:
        """A buffer a finished PUT of this item freed, else one from the pool: at most the budget's worth per item."""
        with self.spare_lock:
            if self.spare:
                return self.spare.pop()
        buffer = self.lanes.take(self.buffer_size)
        self.held.append(buffer)
        return buffer

    def _read_ranges(self, piece: ChunkSlice, buffer: WritableBuffer) -> Buffer:
        view = memoryview(buffer)[: piece.length]
        parts = [self._start(self.lanes.io, self.fetch_range, piece, start, length, view[start : start + length]) for start, length in ranges_of(piece.length)]
        wait(parts)
        for (start, length), part in zip(ranges_of(piece.length), parts, strict=True):
            _place(view[start : start + length], part.result())
        self.check(piece, view)
        return view

    def _read_whole(self, piece: ChunkSlice, buffer: WritableBuffer) -> Buffer:
        view = memoryview(buffer)[: piece.length]
        _place(view, self.fetch_range(piece, 0, piece.length, view))
        self.check(piece, view)
        return view

    def _encode(self, piece: ChunkSlice, plaintext: Buffer, buffer: WritableBuffer, pack: int, boundary: bool) -> tuple[ChunkEntry, Buffer] | None:
        """The chunk's frame; None when a cut item stops before its pack (asked here, as the codec reaches each
        pack after the first, so a cut stores as little as possible after the stream ended)."""
        if self.stop is not None:
            if boundary and (self.stopped_at is None or pack < self.stopped_at) and self.stop():  # an earlier boundary may answer last
                with self.stop_lock:
                    self.stopped_at = pack if self.stopped_at is None else min(self.stopped_at, pack)
            if self.stopped_at is not None and pack >= self.stopped_at:
                return None
        task = ChunkTask(index=piece.index, input_index=self.input_index, offset=piece.offset)
        return encode_frame(self.lanes.codec(self.key, self.level), self.ref, task, plaintext, buffer)

    def _put(self, frames: list[Future[tuple[ChunkEntry, Buffer] | None]], buffers: list[WritableBuffer], pack: int) -> list[ChunkEntry]:
        try:
            encoded = [f.result() for f in frames]
            if any(frame is None for frame in encoded) or (self.stopped_at is not None and pack >= self.stopped_at):
                return []  # not stored: a cut item stopped before this pack
            return put_pack(lambda: self.lanes.codec(self.key, self.level), self.store, self.ref, [f for f in encoded if f is not None])
        finally:
            with self.spare_lock:
                self.spare.extend(buffers)
            for _ in buffers:
                self.tokens.release()


def _place(target: memoryview, got: Buffer) -> None:
    """Make sure the bytes a read returned are in `target`: a store without ranged reads into a buffer returns its own."""
    source = memoryview(got)
    if len(source) != len(target):
        raise IntegrityError(f"a ranged read returned {len(source)} bytes where {len(target)} were asked for")
    if not _same_memory(source, target):
        target[:] = source


def _same_memory(a: memoryview, b: memoryview) -> bool:
    """True if two views start at the same address (a read that filled the view it was given)."""
    if a.readonly or b.readonly or a.obj is not b.obj:
        return False
    if not len(a) or not len(b):
        return len(a) == len(b)
    return ctypes.addressof(ctypes.c_char.from_buffer(a)) == ctypes.addressof(ctypes.c_char.from_buffer(b))
