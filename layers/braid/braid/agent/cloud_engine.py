"""The agent's side of a cloud backup: stage raw parts, start the pipeline, watch it.

The host reads and uploads; it holds no key material and calls no KMS.
Step Functions runs the workers; Finalize publishes the manifest. The agent
exits successfully only when the manifest is published and it has checked,
with what it alone knows, that the manifest describes exactly the bytes it
sent: every input's length, and every chunk present with its recorded size.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from braid.adapters.aws.s3 import S3Store
from braid.adapters.aws.stepfunctions import ExecutionStatus, StepFunctionsEngine, stepfunctions_client
from braid.agent.uploader import StagingUpload
from braid.engine.port import BackupRequest
from braid.engine.stream import BufferPool, InputEnd, StreamCutter
from braid.errors import BackupError, ExecutionError, IntegrityError, RepositoryError, UsageError
from braid.format.ids import BackupRef
from braid.format.layout import data_prefix
from braid.format.manifest import Manifest
from braid.format.repository import Repository
from braid.format.staging import StreamEnd, stream_end_key
from braid.pipeline.execution_input import DEFAULT_MAX_CONCURRENCY, ExecutionInput
from braid.pipeline.plan import load_rounds
from braid.pipeline.results import processed_chunks
from braid.ports.progress import ProgressFn


@dataclass(frozen=True)
class CloudOptions:
    concurrency: int = 8
    rate_limit: float | None = None
    fan_out: int = DEFAULT_MAX_CONCURRENCY
    wait: bool = True
    poll_seconds: float = 2.0


class CloudEngine:
    name = "stepfunctions"

    def __init__(self, repository: Repository, options: CloudOptions, sfn_client: Any = None) -> None:
        if not isinstance(repository.store, S3Store):
            raise UsageError("the cloud engine needs an s3:// repository")
        arn = repository.config.cloud.get("state_machine_arn")
        if not arn:
            raise RepositoryError(f"repository {repository.url} names no pipeline: run 'braid init --repo {repository.url} --stack NAME'")
        self.repository = repository
        self.store: S3Store = repository.store
        self.options = options
        self.pipeline = StepFunctionsEngine(sfn_client or stepfunctions_client(repository.config.cloud.get("region")), str(arn))

    # -- backup ---------------------------------------------------------------

    def run(self, request: BackupRequest, progress: ProgressFn) -> Manifest | None:
        """Stage the inputs and start the pipeline; wait for it unless told not to."""
        for source in request.sources:
            source.check()
        ref = request.ref
        upload_options: dict[str, Any] = {
            "concurrency": self.options.concurrency,
            "rate_limit": self.options.rate_limit,
            "progress": lambda snapshot: progress({"event": "upload", "backup": str(ref), **snapshot}),
        }
        labels = [s.label for s in request.sources]
        if request.resume:
            upload = StagingUpload.resume(self.store, ref, inputs=labels, **upload_options)
        else:
            upload = StagingUpload.start(
                self.store,
                ref,
                inputs=labels,
                chunk_size=request.chunk_size,
                level=request.level,
                repository_id=self.repository.config.id,
                **upload_options,
            )
        # Start the pipeline as soon as the session exists: it fans out each
        # segment as the agent completes it, while later ones still upload.
        document = ExecutionInput(backup=str(ref), prefix=self.store.prefix, max_concurrency=self.options.fan_out).to_json()
        self.pipeline.start(ref, document)
        chunk_size = upload.chunk_size
        pool = BufferPool(self.options.concurrency + 2, chunk_size)
        cancelled = threading.Event()
        cutter = StreamCutter(request.sources, pool, cancelled)
        try:
            for event in cutter:
                if isinstance(event, InputEnd):
                    upload.end_input(event.input_index, event.length)
                    continue
                buffer = event.buffer
                upload.submit(event.input_index, event.number, event.data, _releaser(pool, buffer))
            stream_end = upload.finish()
        except BaseException as exc:
            cancelled.set()
            upload.abort(exc)
            cutter.join()
            raise _resumable(exc, ref)
        progress(
            {
                "event": "stream-end",
                "backup": str(ref),
                "bytes_read": sum(stream_end.lengths),
                "parts_uploaded": upload.parts_uploaded,
                "parts_skipped": upload.parts_skipped,  # already in S3 (--resume)
                "max_buffers_in_flight": pool.max_in_use,
            }
        )
        if not self.options.wait:
            return None
        return self.wait(ref, progress, expected=stream_end)

    # -- following an execution ------------------------------------------------

    def wait(self, ref: BackupRef, progress: ProgressFn, *, expected: StreamEnd | None = None) -> Manifest:
        delay = self.options.poll_seconds
        last_count = -1
        while True:
            status = self.pipeline.describe(ref)
            if status.done:
                break
            count = self.chunks_processed(ref)
            if count is not None and count != last_count:
                progress({"event": "status", "backup": str(ref), "status": status.status, "chunks_done": count})
                last_count = count
            time.sleep(delay)
        return self.outcome(ref, status, expected)

    def status(self, ref: BackupRef) -> tuple[ExecutionStatus, int]:
        status = self.pipeline.describe(ref)
        if status.status == "SUCCEEDED":  # staging is gone; the manifest tells
            try:
                return status, self.repository.load(ref).manifest.chunk_count
            except BackupError:
                pass
        return status, self.chunks_processed(ref) or 0

    def chunks_processed(self, ref: BackupRef) -> int | None:
        """Chunks with a worker result so far (results are per map item, several chunks each).

        None when staging changes under the count (Finalize or Cleanup
        removing it): progress is best effort and must never fail a backup.
        """
        try:
            return processed_chunks(self.store, ref, load_rounds(self.store, ref))
        except BackupError:
            return None

    def outcome(self, ref: BackupRef, status: ExecutionStatus, expected: StreamEnd | None = None) -> Manifest:
        if status.status != "SUCCEEDED":
            raise ExecutionError(status.failure_message(ref))
        manifest = self.repository.load(ref).manifest
        if expected is not None:
            check_covers_stream(manifest, expected)
        self.check_chunks_listed(manifest)
        return manifest

    def check_chunks_listed(self, manifest: Manifest) -> None:
        """Every chunk present with its recorded size: one LIST per 1,000 chunks, no key needed."""
        ref = BackupRef.parse(manifest.backup)
        sizes = {info.key: info.size for info in self.store.list(data_prefix(ref))}
        for chunk in manifest.chunks():
            key = f"{data_prefix(ref)}{chunk.index:010d}"
            if sizes.get(key) != chunk.stored_length:
                raise IntegrityError(f"published backup {ref}: chunk {chunk.index} is missing or has the wrong size in {self.store.url}")


def check_covers_stream(manifest: Manifest, expected: StreamEnd) -> None:
    lengths = [entry.length for entry in manifest.inputs]
    if lengths != list(expected.lengths):
        raise IntegrityError(f"the published manifest of {manifest.backup} covers {lengths} bytes per input, but the agent sent {expected.lengths}")


def stream_end_of(store: S3Store, ref: BackupRef) -> StreamEnd | None:
    info = store.head(stream_end_key(ref))
    return StreamEnd.from_bytes(store.get(stream_end_key(ref))) if info else None


def _releaser(pool: BufferPool, buffer: bytearray) -> Callable[[], None]:
    return lambda: pool.release(buffer)


def _resumable(exc: BaseException, ref: BackupRef) -> BaseException:
    """Tell the user the way back in, without changing what went wrong."""
    if isinstance(exc, KeyboardInterrupt):  # braid.cli.main prints the note after "interrupted"
        exc.add_note(f"what was uploaded stays staged: continue with 'braid backup --resume {ref}' and the same inputs")
    if isinstance(exc, BackupError) and "--resume" not in exc.message:
        exc.message = f"{exc.message}; what was uploaded stays staged: continue with 'braid backup --resume {ref}' and the same inputs"
        exc.args = (exc.message,)
    return exc


def cloud_engine(repository: Repository, args: Any) -> CloudEngine:
    """Build the engine from CLI arguments (braid.cli.main)."""
    return CloudEngine(
        repository,
        CloudOptions(
            concurrency=getattr(args, "concurrency", None) or 8,
            rate_limit=getattr(args, "rate_limit_bytes", None),
            fan_out=getattr(args, "fan_out", None) or DEFAULT_MAX_CONCURRENCY,
            wait=not getattr(args, "no_wait", False),
        ),
    )
