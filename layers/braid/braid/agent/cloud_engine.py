"""The agent's side of a cloud backup: stage raw parts, start the pipeline, watch it.

The host reads and uploads; it holds no key material and calls no KMS.
Step Functions runs the workers; Finalize publishes the manifest. The agent
exits successfully only when the manifest is published and it has checked,
with what it alone knows, that the manifest describes exactly the bytes it
sent: every input's length, and every chunk present with its recorded size.

The engine takes ports: the repository's store, its MultipartStore and the
pipeline's Executions (braid.adapters.aws.wiring builds them for S3 and SFN).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from braid.agent.limits import check_worker_chunk_size, default_concurrency
from braid.agent.parent_wait import await_parent
from braid.agent.published import check_covers_stream, same_inputs
from braid.agent.staging_sink import StagingSink
from braid.agent.uploader import StagingUpload
from braid.agent.wake import PipelineWaker
from braid.agent.watch import WATCH_INTERVAL_SECONDS, ExecutionWatch, PipelineStopped
from braid.engine.driver import after_stream, drive, pool_size
from braid.engine.lease import BackupLease
from braid.engine.port import BackupRequest
from braid.engine.stream import expected_bytes, expected_chunks
from braid.errors import BackupError, EmptyStreamError, ExecutionError, IntegrityError, NotFoundError, ProducerError, UsageError
from braid.format.ids import BackupRef
from braid.format.layout import data_prefix
from braid.format.lease import heartbeat_seconds
from braid.format.repository import Repository
from braid.format.staging import StagingArea, StreamEnd
from braid.format.staging.keys import agent_lease_key
from braid.pipeline.execution_input import DEFAULT_MAX_CONCURRENCY, DEFAULT_STALL_SECONDS, ExecutionInput
from braid.pipeline.policies import Policies
from braid.ports.executions import Executions, ExecutionStatus
from braid.ports.multipart import MultipartStore, UploadGoneError
from braid.ports.progress import PhaseReporter, ProgressFn
from braid.ports.progress_relay import ProgressRelay

if TYPE_CHECKING:
    from braid.format.manifest import Manifest
    from braid.format.staging.rounds import Round

# How long an agent that abandoned its stream waits for the pipeline to fail
# and remove the staging (one planner poll and Cleanup, normally seconds).
ABANDON_WAIT_SECONDS = 120.0


@dataclass(frozen=True)
class CloudOptions:
    concurrency: int | None = None  # chunks in flight; None: braid.agent.limits.default_concurrency for the inputs
    rate_limit: float | None = None
    fan_out: int = DEFAULT_MAX_CONCURRENCY
    wait: bool = True
    poll_seconds: float = 2.0
    watch_seconds: float = WATCH_INTERVAL_SECONDS  # while uploading: how often the agent looks at its execution
    # No upload progress (a new segment, a renewed lease) for this long and the pipeline declares the agent dead.
    stall_seconds: int = DEFAULT_STALL_SECONDS
    # The part ramp policy (braid.agent.limits.default_ramp_parts): a new upload's first segment starts with one-chunk
    # parts so a short stream fills the pipe. Off (--no-part-ramp): every part full-size; the session records 0.
    part_ramp: bool = True
    policies: Policies = Policies()  # the pipeline's optimisations (--no-policy NAME), in the execution input

    @classmethod
    def from_cli(cls, args: Any) -> CloudOptions:
        """From `braid backup`/`status` arguments; what a command does not take keeps its default."""
        return cls(
            concurrency=getattr(args, "concurrency", None),
            rate_limit=getattr(args, "rate_limit_bytes", None),
            fan_out=getattr(args, "fan_out", None) or DEFAULT_MAX_CONCURRENCY,
            wait=not getattr(args, "no_wait", False),
            stall_seconds=getattr(args, "stall_timeout", None) or DEFAULT_STALL_SECONDS,
            part_ramp=not getattr(args, "no_part_ramp", False),
            policies=Policies.without(getattr(args, "no_policy", None) or []),
        )


class CloudEngine:
    name = "stepfunctions"

    def __init__(
        self,
        repository: Repository,
        options: CloudOptions,
        *,
        uploads: MultipartStore,
        executions: Executions,
        prefix: str,
        retries: ProgressRelay | None = None,
        requests: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        """`prefix`: the repository's key prefix in its bucket, which each execution's
        input gives the pipeline. `retries`: where the clients behind the ports report
        their retries; each run points it at that run's progress. `requests`: what the
        store's client has sent so far, the agent's usage in the stream-end record."""
        self.repository = repository
        self.store = repository.store
        self.options = options
        self.uploads = uploads
        self.pipeline = executions
        self.prefix = prefix
        self.retries = retries or ProgressRelay()
        self.requests = requests
        self._rounds: dict[str, list[Round]] = {}  # per backup: plan rounds read so far (written once, never changed)
        self._resumed: dict[str, str] = {}  # per backup: the nonce of the resume request this agent wrote

    def _execution_input(self, ref: BackupRef) -> dict[str, Any]:
        o = self.options
        return ExecutionInput(str(ref), self.prefix, o.fan_out, stall_seconds=o.stall_seconds, policies=o.policies).to_json()

    # -- backup ---------------------------------------------------------------

    def run(self, request: BackupRequest, progress: ProgressFn) -> Manifest | None:
        """Stage the inputs and start the pipeline; wait for it unless told not to."""
        for source in request.sources:
            source.check()
        ref = request.ref
        self._report_retries(ref, progress)
        report = PhaseReporter(progress, str(ref))
        area = StagingArea(self.store, ref)
        labels = [s.label for s in request.sources] or list(request.input_labels)
        concurrency = self.options.concurrency or default_concurrency(len(labels))  # --concurrency, or the default for the inputs
        upload_options: dict[str, Any] = {
            "concurrency": concurrency,
            "rate_limit": self.options.rate_limit,
            "progress": lambda snapshot: report(upload_event(snapshot)),
            "requests": self.requests,
        }
        if request.resume:
            try:
                upload = StagingUpload.resume(area, self.uploads, inputs=labels, **upload_options)
            except NotFoundError as missing:
                # No staging: the pipeline may have finished while the agent was gone
                # (killed while it waited); then its outcome is the answer, not "start anew".
                # Still running without staging, it is past the upload: only Finalize
                # (publishing) and Cleanup remove the session, so wait for which it was.
                try:
                    status = self.pipeline.describe(ref)
                except BackupError:
                    raise missing from None
                if not status.done:
                    return self.wait(ref, progress)
                return same_inputs(self.outcome(ref, status), request.sources)
        else:
            check_worker_chunk_size(request.chunk_size)
            upload = StagingUpload.start(
                area,
                self.uploads,
                inputs=labels,
                chunk_size=request.chunk_size,
                level=request.level,
                repository_id=self.repository.config.id,
                ramp_parts=None if self.options.part_ramp else 0,
                lineage=request.lineage,
                parent_values=list(request.parent_values),
                **upload_options,
            )
        # The backup exists from here on: name it now, not at the end, so that after a crash
        # (the host's, the network's, a SIGKILL) the user has the NAME@ID that --resume needs.
        progress({"event": "started", "backup": str(ref), "resumed": request.resume, "resumable": request.resumable})
        sources = list(request.sources)
        report.phase("uploading", total_bytes=expected_bytes(sources), total_chunks=expected_chunks(sources, upload.chunk_size))
        # Start the pipeline as soon as the session exists: it fans out each segment as the agent completes it, while later ones still upload.
        self.pipeline.start(ref, self._execution_input(ref))
        # The pipeline sleeps while the stream arrives slowly; the agent wakes it when what it waits for is recorded.
        waker = PipelineWaker(area, self.pipeline, upload.recorded_chunks, lambda: upload.end_written)
        upload.on_recorded = waker.poke
        # Staged completely before the interruption and not held: the pipeline needs nothing more from this
        # agent, and anything it wrote now could land after Finalize removed the staging, and stay there.
        finished_upload = upload.stream_end is not None and area.read_hold() is None
        if request.resume and not finished_upload:
            # A held backup (workers kept failing) waits for this: the pipeline plans its unfinished items again, and only those (braid.pipeline.replan).
            nonce = secrets.token_hex(8)
            area.request_resume(nonce)
            self._resumed[str(ref)] = nonce
        try:
            # The lease shows retention that this upload is alive between completed segments (S3 lists nothing for parts in progress).
            watch = ExecutionWatch(ref, self.pipeline.describe, self.held_message, upload.stop, self.options.watch_seconds)
            # Renewed several times per stall window: it is the upload's progress to the planner.
            heartbeat = heartbeat_seconds(self.options.stall_seconds)

            def lease_wanted(idle: float) -> bool:  # not once the execution failed; after a long gap (SIGSTOP), look first
                return watch.stopped_with is None and (idle < 2 * heartbeat or watch.check() is None)

            lease = BackupLease(self.store, ref, heartbeat, key=agent_lease_key(ref), remove_on_exit=False, wanted=lease_wanted)
            with contextlib.nullcontext() if finished_upload else lease, watch:
                sources = list(request.sources)
                if request.lineage.is_incremental:  # Prepare opens the parent's chain first (braid.agent.parent_wait)
                    sources = await_parent(area, self.pipeline, request, report, poll_seconds=self.options.poll_seconds, watch_seconds=self.options.watch_seconds)
                # upload.chunk_size: a resumed upload keeps the session's.
                stream = drive(
                    sources,
                    StagingSink(upload),
                    buffers=pool_size(len(request.sources), concurrency + 1),  # memory: (inputs + concurrency + 1) chunks
                    chunk_size=upload.chunk_size,
                    backup=str(ref),
                    open_timeout=request.open_timeout,
                    progress=report,
                    gate=request.gate,
                    # A -X none backup's WAL, archived or staged; then what the stream carried, staged for Finalize.
                    on_captured=after_stream(request.wal_gate, area.write_captured),
                )
        except PipelineStopped:
            raise  # the pipeline gave the backup up and removes its staging: nothing to resume or abandon
        except UploadGoneError as exc:
            # Its staging was aborted under it: normally the pipeline gave the backup up, and its
            # cause (a stall, a failure) is what the user needs, not that a part found no upload.
            stopped = watch.stopped_with or watch.check()
            if stopped is not None:
                raise stopped from None
            raise exc from None  # nothing staged is left to resume: no --resume hint
        except BaseException as exc:
            if request.resumable and not isinstance(exc, (ProducerError, EmptyStreamError)):
                _resumable(exc, ref)  # adds the way back in to the error itself
                raise
            # The gate refused the stream, or it cannot be read again: there is
            # nothing to resume, so the pipeline must not wait for more.
            self._abandon(upload, ref, exc, report, waker)
            raise
        stream_end = stream.outcome
        progress(
            {
                "event": "stream-end",
                "backup": str(ref),
                "phase": "uploading",
                "bytes": sum(stream_end.lengths),
                "bytes_read": sum(stream_end.lengths),
                "chunks": stream.chunks,
                "parts_uploaded": upload.parts_uploaded,
                "parts_skipped": upload.parts_skipped,  # already in S3 (--resume)
                "max_buffers_in_flight": stream.max_buffers_in_flight,
            }
        )
        if not self.options.wait:
            waker.linger()  # a sleep the planner began as the stream ended: its token is written a moment later
            return None
        return self.wait(ref, progress, expected=stream_end, total_chunks=stream.chunks, waker=waker)

    def _abandon(self, upload: StagingUpload, ref: BackupRef, exc: BaseException, progress: ProgressFn, waker: PipelineWaker) -> None:
        """Tell the pipeline the stream will never end (it fails at its next poll and removes the staging).

        Unless interrupted, or told not to wait, wait for that, so that when
        the agent exits nothing of the backup is left. A failure to tell is
        added to the error: the pipeline then stops only at its stall timeout.
        """
        reason = "the agent was interrupted" if isinstance(exc, KeyboardInterrupt) else (str(exc) or type(exc).__name__)
        try:
            upload.abandon(reason)
        except BackupError as failure:
            if isinstance(exc, BackupError):
                exc.message = f"{exc.message}; telling the pipeline failed too ({failure}): it stops and removes the staging at its stall timeout"
                exc.args = (exc.message,)
            return
        progress({"event": "abandoned", "backup": str(ref), "reason": reason})
        if isinstance(exc, KeyboardInterrupt) or not self.options.wait:
            return
        deadline = time.monotonic() + ABANDON_WAIT_SECONDS
        while time.monotonic() < deadline:
            try:
                if self.pipeline.describe(ref).done:
                    return
            except BackupError:
                return  # only waiting for tidiness: the backup has failed either way
            waker.poke()  # a sleeping planner learns of the abandon when it runs
            time.sleep(self.options.poll_seconds)

    # -- following an execution ------------------------------------------------

    def wait(
        self, ref: BackupRef, progress: ProgressFn, *, expected: StreamEnd | None = None, total_chunks: int | None = None,
        waker: PipelineWaker | None = None,
    ) -> Manifest:
        """Follow the execution to its end; `total_chunks` (when known) makes the processing phase a percentage.
        `waker`: this upload's (braid.agent.wake), poked at every poll in case the planner slept as the stream ended.

        Every `poll_seconds` the agent reads its staging (S3); it asks Step Functions (DescribeExecution, throttled
        per account: braid.agent.watch) only every `watch_seconds`, or at every poll once the staging session is
        gone, which Finalize and Cleanup remove as an execution ends. So a finished backup is seen within a poll
        and an execution that ended any other way within `watch_seconds`."""
        self._report_retries(ref, progress)
        report = PhaseReporter(progress, str(ref))
        report.phase("processing", total_bytes=None if expected is None else sum(expected.lengths), total_chunks=total_chunks)
        delay = self.options.poll_seconds
        last_count = -1
        area = StagingArea(self.store, ref)
        described = -float("inf")
        while True:
            if time.monotonic() - described >= self.options.watch_seconds or not area.session_staged():
                status, described = self.pipeline.describe(ref), time.monotonic()
                if status.done:
                    break
            if waker is not None:
                waker.poke()
            self.check_not_held(ref)
            count = self.chunks_processed(ref)
            if count is not None and count != last_count:
                if total_chunks is not None and count >= total_chunks and report.current != "finalizing":
                    report.phase("finalizing", total_chunks=total_chunks)  # every chunk processed: Finalize writes the manifest
                report({"event": "status", "backup": str(ref), "status": status.status, "chunks": count, "chunks_done": count})
                last_count = count
            time.sleep(delay)
        if report.current != "finalizing" and status.status == "SUCCEEDED":
            report.phase("finalizing", total_chunks=total_chunks)  # the agent checks the published manifest against what it sent
        return self.outcome(ref, status, expected)

    def resume_staged(self, ref: BackupRef, progress: ProgressFn) -> Manifest:
        """`--resume` of a command's backup: the command cannot make the same stream again, so only a
        stream staged whole (its stream-end record written) can finish; a held one is released for it.
        Otherwise UsageError, saying so and how to start again."""
        area = StagingArea(self.store, ref)
        try:
            area.read_session()
        except NotFoundError as missing:
            try:
                status = self.pipeline.describe(ref)  # finished while the agent was gone: its outcome is the answer
            except BackupError:
                raise missing from None
            return self.wait(ref, progress) if not status.done else self.outcome(ref, status)
        end = area.read_stream_end()
        if end is None or end.abandoned is not None:
            raise UsageError(
                f"{ref} cannot be resumed: its command's stream was not staged whole"
                f" ({'it was abandoned' if end is not None else 'the stream ended before every byte was uploaded'}),"
                f" and a command makes a new stream each run; start a new backup: braid backup --name {ref.name} -- COMMAND"
            )
        progress({"event": "started", "backup": str(ref), "resumed": True, "resumable": False})
        if area.read_hold() is not None:  # the pipeline plans its unfinished items again (braid.pipeline.replan)
            nonce = secrets.token_hex(8)
            area.request_resume(nonce)
            self._resumed[str(ref)] = nonce
        self.pipeline.start(ref, self._execution_input(ref))
        return self.wait(ref, progress, expected=end)

    def abandon_held(self, ref: BackupRef, progress: ProgressFn) -> None:
        """`braid backup --abandon NAME@ID`: give a held backup up now. The abandoned stream-end record fails the
        pipeline at its next look (StreamAbandonedError), and its Cleanup removes every staged object, version and
        delete marker; waits for that end. UsageError when the backup is not held (resume or wait for it instead)."""
        area = StagingArea(self.store, ref)
        area.read_session()  # NotFoundError: nothing staged
        if area.read_hold() is None:
            raise UsageError(f"{ref} is not held: --abandon gives up a held backup; follow a running one with 'braid status {ref}'")
        end = area.read_stream_end()
        reason = f"abandoned with 'braid backup --abandon {ref}'"
        area.write_stream_end(StreamEnd(end.lengths, end.segments, reason) if end is not None else StreamEnd([], [], reason))
        progress({"event": "abandoned", "backup": str(ref), "reason": reason})
        waker = PipelineWaker(area, self.pipeline, lambda: 0, lambda: True)
        while not self.pipeline.describe(ref).done:
            waker.poke()  # a sleeping planner learns of the abandon when it runs
            time.sleep(self.options.poll_seconds)

    def check_not_held(self, ref: BackupRef) -> None:
        """Stop at once, with the worker's error and the way back in, when the pipeline holds the backup."""
        message = self.held_message(ref)
        if message is not None:
            raise ExecutionError(message)

    def held_message(self, ref: BackupRef) -> str | None:
        """What to tell a person when the pipeline holds the backup (braid.pipeline.replan), else None.

        A hold written before this agent's own resume request is stale (the
        planner is about to release it); one written after it is real."""
        try:
            hold = StagingArea(self.store, ref).read_hold()
        except BackupError:
            return None  # progress is best effort; the execution's own outcome still decides
        if hold is None:
            return None
        mine = self._resumed.get(str(ref))
        if mine is not None and hold.released_by != mine:
            return None
        why = f"workers kept failing on {hold.items} map item(s) ({hold.cause})" if hold.items else hold.cause
        return (
            f"backup {ref} is held: {why}. Nothing finished is lost:"
            f" its stored chunks and staging are kept until {hold.until}; fix the cause, then finish it with"
            f" 'braid backup --resume {ref}' and the same inputs (only the unfinished chunks are processed)"
        )

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
        Each poll LISTs rounds and results and GETs only the rounds it has
        not read yet.
        """
        try:
            area = StagingArea(self.store, ref)
            rounds = self._rounds[str(ref)] = area.read_rounds(self._rounds.get(str(ref)))
            return area.processed_chunks(rounds)
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

    def staged_stream_end(self, ref: BackupRef) -> StreamEnd | None:
        """What the agent recorded it sent (None before every input ended, or once staging is gone)."""
        return StagingArea(self.store, ref).read_stream_end()

    def _report_retries(self, ref: BackupRef, progress: ProgressFn) -> None:
        """The clients' retries ("SlowDown, retrying in 3.2 s") go to this backup's progress."""
        self.retries.send_to(lambda event: progress({**event, "backup": str(ref)}))

    def check_chunks_listed(self, manifest: Manifest) -> None:
        """Every chunk present with its recorded size: one LIST per 1,000 chunks, no key needed."""
        from braid.format.stored import stored_objects  # once published: not a --no-wait run's
        ref = BackupRef.parse(manifest.backup)
        sizes = {info.key: info.size for info in self.store.list(data_prefix(ref))}
        for stored in stored_objects(manifest):
            if sizes.get(stored.key) != stored.size:
                raise IntegrityError(f"published backup {ref}: {stored.label} is missing or has the wrong size in {self.store.url}")


def upload_event(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The uploader's counters as an `upload` event: `bytes` and `chunks` staged so far, as every engine counts them."""
    counters = {k: v for k, v in snapshot.items() if k != "phase"}
    staged = {"bytes": counters["bytes_uploaded"] + counters["bytes_skipped"], "chunks": counters.pop("chunks")}  # a part holds several chunks
    return {"event": "upload", **staged, **counters}


def _resumable(exc: BaseException, ref: BackupRef) -> BaseException:
    """Tell the user the way back in, without changing what went wrong."""
    if isinstance(exc, KeyboardInterrupt):  # braid.cli.main prints the note after "interrupted"
        exc.add_note(f"what was uploaded stays staged: continue with 'braid backup --resume {ref}' and the same inputs")
    if isinstance(exc, BackupError) and "--resume" not in exc.message:
        exc.message = f"{exc.message}; what was uploaded stays staged: continue with 'braid backup --resume {ref}' and the same inputs"
        exc.args = (exc.message,)
    return exc
