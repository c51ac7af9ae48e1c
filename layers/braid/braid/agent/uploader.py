"""The agent's uploader: raw chunks into multipart staging segments.

The host only moves bytes. The chunks the reader cuts go, `part_chunks` at a
time, into the parts of a multipart upload (a "segment", see
braid.format.staging); a new segment starts every `segment_chunks` chunks, so
a stream of any length fits S3's 10,000-part limit, and the pipeline can fan
out a finished segment while later ones still upload. The agent holds no key
and calls no KMS. Parts of several chunks (128-256 MiB of 64 MiB chunks) cut
the UploadPart requests S3 bills by two to four; the worker still reads one
chunk per ranged GET, by byte offset, so only the agent knows how chunks were
grouped.

It takes ports only (StagingArea for the records, a MultipartStore for the
parts), so it runs against S3, moto or an in-memory fake alike. Retries are
the store client's, reported to progress there; there is no loop here.

Integrity: each chunk's CRC64NVME is computed as its part is sent (one pass
over its bytes) and recorded per chunk for the worker; every part carries the
CRC combined from its chunks', which S3 verifies; the segment's full-object
CRC64NVME (braid.agent.segments) goes with CompleteMultipartUpload, so S3
checks the whole object too, and where a store does not return the checksum
it computed, HEAD tells and we compare.

Memory: `--concurrency` counts chunks in flight, whether waiting for the rest
of their part or being sent: `submit` blocks while (concurrency + 2) are, and
a part's buffers go back to the reader (their `release` callbacks) as soon as
the part is stored, so memory is bounded whatever the stream length. A part
is sent from its chunks' own buffers (never joined), once all are read (its
segment's upload is opened meanwhile, at the segment's first chunk, so the
part goes out without waiting one more round trip);
`part_chunks` is chosen so that every input's unfinished part and three parts
being sent fit (braid.agent.limits.default_part_chunks; one is enough never to
deadlock, three keep the upload as fast as one chunk per part). Each input's
first segment starts with the session's `ramp_parts` one-chunk parts
(braid.agent.segments.PartLayout), so a short stream still has --concurrency
parts in flight; the larger parts follow from the same buffers.

Resume: braid.agent.resume reads what the store holds; re-read chunks that
match a stored part are skipped, completed segments are checked as a whole.

Thread use: one reader thread calls `submit`/`end_input` (several may, it is
thread-safe); `concurrency` pool threads upload; `finish` waits for all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from braid.agent.limits import (
    DEFAULT_CONCURRENCY,
    MIN_PART_SIZE,
    check_part_chunks,
    check_sizes,
    default_part_chunks,
    default_ramp_parts,
    default_segment_chunks,
)
from braid.agent.resume import load_staged, part_matches, session_to_resume
from braid.agent.segments import Chunk, InputState, Part, PartLayout, Segment, combined_crc, complete_segment_upload
from braid.agent.throttle import TokenBucket
from braid.errors import InputError, StorageError, UsageError
from braid.format.checksum import crc64nvme, encode_crc64nvme
from braid.format.staging import SessionRecord, StagingArea, StreamEnd, segment_key
from braid.format.timestamps import utc_now
from braid.format.usage import Usage
from braid.ports.multipart import MultipartStore
from braid.ports.progress import ProgressFn

STREAM_END_PUT = "s3:PutObject"  # the request that writes the stream-end record

Release = Callable[[], None]


class _Cancelled(Exception):
    """A task skipped because the upload already failed."""


class StagingUpload:
    """Uploads one backup's inputs into its staging area; see the module docstring."""

    def __init__(
        self,
        area: StagingArea,
        uploads: MultipartStore,
        session: SessionRecord,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        rate_limit: float | None = None,
        progress: ProgressFn | None = None,
        min_part_size: int = MIN_PART_SIZE,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        requests: Callable[[], Mapping[str, int]] | None = None,
        recorded: Callable[[], object] | None = None,
    ) -> None:
        """Prefer `start` or `resume`; this wires an already-read session.

        `requests`: what the agent's process has sent to AWS so far (`service:Operation` -> attempts),
        recorded in the stream-end record as the agent's usage (braid.format.usage). `recorded`: called
        after each segment record and the stream-end (or abandon) record is written (the agent's
        PipelineWaker looks whether the sleeping pipeline waits for it, braid.agent.wake)."""
        if concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        check_sizes(session.chunk_size, session.segment_chunks, min_part_size, session.part_chunks)
        check_part_chunks(session.part_chunks, len(session.inputs), concurrency)
        self.area = area
        self.store = area.store
        self.uploads = uploads
        self.ref = area.ref
        self.session = session
        self.chunk_size = session.chunk_size
        self.segment_chunks = session.segment_chunks
        self.part_chunks = session.part_chunks
        # Each input's first segment starts with the session's one-chunk parts; the others do not.
        self._layouts = (PartLayout(session.part_chunks, session.ramp_parts), PartLayout(session.part_chunks))
        self.concurrency = concurrency
        self.max_in_flight = concurrency + 2
        self._requests = requests
        self.on_recorded = recorded
        self.end_written = False  # the stream-end (or abandon) record is in staging
        self._limiter = TokenBucket(rate_limit, clock=clock, sleep=sleep) if rate_limit else None
        self._progress = progress
        self._inputs = [InputState() for _ in session.inputs]
        self._lock = threading.Lock()
        self._progress_lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._slots = threading.Semaphore(self.max_in_flight)
        self._outstanding = 0  # pool tasks not yet finished
        self._failed = threading.Event()
        self._error: BaseException | None = None
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="braid-upload")
        self._closed = False
        self.stream_end: StreamEnd | None = None  # set when the stream was already complete
        # Observable counters (progress, tests).
        self.in_flight = 0
        self.peak_in_flight = 0
        self.bytes_uploaded = 0
        self.bytes_skipped = 0
        self.parts_uploaded = 0  # S3 parts
        self.parts_skipped = 0
        self.chunks_staged = 0  # chunks in parts uploaded or skipped
        self.segments_completed = 0

    # ------------------------------------------------------------------ set-up

    @classmethod
    def start(
        cls,
        area: StagingArea,
        uploads: MultipartStore,
        *,
        repository_id: str,
        inputs: list[str],
        chunk_size: int,
        level: int,
        segment_chunks: int | None = None,
        part_chunks: int | None = None,
        ramp_parts: int | None = None,
        **options: Any,
    ) -> StagingUpload:
        """Begin a new backup's staging: writes the session record first, create-only.

        `repository_id` is the repository config's id: the pipeline checks the
        session against it and binds the data key and manifest to it.
        `part_chunks` defaults to what the inputs and --concurrency allow
        (braid.agent.limits.default_part_chunks); the session keeps it, so a
        resumed upload sends its parts as the first run did. `ramp_parts`
        (one-chunk parts first, braid.agent.limits.default_ramp_parts) is
        defaulted only with `part_chunks`: a caller that names the part size
        gets exactly that layout unless it asks for a ramp too.
        """
        if not inputs:
            raise UsageError("a backup needs at least one input")
        concurrency = options.get("concurrency", DEFAULT_CONCURRENCY)
        segment_chunks = segment_chunks or default_segment_chunks(chunk_size)
        if part_chunks is None:
            part_chunks = default_part_chunks(chunk_size, len(inputs), concurrency)
            if ramp_parts is None:
                ramp_parts = default_ramp_parts(part_chunks, concurrency, segment_chunks)
        session = SessionRecord(
            backup=str(area.ref),
            repository=repository_id,
            chunk_size=chunk_size,
            segment_chunks=segment_chunks,
            level=level,
            inputs=list(inputs),
            created=utc_now(),
            part_chunks=part_chunks,
            ramp_parts=ramp_parts or 0,
        )
        upload = cls(area, uploads, session, **options)
        try:
            area.write_session(session)  # AlreadyExistsError: "continue it with --resume"
        except BaseException:
            upload._pool.shutdown()
            raise
        return upload

    @classmethod
    def resume(cls, area: StagingArea, uploads: MultipartStore, *, inputs: list[str] | None = None, **options: Any) -> StagingUpload:
        """Continue an interrupted upload from what the store holds (nothing from the host).

        Feed it the re-read inputs from their first byte, as for `start`.
        If the upload had already finished (`stream_end` is set) there is
        nothing to send: skip reading and go on to the pipeline.
        """
        session = session_to_resume(area)
        if inputs is not None and len(inputs) != len(session.inputs):
            raise UsageError(
                f"{area.ref} was started with {len(session.inputs)} input(s) ({', '.join(session.inputs)}); "
                "resume it with the same inputs in the same order"
            )
        upload = cls(area, uploads, session, **options)
        try:
            upload.stream_end = load_staged(area, uploads, session, upload._segment)
            if upload.stream_end is not None and upload.stream_end.abandoned is not None:
                raise UsageError(f"{area.ref} was abandoned ({upload.stream_end.abandoned}) and cannot be resumed: start a new backup")
        except BaseException:
            upload._pool.shutdown()
            raise
        return upload

    def _segment(self, input_index: int, number: int) -> Segment:
        state = self._inputs[input_index]
        segment = state.segments.get(number)
        if segment is None:
            segment = Segment(input_index, number, segment_key(self.ref, input_index, number))
            state.segments[number] = segment
        return segment

    # ------------------------------------------------------------ reader side

    def submit(self, input_index: int, number: int, data: memoryview, release: Release) -> None:
        """Hand over chunk `number` (0-based, in order) of input `input_index`.

        Blocks while (concurrency + 2) chunks are in flight. `release` is
        called exactly once, from any thread, when the buffer is no longer
        needed: after its part is stored, skipped, or abandoned. A chunk
        that completes its part (or its segment) sends the part. Raises the
        upload's error once it has failed (after releasing the buffer).
        """
        try:
            self._check_chunk(input_index, number, data)
            while not self._slots.acquire(timeout=0.1):
                self._raise_if_failed()
            self._raise_if_failed_releasing_slot()
        except BaseException:
            release()
            raise
        with self._lock:
            if self._failed.is_set():  # failed since the check above: _drop_pending may have run already
                late = True
            else:
                late = False
                self._accept(input_index, number, data, release)
        if late:
            self._slots.release()
            release()
            self._raise_if_failed()

    def _accept(self, input_index: int, number: int, data: memoryview, release: Release) -> None:
        """Under the lock: count the chunk in, add it to its part, and send the part if the chunk completes it."""
        state = self._inputs[input_index]
        state.next_number = number + 1
        state.length += len(data)
        state.short_seen = len(data) < self.chunk_size
        segment = self._segment(input_index, number // self.segment_chunks)
        segment.submitted += 1
        if segment.submitted == self.segment_chunks:
            segment.expected = self.segment_chunks
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        part_number, part_size = self._layout(segment).part_of(number % self.segment_chunks)
        segment.pending.setdefault(part_number, []).append((data, release))
        if len(segment.pending[part_number]) == part_size or segment.submitted == segment.expected:
            self._pool.submit(self._part_task, segment, part_number, self._take_part(segment, part_number))
        elif segment.submitted == 1 and self._needs_upload(segment):
            # The segment's first part waits for its other chunks: open its upload
            # meanwhile, so the part's UploadPart starts as soon as they are read,
            # not one CreateMultipartUpload round trip later.
            self._outstanding += 1
            self._pool.submit(self._open_task, segment)

    def end_input(self, input_index: int, length: int) -> None:
        """Input `input_index` ended after `length` bytes: its last segment can complete."""
        with self._lock:
            state = self._inputs[input_index]
            if state.ended:
                raise ValueError(f"input {input_index} ended twice")
            if length != state.length:
                raise ValueError(f"input {input_index} ended at {length} bytes, but {state.length} were submitted")
            state.ended = True
            last = state.segments.get((state.next_number - 1) // self.segment_chunks) if state.next_number else None
            if last is not None and last.expected is None:
                last.expected = last.submitted
            # The input's last part, if it ended before filling it.
            tail = [(n, self._take_part(last, n)) for n in sorted(last.pending)] if last is not None else []
            ready = self._take_ready(last) if last is not None else None
        for part_number, chunks in tail:
            self._pool.submit(self._part_task, last, part_number, chunks)  # type: ignore[arg-type]
        if ready is not None:
            self._schedule_completion(ready)

    def _check_chunk(self, input_index: int, number: int, data: memoryview) -> None:
        self._raise_if_failed()
        if self._closed:
            raise ValueError("submit after finish")
        if not 0 <= input_index < len(self._inputs):
            raise ValueError(f"no input {input_index}: the session has {len(self._inputs)}")
        self._inputs[input_index].check_next(input_index, number, len(data), self.chunk_size)

    # --------------------------------------------------------------- uploading

    def _layout(self, segment: Segment) -> PartLayout:
        return self._layouts[0] if segment.number == 0 else self._layouts[1]

    def _take_part(self, segment: Segment, part_number: int) -> list[Chunk]:
        """Under the lock: a part's chunks, handed from `pending` to a pool task (counted as outstanding)."""
        self._outstanding += 1
        return segment.pending.pop(part_number)

    def _part_task(self, segment: Segment, part_number: int, chunks: list[Chunk]) -> None:
        ready: Segment | None = None
        try:
            if self._failed.is_set():
                raise _Cancelled()
            views = [data for data, _ in chunks]
            pieces = [Part(None, crc64nvme(data), len(data)) for data in views]  # each chunk's CRC, as it is read for sending
            crc, size = combined_crc(pieces), sum(p.size for p in pieces)
            etag: str | None = None
            existing = segment.existing.get(part_number)
            if segment.record is not None or segment.stored is not None:
                skipped = True  # completed before; checked as a whole when it closes
            elif existing is not None and part_matches(existing, views, crc):
                skipped, etag = True, existing.etag
            else:
                skipped = False
                upload_id = self._ensure_upload(segment)
                if self._limiter is not None:
                    self._limiter.take(size)
                etag = self.uploads.upload_part(segment.key, upload_id, part_number, views, encode_crc64nvme(crc))
            with self._lock:
                segment.parts[part_number] = Part(etag, crc, size)
                first = self._layout(segment).first_chunk(part_number) + 1
                for offset, piece in enumerate(pieces):
                    segment.chunks[first + offset] = piece
                if skipped:
                    self.parts_skipped += 1
                    self.bytes_skipped += size
                else:
                    self.parts_uploaded += 1
                    self.bytes_uploaded += size
                self.chunks_staged += len(pieces)
                ready = self._take_ready(segment)
        except BaseException as exc:  # recorded; finish() raises it
            self._fail(exc)
        finally:
            self._release(chunks)
            self._report()
            if ready is not None:
                self._complete_quietly(ready)
            self._task_done()

    def _release(self, chunks: list[Chunk]) -> None:
        """Give the chunks' buffers back to the reader, and their slots to `submit`."""
        for _, release in chunks:
            try:
                release()
            except BaseException as exc:  # the reader's bug must not leak a slot
                self._fail(exc)
            with self._lock:
                self.in_flight -= 1
            self._slots.release()

    def _drop_pending(self) -> None:
        """After a failure: chunks still waiting for the rest of their part are never sent; free their buffers."""
        with self._lock:
            dropped = [chunk for state in self._inputs for segment in state.segments.values() for chunk in self._pop_all(segment)]
        self._release(dropped)

    @staticmethod
    def _pop_all(segment: Segment) -> list[Chunk]:
        chunks = [chunk for number in sorted(segment.pending) for chunk in segment.pending[number]]
        segment.pending.clear()
        return chunks

    @staticmethod
    def _needs_upload(segment: Segment) -> bool:
        """A segment with nothing stored of it (not completed, no open upload found on --resume) is sure to need one."""
        return segment.upload_id is None and segment.record is None and segment.stored is None and not segment.existing

    def _open_task(self, segment: Segment) -> None:
        try:
            if self._failed.is_set():
                raise _Cancelled()
            self._ensure_upload(segment)
        except BaseException as exc:  # recorded; finish() raises it
            self._fail(exc)
        finally:
            self._task_done()

    def _ensure_upload(self, segment: Segment) -> str:
        with segment.lock:
            if segment.upload_id is None:
                segment.upload_id = self.uploads.create_upload(segment.key)
            return segment.upload_id

    # -------------------------------------------------------------- completion

    def _take_ready(self, segment: Segment) -> Segment | None:
        """Under the lock: the segment, if it just became complete-able (once)."""
        if segment.completing or segment.expected is None or len(segment.chunks) != segment.expected:
            return None
        segment.completing = True
        return segment

    def _schedule_completion(self, segment: Segment) -> None:
        with self._lock:
            self._outstanding += 1

        def task() -> None:
            try:
                self._complete_quietly(segment)
            finally:
                self._task_done()

        self._pool.submit(task)

    def _complete_quietly(self, segment: Segment) -> None:
        try:
            if self._failed.is_set():
                raise _Cancelled()
            self._complete(segment)
            with self._lock:
                segment.done = True
                self.segments_completed += 1
            self._report()
        except BaseException as exc:
            self._fail(exc)

    def _complete(self, segment: Segment) -> None:
        built = segment.record_of(self.chunk_size, self.segment_chunks)
        segment.check_same_stream(built, self.session.inputs[segment.input_index])
        if segment.record is not None:
            return  # recorded before the interruption, and the re-read bytes match it
        if segment.stored is None:
            complete_segment_upload(self.uploads, self.store, segment, built)
        # Once the store holds the segment, its record is written even if
        # another part failed meanwhile: the pipeline may start on it, and a
        # resume then skips it.
        self.area.write_segment_record(built)
        with self._lock:
            segment.record = built
        if self.on_recorded is not None:
            self.on_recorded()

    def recorded_chunks(self) -> int:
        """Chunks in the segment records written so far, this run's and those before an interruption."""
        with self._lock:
            return sum(seg.record.chunks for state in self._inputs for seg in state.segments.values() if seg.record is not None)

    # ------------------------------------------------------------------ ending

    def finish(self) -> StreamEnd:
        """Wait for every part and segment, then write the stream-end record.

        Raises the first error; then no stream-end is written, completed
        segments stay recorded and in-progress uploads stay for --resume.
        """
        with self._lock:
            open_inputs = [i for i, s in enumerate(self._inputs) if not s.ended]
        if open_inputs and not self._failed.is_set():
            self.abort()
            raise ValueError(f"finish before inputs {open_inputs} ended")
        self._wait_idle()
        self._drop_pending()  # only after a failure can a part still wait for chunks
        self._shutdown()
        self._raise_if_failed()  # the first error, or "stopped" after abort()
        lengths = [state.length for state in self._inputs]
        counts = [-(-state.next_number // self.segment_chunks) for state in self._inputs]
        for index, state in enumerate(self._inputs):
            for number, segment in state.segments.items():
                if number >= counts[index] or not segment.done:
                    raise InputError(
                        f"input {self.session.inputs[index]} ended at {state.length} bytes, before segment {number} "
                        "that was uploaded before the interruption; --resume needs the same stream: start a new backup"
                    )
        end = StreamEnd(lengths=lengths, segments=counts, usage=self._usage())
        if self.stream_end is not None:
            if self.stream_end.lengths != end.lengths or self.stream_end.segments != end.segments:
                raise InputError(f"the re-read inputs of {self.ref} ({lengths} bytes) differ from the completed upload ({self.stream_end.lengths})")
            # Resumed after the upload had finished: the record is there already. Writing it again could
            # land after the pipeline published the backup and removed staging, leaving a stray record.
            self.end_written = True
            return self.stream_end
        self.area.write_stream_end(end)
        self.stream_end = end
        self.end_written = True
        if self.on_recorded is not None:
            self.on_recorded()
        return end

    def _usage(self) -> Usage | None:
        """The agent's requests so far and the stream-end record's own PUT, counted before it is made."""
        if self._requests is None:
            return None
        counts = dict(self._requests())
        counts[STREAM_END_PUT] = counts.get(STREAM_END_PUT, 0) + 1
        return Usage(requests=counts)

    def abort(self, error: BaseException | None = None) -> None:
        """Stop: queued parts are released unsent; what is in the store stays for --resume."""
        self._fail(error or _Cancelled())
        self._drop_pending()
        self._wait_idle()
        self._shutdown()

    def abandon(self, reason: str) -> None:
        """After `abort`, for a stream that can never complete (its producer failed, it was empty):
        a stream-end record saying why, which the planner turns into a failure now (braid.pipeline.plan)."""
        with self._lock:
            lengths = [state.length for state in self._inputs]
            counts = [-(-state.next_number // self.segment_chunks) for state in self._inputs]
        self.area.write_stream_end(StreamEnd(lengths=lengths, segments=counts, abandoned=reason))
        self.end_written = True
        if self.on_recorded is not None:
            self.on_recorded()

    def __enter__(self) -> StagingUpload:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.abort(exc)
        else:
            self._shutdown()

    # ---------------------------------------------------------------- plumbing

    def stop(self, exc: BaseException) -> None:
        """Stop the upload from outside (the pipeline gave the backup up): the reader gets `exc` at its next chunk."""
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None and not isinstance(exc, _Cancelled):
                self._error = exc
        self._failed.set()

    def _raise_if_failed(self) -> None:
        if self._failed.is_set():
            raise self._error or StorageError(f"the upload of {self.ref} was stopped")

    def _raise_if_failed_releasing_slot(self) -> None:
        if self._failed.is_set():
            self._slots.release()
            self._raise_if_failed()

    def _task_done(self) -> None:
        with self._lock:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._idle.notify_all()

    def _wait_idle(self) -> None:
        with self._lock:
            while self._outstanding:
                self._idle.wait()

    def _shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True)

    def _report(self) -> None:
        if self._progress is None:
            return
        with self._progress_lock:  # one call at a time, in order, never under the state lock
            with self._lock:
                snapshot = {
                    "phase": "upload",
                    "bytes_uploaded": self.bytes_uploaded,
                    "bytes_skipped": self.bytes_skipped,
                    "parts_uploaded": self.parts_uploaded,
                    "parts_skipped": self.parts_skipped,
                    "chunks": self.chunks_staged,
                    "segments_completed": self.segments_completed,
                }
            self._progress(snapshot)

    @property
    def error(self) -> BaseException | None:
        return self._error
