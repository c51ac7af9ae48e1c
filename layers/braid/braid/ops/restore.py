"""Restore: stream a backup's original bytes back, verified before written.

Before the first byte, every chunk's object (its pack, docs/format.md) must
be in the repository with its recorded size (one LIST per 1,000 objects on
S3, not a HEAD each); each chunk is then read as its frame, a ranged read of
its pack (a whole read for a chunk alone in its object): stdout
and pipes cannot take bytes back, and a backup missing its last chunk must
not be found out after the rest was written. Regular files are written
beside their name and renamed over it only when every output succeeded
(braid.ops.restore_output).

Each output has its own writer thread, so a restore tool that reads its
pipes in any order, or in turn, never deadlocks us. Chunks are fetched and
decoded in a shared pool; a chunk's bytes reach the output only after it
authenticated and its plaintext checksum matched, and the chunks of an
input are written strictly in order.

Memory is (outputs + workers + 1) plaintext chunks at most: each output may
always have its next chunk decoded (so a reader waiting on one pipe while
the others are full never waits for ever), and workers + 1 chunks more are
shared among the outputs as read-ahead.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

from braid.engine.fifo_open import DEFAULT_OPEN_TIMEOUT
from braid.errors import BackupError, IntegrityError, UsageError
from braid.format.buffers import WritableBuffer, new_buffer
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.layout import data_prefix
from braid.format.manifest import ChunkEntry, InputEntry, Manifest
from braid.format.stored import frame_location, stored_objects
from braid.ops.chunk_reader import ChunkReader
from braid.ops.restore_output import Output, OutputTarget, commit_all, remove_partial
from braid.ports.progress import PhaseReporter, ProgressFn
from braid.ports.store import ObjectStore, prefetch_object

__all__ = ["OutputTarget", "RestoreStats", "SharedDecoders", "check_chunks_present", "restore_backup", "targets_from_args"]


def targets_from_args(paths: list[str] | None, manifest: Manifest) -> list[OutputTarget]:
    """One output per backup input: stdout for a single input, else one --output PATH each (never one file twice)."""
    count = len(manifest.inputs)
    if not paths:
        if count != 1:
            raise UsageError(f"backup {manifest.backup} has {count} inputs; give {count} --output paths, one per input")
        if sys.stdout is None or sys.stdout.isatty():
            raise UsageError(
                "stdout is a terminal: redirect the restore (> FILE), give --output PATH, or give the command that reads it after --"
                " (a pg_basebackup -Ft tar: -- tar -x -C DIR)"
            )
        return [OutputTarget("stdout", None)]
    if len(paths) != count:
        raise UsageError(f"backup {manifest.backup} has {count} input(s) but {len(paths)} --output path(s) were given")
    if len({os.path.realpath(p) for p in paths}) != len(paths):
        raise UsageError("the same output is named twice")
    return [OutputTarget(p, p) for p in paths]


def check_chunks_present(store: ObjectStore, manifest: Manifest, key: DataKey) -> None:
    """Every stored object (pack) in the store with its recorded size, or the first that is not, by chunk index.

    An object the LIST did not show is fetched once more through the chunk
    reader (its first chunk), which tells a missing object (corruption,
    exit 6) from a backup removed while we read it (exit 8).
    """
    ref = BackupRef.parse(manifest.backup)
    sizes = {info.key: info.size for info in store.list(data_prefix(ref))}
    entries = {c.index: c for c in manifest.chunks()}
    reader: ChunkReader | None = None
    for stored in stored_objects(manifest):
        size = sizes.get(stored.key)
        if size is None:
            reader = reader or ChunkReader(store, manifest, key)
            fetched = len(reader.fetch(entries[stored.chunks[0]]))  # raises the right error when it is gone
            info = store.head(stored.key) if len(stored.chunks) > 1 else None  # a pack's read was its first frame only
            size = info.size if info is not None else fetched
        if size != stored.size:
            raise IntegrityError(
                f"{stored.label} of backup {ref} is {size} bytes in the repository, the manifest says {stored.size}; nothing was restored"
            )


@dataclass
class RestoreStats:
    buffers: int = 0  # plaintext chunk buffers allocated: at most outputs + workers + 1


class _ReadAhead:
    """Chunks decoded beyond each output's next one, shared by all outputs; taking one never waits."""

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._lock = threading.Lock()

    def try_take(self) -> bool:
        with self._lock:
            if self._free == 0:
                return False
            self._free -= 1
            return True

    def give(self) -> None:
        with self._lock:
            self._free += 1


