"""PartSender: the store side of the agent's upload (braid.agent.uploader), the base of StagingUpload.

It holds one upload's state and its pool: a part is sent (or skipped, when
a resumed upload finds it stored with the same CRC) once its chunks are
read, its buffers go back to the reader as soon as it is stored, and a
segment whose every chunk is stored is completed and its record written.
The first error a task raises is kept for the reader (`_raise_if_failed`);
later tasks are cancelled and their buffers released.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from braid.agent.limits import DEFAULT_CONCURRENCY, MIN_PART_SIZE, check_part_chunks, check_sizes
from braid.agent.resume import part_matches
from braid.agent.segments import Chunk, InputState, Part, PartLayout, Segment, combined_crc, complete_segment_upload
from braid.agent.throttle import TokenBucket
from braid.errors import StorageError, UsageError
from braid.format.checksum import crc64nvme, encode_crc64nvme
from braid.format.staging import SessionRecord, StagingArea, StreamEnd, segment_key
from braid.ports.multipart import MultipartStore
from braid.ports.progress import ProgressFn

Release = Callable[[], None]


class Cancelled(Exception):
    """A task skipped because the upload already failed."""


class PartSender:
    """The state of one upload and its pool tasks: parts sent, segments completed and recorded, the first failure kept."""

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
        """Prefer StagingUpload.start or .resume; this wires an already-read session.

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

    def _segment(self, input_index: int, number: int) -> Segment:
        state = self._inputs[input_index]
        segment = state.segments.get(number)
        if segment is None:
            segment = Segment(input_index, number, segment_key(self.ref, input_index, number))
            state.segments[number] = segment
        return segment


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
                raise Cancelled()
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
                raise Cancelled()
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
                raise Cancelled()
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

    # ---------------------------------------------------------------- plumbing

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None and not isinstance(exc, Cancelled):
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
