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
first segment is the session's `ramp_parts` one-chunk parts (the whole
segment at the defaults, braid.agent.segments.PartLayout), so a stream of up
to a segment has --concurrency parts in flight throughout; the larger parts
follow from the same buffers.

Resume: braid.agent.resume reads what the store holds; re-read chunks that
match a stored part are skipped, completed segments are checked as a whole.

Thread use: one reader thread calls `submit`/`end_input` (several may, it is
thread-safe); `concurrency` pool threads upload; `finish` waits for all.
What the pool threads do (send parts, complete segments) is StagingUpload's
base, PartSender (braid.agent.part_sender); this module is the reader's side.
"""

from __future__ import annotations

from typing import Any

from braid.agent.limits import (
    DEFAULT_CONCURRENCY,
    connection_rate,
    default_part_chunks,
    default_ramp_parts,
    default_segment_chunks,
    part_grouping_on,
)
from braid.agent.part_sender import Cancelled, PartSender, Release
from braid.agent.resume import load_staged, session_to_resume
from braid.errors import InputError, UsageError
from braid.format.chain import Lineage
from braid.format.staging import SessionRecord, StagingArea, StreamEnd
from braid.format.timestamps import utc_now
from braid.format.usage import Usage
from braid.ports.multipart import MultipartStore

STREAM_END_PUT = "s3:PutObject"  # the request that writes the stream-end record


class StagingUpload(PartSender):
    """Uploads one backup's inputs into its staging area; see the module docstring."""

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
        lineage: Lineage | None = None,
        parent_values: list[str] | None = None,
        **options: Any,
    ) -> StagingUpload:
        """Begin a new backup's staging: writes the session record first, create-only.

        `repository_id` is the repository config's id: the pipeline checks the
        session against it and binds the data key and manifest to it.
        `part_chunks` defaults to what the inputs and --concurrency allow
        (braid.agent.limits.default_part_chunks, at the rate one connection
        carries on the path to the store, when `uploads` has measured it; one
        chunk with the part-grouping policy off); the session keeps it, so a
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
            rate = connection_rate(uploads.path_sample())
            part_chunks = default_part_chunks(chunk_size, len(inputs), concurrency, rate) if part_grouping_on() else 1
            if ramp_parts is None:
                ramp_parts = default_ramp_parts(part_chunks, segment_chunks)
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
            lineage=lineage or Lineage(),
            parent_values=list(parent_values or []),
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
        self._fail(error or Cancelled())
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