class _Buffers:
    """Reusable buffers of one size shared by the decoders, the first few made ahead.

    The first decoders' buffers are made by helper threads (`make_one`)
    while their chunks are read from disk, rather than by each decoder after
    its read (on its critical path). A decoder
    that finds none free waits for one being made instead of making another,
    so no more exist than the decoders and writers hold at once.
    """

    def __init__(self, size: int, ahead: int) -> None:
        self.size = size
        self.made = 0
        self._ahead = ahead
        self._free: list[WritableBuffer] = []
        self._ready = threading.Condition()

    def make_one(self) -> None:
        try:
            buffer: WritableBuffer | None = new_buffer(self.size)
        except Exception:  # out of memory: the decoder that needs one makes its own, and reports that
            buffer = None
        with self._ready:
            self._ahead -= 1
            if buffer is not None:
                self.made += 1
                self._free.append(buffer)
            self._ready.notify_all()

    def take(self) -> WritableBuffer:
        with self._ready:
            while not self._free and self._ahead > 0:
                self._ready.wait()
            if self._free:
                return self._free.pop()
            self.made += 1
        return new_buffer(self.size)

    def give(self, buffer: WritableBuffer) -> None:
        with self._ready:
            self._free.append(buffer)
            self._ready.notify()


class SharedDecoders:
    """One decoder pool and one set of chunk buffers for several backups restored in turn (a chain's links,
    braid.cli.commands.restore_chain), made once instead of once per backup: `workers` threads, buffers as large as the
    largest chunk of any of `manifests`. Two restores may use it at once (one decodes while the other writes);
    `close()` after the last one returned."""

    def __init__(self, manifests: Sequence[Manifest], workers: int) -> None:
        chunks = [c for manifest in manifests for c in manifest.chunks()]
        self.workers = max(1, workers)
        self.pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="braid-restore")
        first = min(self.workers, len(chunks))
        self.plaintexts = _Buffers(max((c.length for c in chunks), default=0), first)
        self.scratches = _Buffers(max((c.stored_length for c in chunks if c.compression == "zstd"), default=0), first)
        for _ in range(first):
            threading.Thread(target=self._make_first, name="braid-buffers", daemon=True).start()

    def _make_first(self) -> None:
        self.scratches.make_one()
        self.plaintexts.make_one()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def restore_backup(
    store: ObjectStore,
    manifest: Manifest,
    key: DataKey,
    targets: list[OutputTarget],
    *,
    workers: int,
    force: bool = False,
    progress: ProgressFn | None = None,
    open_timeout: float = DEFAULT_OPEN_TIMEOUT,
    shared: SharedDecoders | None = None,
) -> RestoreStats:
    """Write each input of the backup to its target; a failure leaves every target file as it was.

    A named-pipe target waits at most `open_timeout` seconds for its reader.
    `shared`: decode on its pool into its buffers; the caller listed this
    backup's chunks (`check_chunks_present`) before writing anything.
    """
    ref = BackupRef.parse(manifest.backup)
    for target in targets:
        target.check(force)
    if shared is None:
        check_chunks_present(store, manifest, key)
    if progress is not None:
        progress = report = PhaseReporter(progress, str(ref))
        report.phase("restoring", total_bytes=manifest.plaintext_bytes, total_chunks=manifest.chunk_count)

    readers = threading.local()
    cancelled = threading.Event()
    errors: list[BaseException] = []
    finished: list[Output] = []
    lock = threading.Lock()
    totals = {"bytes": 0, "chunks": 0}
    reporting = threading.Lock()
    stats = RestoreStats()
    ahead = _ReadAhead(max(1, workers) + 1)
    # Plaintext buffers circulate between decoders and writers: no chunk
    # pays for a fresh 64 MiB allocation, and `ahead` bounds how many exist.
    # As large as the largest chunk: a backup shorter than one chunk needs
    # no full chunk's pages (64 MiB by default) to restore. Scratch buffers
    # hold a chunk's decrypted zstd frame while it decompresses.
    first = min(max(1, workers), manifest.chunk_count) if shared is None else 0
    if shared is None:
        plaintexts = _Buffers(max((c.length for c in manifest.chunks()), default=0), first)
        scratches = _Buffers(max((c.stored_length for c in manifest.chunks() if c.compression == "zstd"), default=0), first)
    else:
        plaintexts, scratches = shared.plaintexts, shared.scratches

    def make_first_buffers() -> None:  # one helper per decoder, so they are made side by side as the reads are
        scratches.make_one()
        plaintexts.make_one()

    # Chunks queued for decoding whose read has not started, oldest first.
    # Each read that completes asks the store to prefetch the oldest one, so
    # the disk reads the next chunk while this one decodes; asking for all
    # of them at once made the first reads wait for the rest (measured).
    unread: dict[int, ChunkEntry] = {}

    def fetch(entry: ChunkEntry) -> tuple[WritableBuffer, memoryview]:
        if cancelled.is_set():
            raise BackupError("restore cancelled")
        reader = getattr(readers, "reader", None)
        if reader is None:
            reader = readers.reader = ChunkReader(store, manifest, key)
        with lock:
            unread.pop(entry.index, None)
        stored = reader.fetch(entry)
        with lock:
            following = next(iter(unread.values()), None)
            if following is not None:
                del unread[following.index]
        if following is not None:
            prefetch_object(store, frame_location(ref, following)[0])
        # Taken only now that the stored chunk is in: by then the writer has
        # usually given back the buffer of the chunk before, so a fast
        # output (a pipe, /dev/null) makes do with one buffer per decoder
        # instead of paging in one per chunk read ahead (measured).
        buffer = plaintexts.take()
        scratch = scratches.take()
        try:
            return buffer, reader.decode(stored, entry, buffer, scratch)
        except BaseException:
            plaintexts.give(buffer)
            raise
        finally:
            scratches.give(scratch)

    def waiting(target: OutputTarget) -> None:
        if progress is not None:
            message = f"waiting for a reader on {target.label} (giving up after {open_timeout:g} s, --open-timeout)"
            progress({"event": "waiting", "backup": str(ref), "output": target.label, "message": message})

    def write_input(entry: InputEntry, target: OutputTarget, pool: ThreadPoolExecutor) -> None:
        # outstanding[0] is this output's next chunk, always allowed; the
        # others each hold one of the shared read-ahead slots.
        outstanding: deque[Future[tuple[WritableBuffer, memoryview]]] = deque()
        position = 0
        output: Output | None = None

        def top_up() -> None:
            nonlocal position
            while position < len(entry.chunks) and (not outstanding or ahead.try_take()):
                with lock:
                    unread[entry.chunks[position].index] = entry.chunks[position]
                outstanding.append(pool.submit(fetch, entry.chunks[position]))
                position += 1

        try:
            top_up()  # decoding starts while a pipe's reader may still be on its way
            output = target.open(timeout=open_timeout, note=lambda: waiting(target), cancelled=cancelled)
            if output is None:
                return
            while outstanding:
                if cancelled.is_set():
                    break
                buffer, plaintext = outstanding[0].result()
                try:
                    output.write(plaintext)
                finally:
                    plaintexts.give(buffer)
                outstanding.popleft()
                if outstanding:
                    ahead.give()  # the next chunk is now this output's own
                top_up()
                with reporting:  # one report at a time, in the order of the counts
                    with lock:
                        totals["bytes"] += len(plaintext)
                        totals["chunks"] += 1
                        snapshot = dict(totals)
                    if progress:
                        progress({"event": "chunk", "backup": str(ref), **snapshot})
            else:
                done, output = output, None
                done.finish()
                with lock:
                    finished.append(done)
        except BaseException as exc:  # reported by the caller, first error wins
            with lock:
                errors.append(exc)
            cancelled.set()
        finally:
            if output is not None:  # failed or cancelled: nothing under the real name
                output.discard()

    writers: list[tuple[OutputTarget, threading.Thread]] = []
    succeeded = False
    for _ in range(first):
        threading.Thread(target=make_first_buffers, name="braid-buffers", daemon=True).start()
    try:
        pools = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="braid-restore") if shared is None else nullcontext(shared.pool)
        with pools as pool:
            try:
                for entry, target in zip(manifest.inputs, targets, strict=True):
                    writer = threading.Thread(target=write_input, args=(entry, target, pool), name=f"braid-out-{entry.index}", daemon=True)
                    writers.append((target, writer))
                    writer.start()
                _join(writers, cancelled)
            except BaseException:
                cancelled.set()  # queued decodes end at once instead of running to the end
                _join(writers, cancelled)
                raise
        if errors:
            raise errors[0]
        commit_all(finished)
        stats.buffers = plaintexts.made
        succeeded = True
    finally:
        if not succeeded:
            for output in finished:
                output.discard()
            for target, writer in writers:
                partial = target.partial_path
                if partial is not None and not writer.is_alive():
                    remove_partial(partial)
    return stats


def _join(writers: list[tuple[OutputTarget, threading.Thread]], cancelled: threading.Event) -> None:
    """Wait for every writer; once one failed, for those that can still finish.

    A writer of a regular file always ends soon (its decodes end, it removes
    its partial file), so it is waited for. One blocked on a pipe or stdout
    nobody reads is a daemon thread and must not hold the exit.
    """
    while any(writer.is_alive() for _, writer in writers):
        for _, writer in writers:
            writer.join(0.1)
        if cancelled.is_set():
            for target, writer in writers:
                writer.join(None if target.ends_soon else 1.0)
            return
