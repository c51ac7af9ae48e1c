"""The local fan-out engine: the embedded default.

Readers cut the inputs into pool buffers; a thread pool runs `store_chunk`,
the same worker function the Lambda worker runs. Threads rather than
processes: zstd compression, Poly1305, AES-GCM `encrypt_into` and file writes
all release the GIL, so threads scale across cores without copying 64 MiB
chunks between processes (measured in scripts/bench).

Memory is bounded: the pool holds workers + 2 chunk buffers, readers block
when all are in flight, and each worker thread keeps one reusable output
buffer in its codec.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait

from braid.engine.chunk_worker import ChunkTask, store_chunk
from braid.engine.finalize import InputRecord, discard_backup_data, finalize_backup
from braid.engine.port import BackupRequest
from braid.engine.stream import BufferPool, InputEnd, Piece, StreamCutter
from braid.errors import BackupError, LimitError, UsageError
from braid.format.chunk import MAX_CHUNKS_PER_KEY, ChunkCodec
from braid.format.keys import KeyService, encryption_context
from braid.format.manifest import ChunkEntry, Manifest
from braid.format.repository import Repository
from braid.format.timestamps import utc_now
from braid.ports.progress import ProgressFn


def algorithms(level: int) -> dict[str, object]:
    return {
        "compression": "zstd",
        "level": level,
        "cipher": "aes-256-gcm",
        "nonce": "random-96",
        "chunk_mac": "poly1305-hmac-sha256-derived-key",
        "input_mac": "hmac-sha256-chain",
        "manifest_mac": "hmac-sha256",
        "stored_checksum": "crc64nvme",
        "key_derivation": "hkdf-sha256",
    }


class LocalEngine:
    name = "local"

    def __init__(self, repository: Repository, keys: KeyService) -> None:
        self.repository = repository
        self.keys = keys
        self.last_pool: BufferPool | None = None

    def run(self, request: BackupRequest, progress: ProgressFn) -> Manifest:
        if request.resume:
            raise UsageError("a local backup has no staging to resume: run the backup again")
        for source in request.sources:
            source.check()
        ref = request.ref
        created = utc_now()
        started = time.monotonic()
        key, wrapped = self.keys.generate_data_key(encryption_context(self.repository.config.id, str(ref)))
        pool = BufferPool(request.workers + 2, request.chunk_size)
        self.last_pool = pool
        cancelled = threading.Event()
        codecs = threading.local()
        store = self.repository.store
        lock = threading.Lock()
        totals = {"bytes_read": 0, "stored_bytes": 0, "chunks_done": 0}

        def work(piece: Piece, task: ChunkTask) -> ChunkEntry:
            try:
                if cancelled.is_set():
                    raise BackupError("backup cancelled")
                codec = getattr(codecs, "codec", None)
                if codec is None:
                    codec = codecs.codec = ChunkCodec(key, request.level)
                # Not fsynced here: finalize syncs every chunk before the
                # manifest, so no worker waits on the disk mid-stream.
                entry = store_chunk(codec, store, ref, task, piece.data, durable=False)
            finally:
                pool.release(piece.buffer)
            with lock:
                totals["stored_bytes"] += entry.stored_length
                totals["chunks_done"] += 1
                snapshot = dict(totals)
            progress({"event": "chunk", "backup": str(ref), **snapshot})
            return entry

        futures: list[Future[ChunkEntry]] = []
        ends: dict[int, int] = {}
        stream_end = 0.0
        executor = ThreadPoolExecutor(max_workers=request.workers, thread_name_prefix="braid-worker")
        cutter = StreamCutter(request.sources, pool, cancelled)
        try:
            next_index = 0
            for event in cutter:
                if isinstance(event, InputEnd):
                    ends[event.input_index] = event.length
                    continue
                if next_index >= MAX_CHUNKS_PER_KEY:
                    pool.release(event.buffer)
                    raise LimitError(f"backup {ref} would exceed 2^32 chunks under one data key; use a larger --chunk-size")
                task = ChunkTask(next_index, event.input_index, event.offset)
                next_index += 1
                with lock:
                    totals["bytes_read"] += event.length
                futures.append(executor.submit(work, event, task))
                failed = [f for f in futures if f.done() and f.exception() is not None]
                if failed:
                    raise failed[0].exception()  # type: ignore[misc]
            stream_end = time.monotonic() - started
            wait(futures, return_when=FIRST_EXCEPTION)
            for future in futures:
                if future.done() and future.exception() is not None:
                    raise future.exception()  # type: ignore[misc]
            entries = [f.result() for f in futures]
            inputs = [InputRecord(s.index, s.label, ends[s.index]) for s in request.sources]
            manifest = finalize_backup(
                store,
                ref=ref,
                repository_id=self.repository.config.id,
                key=key,
                wrapped=wrapped,
                chunk_size=request.chunk_size,
                inputs=inputs,
                entries=entries,
                algorithms=algorithms(request.level),
                created=created,
                timings={
                    "stream_seconds": round(stream_end, 3),
                    "total_seconds": round(time.monotonic() - started, 3),
                },
                engine=self.name,
                stats={"workers": request.workers, "max_buffers_in_flight": pool.max_in_use},
            )
        except BaseException:
            cancelled.set()
            executor.shutdown(wait=True, cancel_futures=True)
            cutter.join()
            try:
                discard_backup_data(store, ref)
            except BackupError:
                pass  # the original error is what the user needs; leftovers have no manifest
            raise
        executor.shutdown(wait=True)
        return manifest
