"""Restore: stream a backup's original bytes back, verified before written.

Each output (stdout, a file, or a named pipe a database restore reads from)
has its own writer thread, so a restore tool that reads its pipes in any
order never deadlocks us. Chunks are fetched and decoded in a shared pool, a
bounded window ahead of each writer; a chunk's bytes reach the output only
after it authenticated and its plaintext checksum matched, and the chunks
of an input are written strictly in order.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from braid.errors import BackupError, InputError, UsageError
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.manifest import ChunkEntry, InputEntry, Manifest
from braid.ops.chunk_reader import ChunkReader
from braid.ports.progress import ProgressFn
from braid.ports.store import ObjectStore


@dataclass(frozen=True)
class OutputTarget:
    label: str
    path: str | None  # None: stdout

    def open(self, force: bool) -> BinaryIO:
        if self.path is None:
            return os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
        try:
            mode = os.stat(self.path).st_mode
            if stat.S_ISREG(mode) and os.path.getsize(self.path) > 0 and not force:
                raise InputError(f"output {self.path} already exists; remove it or pass --force to overwrite")
            if stat.S_ISDIR(mode):
                raise InputError(f"output {self.path} is a directory")
        except FileNotFoundError:
            pass
        try:
            return open(self.path, "wb", buffering=0)
        except OSError as exc:
            raise InputError(f"cannot open output {self.path}: {exc.strerror}") from None


def targets_from_args(paths: list[str] | None, manifest: Manifest) -> list[OutputTarget]:
    count = len(manifest.inputs)
    if not paths:
        if count != 1:
            raise UsageError(f"backup {manifest.backup} has {count} inputs; give {count} --output paths, one per input")
        if sys.stdout is None or sys.stdout.isatty():
            raise UsageError("stdout is a terminal: redirect the restore (> FILE, | pg_restore ...) or give --output PATH")
        return [OutputTarget("stdout", None)]
    if len(paths) != count:
        raise UsageError(f"backup {manifest.backup} has {count} input(s) but {len(paths)} --output path(s) were given")
    if len(set(paths)) != len(paths):
        raise UsageError("the same output is named twice")
    return [OutputTarget(p, p) for p in paths]


def _write_all(handle: BinaryIO, data: memoryview, label: str) -> None:
    view = data
    try:
        while view:
            written = handle.write(view)
            if written is None:
                continue
            view = view[written:]
    except BrokenPipeError:
        raise InputError(f"output {label} was closed by its reader before the restore finished") from None
    except OSError as exc:
        raise InputError(f"error writing output {label}: {exc.strerror or exc}") from None


def restore_backup(
    store: ObjectStore,
    manifest: Manifest,
    key: DataKey,
    targets: list[OutputTarget],
    *,
    workers: int,
    force: bool = False,
    progress: ProgressFn | None = None,
) -> None:
    ref = BackupRef.parse(manifest.backup)
    readers = threading.local()
    cancelled = threading.Event()
    errors: list[BaseException] = []
    lock = threading.Lock()
    totals = {"bytes_written": 0, "chunks_done": 0}
    # Enough chunks ahead of each writer to keep every decoder busy: writing
    # is several times faster than decoding, so `workers` in flight suffice.
    window = max(2, -(-workers // max(1, len(targets))))
    # Plaintext buffers circulate between decoders and writers: at most
    # (window + 1) per output exist, so memory is bounded and no chunk pays
    # for a fresh 64 MiB allocation.
    free_buffers: list[bytearray] = []

    def take_buffer() -> bytearray:
        with lock:
            return free_buffers.pop() if free_buffers else bytearray(manifest.chunk_size)

    def give_buffer(buffer: bytearray) -> None:
        with lock:
            free_buffers.append(buffer)

    def fetch(entry: ChunkEntry) -> tuple[bytearray, memoryview]:
        if cancelled.is_set():
            raise BackupError("restore cancelled")
        reader = getattr(readers, "reader", None)
        if reader is None:
            reader = readers.reader = ChunkReader(store, manifest, key)
        buffer = take_buffer()
        return buffer, reader.read(entry, buffer)

    def write_input(entry: InputEntry, target: OutputTarget, pool: ThreadPoolExecutor) -> None:
        try:
            pending: deque[tuple[ChunkEntry, Future[tuple[bytearray, memoryview]]]] = deque()
            chunks = iter(entry.chunks)
            with target.open(force) as handle:
                for chunk in chunks:
                    pending.append((chunk, pool.submit(fetch, chunk)))
                    if len(pending) >= window:
                        break
                while pending:
                    if cancelled.is_set():
                        return
                    chunk, future = pending.popleft()
                    buffer, plaintext = future.result()
                    nxt = next(chunks, None)
                    if nxt is not None:
                        pending.append((nxt, pool.submit(fetch, nxt)))
                    _write_all(handle, plaintext, target.label)
                    give_buffer(buffer)
                    with lock:
                        totals["bytes_written"] += len(plaintext)
                        totals["chunks_done"] += 1
                        snapshot = dict(totals)
                    if progress:
                        progress({"event": "chunk", "backup": str(ref), **snapshot})
        except BaseException as exc:  # reported by the caller, first error wins
            with lock:
                errors.append(exc)
            cancelled.set()

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="braid-restore") as pool:
        writers = [
            threading.Thread(target=write_input, args=(entry, target, pool), name=f"braid-out-{entry.index}", daemon=True)
            for entry, target in zip(manifest.inputs, targets, strict=True)
        ]
        for writer in writers:
            writer.start()
        while any(w.is_alive() for w in writers):
            for writer in writers:
                writer.join(0.1)
            if cancelled.is_set():
                # A writer may be blocked opening a named pipe nobody will
                # read; it is a daemon thread and must not hold the exit.
                for writer in writers:
                    writer.join(1.0)
                break
    if errors:
        raise errors[0]
