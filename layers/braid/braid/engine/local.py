"""The local fan-out engine: the embedded default.

Readers cut the inputs into pool buffers; the shared driver loop
(braid.engine.driver) hands each chunk to a thread pool running
`store_chunk`, the same worker function the Lambda worker runs. Threads
rather than processes: zstd compression, Poly1305, AES-GCM `encrypt_into`
and file writes all release the GIL, so threads scale across cores without
copying 64 MiB chunks between processes (measured in scripts/bench).

Memory is bounded: the pool holds (inputs + workers + 1) chunk buffers,
one for each input to read into and workers + 1 in flight (see
braid.engine.stream for why fewer can deadlock), readers block when all
are out, and each worker thread keeps one reusable output buffer in its codec.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from braid.contract import ENGINE_LOCAL
from braid.engine.driver import drive, pool_size
from braid.engine.finalize import InputRecord, discard_backup_data, finalize_backup
from braid.engine.lease import BackupLease
from braid.engine.local_sink import LocalChunkSink
from braid.engine.port import BackupRequest
from braid.engine.stream import expected_bytes, expected_chunks
from braid.engine.throttle import TokenBucket
from braid.errors import BackupError, UsageError
from braid.format.keys import encryption_context
from braid.format.manifest import Manifest
from braid.format.repository import Repository
from braid.format.timestamps import utc_now
from braid.format.usage import Usage
from braid.ports.keys import KeyService
from braid.ports.progress import PhaseReporter, ProgressFn


class LocalEngine:
    name = ENGINE_LOCAL

    def __init__(self, repository: Repository, keys: KeyService, requests: Callable[[], Mapping[str, int]] | None = None) -> None:
        """`requests`: what this process has sent to a billed service so far (an s3:// repository, a KMS key),
        `service:Operation` -> attempts; None when nothing it does is billed per request."""
        self.repository = repository
        self.keys = keys
        self.requests = requests

    def _usage_since(self, cpu: float, requests: Mapping[str, int]) -> Callable[[Manifest], Usage]:
        """The manifest's usage: this machine's CPU time and the requests sent since the backup began.

        The local engine bills no Lambda, Step Functions or staging; on a
        directory nothing is billed per request. CPU seconds say what the
        backup cost this host (docs/format.md, Usage)."""

        def usage(manifest: Manifest) -> Usage:
            now = dict(self.requests()) if self.requests is not None else {}
            sent = {name: n - requests.get(name, 0) for name, n in now.items() if n > requests.get(name, 0)}
            return Usage(requests=sent, cpu_seconds=time.process_time() - cpu, stored_bytes=manifest.stored_bytes)

        return usage

    def run(self, request: BackupRequest, progress: ProgressFn) -> Manifest:
        if request.resume:
            raise UsageError("a local backup has no staging to resume: run the backup again")
        for source in request.sources:
            source.check()
        ref = request.ref
        report = PhaseReporter(progress, str(ref))
        created = utc_now()
        started = time.monotonic()
        usage = self._usage_since(time.process_time(), dict(self.requests()) if self.requests is not None else {})
        key, wrapped = self.keys.generate_data_key(encryption_context(self.repository.config.id, str(ref)))
        store = self.repository.store
        # The lease (refreshed while the backup runs, removed after) tells a
        # concurrent prune this backup is alive, however long it runs.
        with ThreadPoolExecutor(max_workers=request.workers, thread_name_prefix="braid-worker") as executor, BackupLease(store, ref):
            sink = LocalChunkSink(executor, store, ref, key, request.level, report)
            sources = list(request.sources)
            report.phase("reading", total_bytes=expected_bytes(sources), total_chunks=expected_chunks(sources, request.chunk_size))
            try:
                stream = drive(
                    request.sources,
                    sink,
                    buffers=pool_size(len(request.sources), request.workers + 1),
                    chunk_size=request.chunk_size,
                    backup=str(ref),
                    gate=request.gate,
                    open_timeout=request.open_timeout,
                    progress=report,
                    throttle=TokenBucket(request.rate_limit, burst=request.chunk_size).take if request.rate_limit else None,
                )
                if request.wal_gate is not None:
                    request.wal_gate(stream.captured)
                report.phase("finalizing", total_bytes=sum(stream.input_lengths.values()), total_chunks=stream.chunks)
                return finalize_backup(
                    store,
                    ref=ref,
                    repository_id=self.repository.config.id,
                    key=key,
                    wrapped=wrapped,
                    chunk_size=request.chunk_size,
                    inputs=[InputRecord(s.index, s.label, stream.input_lengths[s.index]) for s in request.sources],
                    entries=stream.outcome,
                    level=request.level,
                    created=created,
                    timings={
                        "stream_seconds": round(stream.ended_at - started, 3),
                        "total_seconds": round(time.monotonic() - started, 3),
                    },
                    engine=self.name,
                    stats={"workers": request.workers, "max_buffers_in_flight": stream.max_buffers_in_flight},
                    usage=usage,
                    lineage=request.lineage,
                    wal=stream.captured.wal,
                    metadata=stream.captured.metadata,
                    labels=request.labels,
                )
            except BaseException:
                # The driver has stopped the readers and every worker, so
                # nothing writes a chunk after this.
                try:
                    discard_backup_data(store, ref)
                except BackupError:
                    pass  # the original error is what the user needs; leftovers have no manifest
                raise
