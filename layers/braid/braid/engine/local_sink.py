"""The local engine's sink: encode and store each chunk on a thread pool.

Per chunk the driver's thread does a constant amount of work, however long
the stream: it submits the chunk and checks one field for a failure. Only
futures still in flight are kept (at most the pool's buffers plus the
workers finishing up), each reports itself through a done-callback, and
results are collected by chunk index. Scanning every future submitted so
far after each chunk, as this engine once did, cost ~1.2 µs per future:
~160 s of database-host CPU per TiB at 64 MiB chunks.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, Future
from typing import Any

from braid.engine.chunk_worker import ChunkTask, store_chunk
from braid.engine.driver import Release
from braid.engine.stream import Piece
from braid.errors import BackupError
from braid.format.chunk import ChunkCodec
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.manifest import ChunkEntry
from braid.ports.progress import ProgressFn
from braid.ports.store import ObjectStore


class LocalChunkSink:
    """A `ChunkSink` whose outcome is the stored chunks' entries, in index order.

    The executor is the caller's (it shuts it down); the sink only ever
    cancels or waits for the futures it submitted itself.
    """

    def __init__(
        self, executor: Executor, store: ObjectStore, ref: BackupRef, key: DataKey, level: int, progress: ProgressFn
    ) -> None:
        self._executor = executor
        self._store = store
        self._ref = ref
        self._key = key
        self._level = level
        self._progress = progress
        self._codecs = threading.local()  # one codec (and output buffer) per worker thread
        self._lock = threading.Lock()
        self._reporting = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._pending: set[Future[ChunkEntry]] = set()
        self._entries: dict[int, ChunkEntry] = {}
        self._error: BaseException | None = None
        self._stopped = threading.Event()
        self._running = 0  # workers inside store_chunk now (abort waits for them)
        # The stored chunks' plaintext, stored size and count: one set, so their ratio is exact mid-stream.
        self._totals = {"bytes": 0, "stored_bytes": 0, "chunks": 0}

    def accept(self, index: int, piece: Piece, release: Release) -> None:
        release = _once(release)  # a signal inside submit() may leave both this and the worker releasing
        with self._lock:
            error = self._error
        if error is not None:
            release()
            raise error
        try:
            future = self._executor.submit(self._store_one, ChunkTask(index, piece.input_index, piece.offset), piece, release)
        except BaseException:
            release()
            raise
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(lambda done: self._settled(index, done, release))

    def end_input(self, input_index: int, length: int) -> None:
        """Nothing to do: chunks are placed by index and offset, and the driver keeps the lengths."""

    def finish(self) -> list[ChunkEntry]:
        with self._lock:
            while self._pending and self._error is None:
                self._changed.wait()
            if self._error is not None:
                raise self._error
            entries = [entry for _, entry in sorted(self._entries.items())]
        # Every chunk is stored: the codecs' chunk-sized buffers go back now,
        # unmapped in the background while the backup is published, not by
        # the process's exit after it.
        self._codecs = threading.local()
        return entries

    def abort(self, error: BaseException) -> None:
        """Stop: queued chunks never run, and return only once no worker is storing one.

        Waits on the workers actually running (`_running`), not on the
        futures accept() recorded: a signal can interrupt accept() between
        submitting a chunk and recording its future, and that chunk must not
        land after the caller discarded the backup's data.
        """
        with self._lock:
            self._stopped.set()
            pending = list(self._pending)
        for future in pending:
            future.cancel()  # queued: never runs; its callback gives the buffer back
        with self._lock:
            while self._running:
                self._changed.wait()

    def _store_one(self, task: ChunkTask, piece: Piece, release: Release) -> ChunkEntry:
        with self._lock:  # against abort(): a chunk starts only while the backup is not stopped
            stopped = self._stopped.is_set()
            if not stopped:
                self._running += 1
        if stopped:
            release()
            raise BackupError("backup cancelled")
        try:
            codec: ChunkCodec | None = getattr(self._codecs, "codec", None)
            if codec is None:
                codec = self._codecs.codec = ChunkCodec(self._key, self._level)
            # Not fsynced here: finalize syncs every chunk before the
            # manifest, so no worker waits on the disk mid-stream.
            entry = store_chunk(codec, self._store, self._ref, task, piece.data, durable=False, spent=piece.buffer)
        finally:
            release()
            with self._lock:
                self._running -= 1
                self._changed.notify_all()
        with self._reporting:  # one report at a time, in the order of the counts (never under the state lock)
            with self._lock:
                self._totals["bytes"] += entry.length
                self._totals["stored_bytes"] += entry.stored_length
                self._totals["chunks"] += 1
                snapshot: dict[str, Any] = dict(self._totals)
            ratio = round(snapshot["stored_bytes"] / snapshot["bytes"], 4) if snapshot["bytes"] else 1.0
            self._progress({"event": "chunk", "backup": str(self._ref), **snapshot, "ratio": ratio})
        return entry

    def _settled(self, index: int, future: Future[ChunkEntry], release: Release) -> None:
        """Runs once per future, on whichever thread completed it."""
        if future.cancelled():
            release()
            error: BaseException | None = None
        else:
            error = future.exception()
        with self._lock:
            self._pending.discard(future)
            if error is not None:
                if self._error is None:
                    self._error = error
            elif not future.cancelled():
                self._entries[index] = future.result()
            self._changed.notify_all()


def _once(release: Release) -> Release:
    """`release`, giving the buffer back at most once whoever calls it (a pool buffer handed out twice is two chunks in one buffer)."""
    taken = threading.Lock()

    def call() -> None:
        if taken.acquire(blocking=False):
            release()

    return call
