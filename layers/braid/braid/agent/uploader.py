"""The agent's uploader: raw chunks into S3 multipart staging segments.

The host only moves bytes. Each chunk the reader cuts becomes one part of a
multipart upload (a "segment", see braid.format.staging); a new segment
starts every `segment_parts` parts, so a stream of any length fits S3's
10,000-part limit, and the pipeline can fan out a finished segment while
later ones still upload. The agent holds no key and calls no KMS.

Integrity: every part carries its CRC64NVME, which S3 verifies; the segment's
full-object CRC64NVME is combined from the part CRCs in part order (CRCs
combine without re-reading the data) and sent with CompleteMultipartUpload
(ChecksumType FULL_OBJECT), so S3 checks the whole object too. Where a store
does not return the checksum it computed, we ask for it with HEAD and compare.

Memory: `submit` blocks while (concurrency + 2) chunks are in flight, and a
chunk's buffer goes back to the reader (its `release` callback) as soon as
the part is stored, so memory is bounded whatever the stream length.

Resume: everything needed lives in S3: the session record, the segment
records of completed segments, and the parts of in-progress multipart
uploads (ListMultipartUploads + ListParts). A resumed agent re-reads its
inputs from the start (the database tool restarts its stream), checks each
re-read chunk against what S3 holds (size and CRC64NVME), and uploads only
the parts that are missing or differ.

Thread use: one reader thread calls `submit`/`end_input` (several may, it is
thread-safe); `concurrency` pool threads upload; `finish` waits for all.
"""

from __future__ import annotations

import hashlib
import random
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from awscrt.checksums import combine_crc64nvme
from botocore.exceptions import BotoCoreError, ClientError

from braid.adapters.aws.s3 import S3Store, checksum_from_response, error_code, is_retryable, map_error, request_body
from braid.errors import AlreadyExistsError, InputError, NotFoundError, StorageError, UsageError
from braid.format.checksum import ALGORITHM, crc64nvme, encode_crc64nvme
from braid.format.ids import BackupRef
from braid.format.layout import staging_prefix
from braid.format.staging import (
    SegmentRecord,
    SessionRecord,
    StreamEnd,
    segment_key,
    segment_record_key,
    segment_records_prefix,
    session_key,
    stream_end_key,
)
from braid.format.timestamps import utc_now
from braid.ports.progress import ProgressFn
from braid.ports.store import ObjectInfo

MAX_PARTS = 10_000  # S3's limit per multipart upload
MIN_PART_SIZE = 5 * 1024**2  # S3's minimum for every part but the last
MAX_PART_SIZE = 5 * 1024**3
MAX_OBJECT_SIZE = 5 * 1024**4
SEGMENT_TARGET_BYTES = 2 * 1024**3

Release = Callable[[], None]

_SEGMENT_KEY = re.compile(r"in(\d+)/seg(\d{5})$")


def default_segment_parts(chunk_size: int) -> int:
    """Parts per segment: about 2 GiB, so the pipeline starts after the first 2 GiB.

    Smaller segments start the fan-out sooner but cost more records and
    CompleteMultipartUpload calls; 2 GiB keeps a TiB at ~512 segments. Any
    stream fits, as segments are unlimited; each stays within 10,000 parts.
    """
    return max(1, min(MAX_PARTS, -(-SEGMENT_TARGET_BYTES // chunk_size)))


@dataclass(frozen=True)
class RetryPolicy:
    """Our own per-request retries, on top of botocore's.

    botocore retries each call a few times; a long SlowDown episode outlasts
    that, and losing an hour-long backup to it is worse than waiting. Full
    jitter spreads the threads' retries so they do not hit S3 in step.
    """

    attempts: int = 6
    base: float = 0.5
    cap: float = 30.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.cap, self.base * 2**attempt))


class TokenBucket:
    """Bytes-per-second limit shared by every upload thread.

    A part reserves its bytes before it is sent; when the bucket runs into
    debt the caller sleeps until the debt is paid, so over any window longer
    than a few parts the rate stays at `rate`. `burst` bounds what may go out
    at once after an idle spell.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise UsageError("--rate-limit must be a positive number of bytes per second")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else rate / 4)
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.burst
        self._last = clock()
        self._lock = threading.Lock()

    def take(self, amount: int) -> float:
        """Reserve `amount` bytes, sleeping as long as the rate needs; returns the wait."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= amount
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait


@dataclass(frozen=True)
class ExistingPart:
    """A part already in S3 (ListParts) from before an interruption."""

    size: int
    etag: str
    crc64nvme: str | None  # base64, when S3 reports it

    def matches(self, data: memoryview, crc: int) -> bool:
        """Is this part exactly the re-read chunk?

        S3 reports each part's CRC64NVME when the upload was created with it.
        Without it (older S3-compatible stores, emulators) a plain-MD5 ETag
        still identifies the bytes; an ETag that is not an MD5 (SSE-KMS) and
        no checksum means we cannot tell, so the part is sent again.
        """
        if self.size != len(data):
            return False
        if self.crc64nvme is not None:
            return self.crc64nvme == encode_crc64nvme(crc)
        etag = self.etag.strip('"')
        if re.fullmatch(r"[0-9a-f]{32}", etag):
            return hashlib.md5(data, usedforsecurity=False).hexdigest() == etag
        return False


@dataclass
class _Part:
    etag: str | None
    crc: int
    size: int


@dataclass
class _Segment:
    input_index: int
    number: int
    key: str  # repository-relative
    record: SegmentRecord | None = None  # completed and recorded before an interruption
    stored: ObjectInfo | None = None  # completed but not recorded (interrupted in between)
    upload_id: str | None = None
    existing: dict[int, ExistingPart] = field(default_factory=dict)
    parts: dict[int, _Part] = field(default_factory=dict)
    submitted: int = 0
    expected: int | None = None  # known once the segment is full or its input ended
    completing: bool = False
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Input:
    next_number: int = 0
    length: int = 0
    short_seen: bool = False
    ended: bool = False
    segments: dict[int, _Segment] = field(default_factory=dict)


class _Cancelled(Exception):
    """A task skipped because the upload already failed."""


class _UploadGone(StorageError):
    """S3 no longer knows the multipart upload (NoSuchUpload)."""


class StagingUpload:
    """Uploads one backup's inputs into its staging area; see the module docstring."""

    def __init__(
        self,
        store: S3Store,
        ref: BackupRef,
        session: SessionRecord,
        *,
        concurrency: int = 8,
        rate_limit: float | None = None,
        progress: ProgressFn | None = None,
        retry: RetryPolicy = RetryPolicy(),
        min_part_size: int = MIN_PART_SIZE,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        """Prefer `start` or `resume`; this wires an already-read session."""
        if concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        _check_sizes(session.chunk_size, session.segment_parts, min_part_size)
        self.store = store
        self.client = store.client
        self.ref = ref
        self.session = session
        self.chunk_size = session.chunk_size
        self.segment_parts = session.segment_parts
        self.concurrency = concurrency
        self.max_in_flight = concurrency + 2
        self._limiter = TokenBucket(rate_limit, clock=clock, sleep=sleep) if rate_limit else None
        self._progress = progress
        self._retry = retry
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._inputs = [_Input() for _ in session.inputs]
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
        self.parts_uploaded = 0
        self.parts_skipped = 0
        self.segments_completed = 0

    # ------------------------------------------------------------------ set-up

    @classmethod
    def start(
        cls,
        store: S3Store,
        ref: BackupRef,
        *,
        repository_id: str,
        inputs: list[str],
        chunk_size: int,
        level: int,
        segment_parts: int | None = None,
        **options: Any,
    ) -> StagingUpload:
        """Begin a new backup's staging: writes the session record first, create-only.

        `repository_id` is the repository config's id: the pipeline checks the
        session against it and binds the data key and manifest to it.
        """
        if not inputs:
            raise UsageError("a backup needs at least one input")
        session = SessionRecord(
            backup=str(ref),
            repository=repository_id,
            chunk_size=chunk_size,
            segment_parts=segment_parts or default_segment_parts(chunk_size),
            level=level,
            inputs=list(inputs),
            created=utc_now(),
        )
        upload = cls(store, ref, session, **options)
        try:
            store.put(session_key(ref), session.to_bytes(), create_only=True)
        except AlreadyExistsError:
            upload._pool.shutdown()
            raise AlreadyExistsError(f"{ref} already has a staging session in {store.url}; continue it with --resume {ref}") from None
        except BaseException:
            upload._pool.shutdown()
            raise
        return upload

    @classmethod
    def resume(cls, store: S3Store, ref: BackupRef, *, inputs: list[str] | None = None, **options: Any) -> StagingUpload:
        """Continue an interrupted upload from what S3 holds (nothing from the host).

        Feed it the re-read inputs from their first byte, as for `start`.
        If the upload had already finished (`stream_end` is set) there is
        nothing to send: skip reading and go on to the pipeline.
        """
        try:
            session = SessionRecord.from_bytes(store.get(session_key(ref)))
        except NotFoundError:
            raise NotFoundError(f"no staging session for {ref} in {store.url}: nothing to resume; start a new backup") from None
        except (ValueError, TypeError) as exc:
            raise StorageError(f"staging session of {ref} in {store.url} is damaged ({exc}); start a new backup") from None
        if inputs is not None and len(inputs) != len(session.inputs):
            raise UsageError(
                f"{ref} was started with {len(session.inputs)} input(s) ({', '.join(session.inputs)}); "
                "resume it with the same inputs in the same order"
            )
        upload = cls(store, ref, session, **options)
        try:
            upload._load_state()
        except BaseException:
            upload._pool.shutdown()
            raise
        return upload

    def _load_state(self) -> None:
        for info in self.store.list(segment_records_prefix(self.ref)):
            try:
                record = SegmentRecord.from_bytes(self.store.get(info.key))
            except (ValueError, TypeError) as exc:
                raise StorageError(f"segment record {info.key} of {self.ref} is damaged ({exc}); start a new backup") from None
            if not 0 <= record.input_index < len(self._inputs):
                raise StorageError(f"segment record {info.key} names input {record.input_index}, but {self.ref} has {len(self._inputs)}")
            self._segment(record.input_index, record.segment).record = record
        # A segment completed just before the interruption may lack its record.
        for info in self.store.list(f"{staging_prefix(self.ref)}in"):
            match = _SEGMENT_KEY.fullmatch(info.key[len(staging_prefix(self.ref)) :])
            if match and 0 <= int(match.group(1)) < len(self._inputs):
                segment = self._segment(int(match.group(1)), int(match.group(2)))
                if segment.record is None:
                    segment.stored = self._stored_with_checksum(info.key)
        end = self.store.head(stream_end_key(self.ref))
        if end is not None:
            self.stream_end = StreamEnd.from_bytes(self.store.get(stream_end_key(self.ref)))

        uploads: dict[tuple[int, int], list[str]] = {}
        prefix = self.store.object_key(staging_prefix(self.ref))
        try:
            paginator = self.client.get_paginator("list_multipart_uploads")
            for page in paginator.paginate(Bucket=self.store.bucket, Prefix=prefix):
                for item in page.get("Uploads", []) or []:
                    match = _SEGMENT_KEY.fullmatch(item["Key"][len(prefix) :])
                    if match:
                        uploads.setdefault((int(match.group(1)), int(match.group(2))), []).append(item["UploadId"])
        except (ClientError, BotoCoreError) as exc:
            raise map_error(exc, action="listing uploads under", bucket=self.store.bucket, key=prefix, permission="s3:ListBucketMultipartUploads") from None

        for (input_index, number), upload_ids in sorted(uploads.items()):
            if not 0 <= input_index < len(self._inputs):
                continue
            segment = self._segment(input_index, number)
            candidates = [(upload_id, self._list_parts(segment.key, upload_id)) for upload_id in upload_ids]
            keep: tuple[str, dict[int, ExistingPart]] | None = None
            if segment.record is None and segment.stored is None:
                keep = max(candidates, key=lambda c: len(c[1]))
                segment.upload_id, segment.existing = keep
            for upload_id, _parts in candidates:
                if keep is None or upload_id != keep[0]:
                    # A completed segment's stray upload, or a duplicate: ours, under our staging prefix.
                    self._abort(segment.key, upload_id)

    def _stored_with_checksum(self, key: str) -> ObjectInfo | None:
        """An unrecorded segment object, if S3 tells its checksum; else it is uploaded again.

        Without the checksum we could not tell whether it holds the re-read
        bytes; no record points at it, so replacing it is safe. (HEAD's
        checksum needs kms:Decrypt on SSE-KMS objects, which the agent may lack.)
        """
        try:
            info = self.store.head(key)
        except StorageError:
            return None
        return info if info is not None and info.checksum is not None else None

    def _list_parts(self, key: str, upload_id: str) -> dict[int, ExistingPart]:
        found: dict[int, ExistingPart] = {}
        try:
            paginator = self.client.get_paginator("list_parts")
            for page in paginator.paginate(Bucket=self.store.bucket, Key=self.store.object_key(key), UploadId=upload_id):
                for part in page.get("Parts", []) or []:
                    found[int(part["PartNumber"])] = ExistingPart(int(part["Size"]), str(part["ETag"]), part.get("ChecksumCRC64NVME"))
        except (ClientError, BotoCoreError) as exc:
            raise map_error(exc, action="listing uploaded parts of", bucket=self.store.bucket, key=self.store.object_key(key), permission="s3:ListMultipartUploadParts") from None
        return found

    def _abort(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.store.bucket, Key=self.store.object_key(key), UploadId=upload_id)
        except ClientError as exc:
            if error_code(exc) != "NoSuchUpload":
                raise map_error(exc, action="aborting a stale upload of", bucket=self.store.bucket, key=self.store.object_key(key), permission="s3:AbortMultipartUpload") from None

    def _segment(self, input_index: int, number: int) -> _Segment:
        state = self._inputs[input_index]
        segment = state.segments.get(number)
        if segment is None:
            segment = _Segment(input_index, number, segment_key(self.ref, input_index, number))
            state.segments[number] = segment
        return segment

    # ------------------------------------------------------------ reader side

    def submit(self, input_index: int, number: int, data: memoryview, release: Release) -> None:
        """Hand over chunk `number` (0-based, in order) of input `input_index`.

        Blocks while (concurrency + 2) chunks are in flight. `release` is
        called exactly once, from any thread, when the buffer is no longer
        needed: after its part is stored, skipped, or abandoned. Raises the
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
            state = self._inputs[input_index]
            state.next_number = number + 1
            state.length += len(data)
            state.short_seen = len(data) < self.chunk_size
            segment = self._segment(input_index, number // self.segment_parts)
            segment.submitted += 1
            if segment.submitted == self.segment_parts:
                segment.expected = self.segment_parts
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            self._outstanding += 1
        self._pool.submit(self._part_task, segment, number % self.segment_parts + 1, data, release)

    def end_input(self, input_index: int, length: int) -> None:
        """Input `input_index` ended after `length` bytes: its last segment can complete."""
        with self._lock:
            state = self._inputs[input_index]
            if state.ended:
                raise ValueError(f"input {input_index} ended twice")
            if length != state.length:
                raise ValueError(f"input {input_index} ended at {length} bytes, but {state.length} were submitted")
            state.ended = True
            last = state.segments.get((state.next_number - 1) // self.segment_parts) if state.next_number else None
            if last is not None and last.expected is None:
                last.expected = last.submitted
            ready = self._take_ready(last) if last is not None else None
        if ready is not None:
            self._schedule_completion(ready)

    def _check_chunk(self, input_index: int, number: int, data: memoryview) -> None:
        self._raise_if_failed()
        if self._closed:
            raise ValueError("submit after finish")
        if not 0 <= input_index < len(self._inputs):
            raise ValueError(f"no input {input_index}: the session has {len(self._inputs)}")
        state = self._inputs[input_index]
        if state.ended or state.short_seen:
            raise ValueError(f"chunk {number} of input {input_index} after its end")
        if number != state.next_number:
            raise ValueError(f"chunk {number} of input {input_index} out of order, expected {state.next_number}")
        if not 0 < len(data) <= self.chunk_size:
            raise ValueError(f"chunk {number} of input {input_index} is {len(data)} bytes; chunks are 1..{self.chunk_size}")

    # --------------------------------------------------------------- uploading

    def _part_task(self, segment: _Segment, part_number: int, data: memoryview, release: Release) -> None:
        ready: _Segment | None = None
        try:
            if self._failed.is_set():
                raise _Cancelled()
            crc = crc64nvme(data)
            etag: str | None = None
            existing = segment.existing.get(part_number)
            if segment.record is not None or segment.stored is not None:
                skipped = True  # completed before; checked as a whole when it closes
            elif existing is not None and existing.matches(data, crc):
                skipped, etag = True, existing.etag
            else:
                skipped = False
                self._ensure_upload(segment)
                etag = self._upload_part(segment, part_number, data, crc)
            with self._lock:
                segment.parts[part_number] = _Part(etag, crc, len(data))
                if skipped:
                    self.parts_skipped += 1
                    self.bytes_skipped += len(data)
                else:
                    self.parts_uploaded += 1
                    self.bytes_uploaded += len(data)
                ready = self._take_ready(segment)
        except BaseException as exc:  # recorded; finish() raises it
            self._fail(exc)
        finally:
            try:
                release()
            except BaseException as exc:  # the reader's bug must not leak a slot
                self._fail(exc)
            with self._lock:
                self.in_flight -= 1
            self._slots.release()
            self._report()
            if ready is not None:
                self._complete_quietly(ready)
            self._task_done()

    def _ensure_upload(self, segment: _Segment) -> None:
        with segment.lock:
            if segment.upload_id is not None:
                return
            response = self._call(
                "starting the upload of",
                segment.key,
                "s3:PutObject",
                lambda: self.client.create_multipart_upload(
                    Bucket=self.store.bucket,
                    Key=self.store.object_key(segment.key),
                    ChecksumAlgorithm="CRC64NVME",
                    ChecksumType="FULL_OBJECT",
                ),
            )
            segment.upload_id = str(response["UploadId"])

    def _upload_part(self, segment: _Segment, part_number: int, data: memoryview, crc: int) -> str:
        value = encode_crc64nvme(crc)

        def send() -> Any:
            if self._limiter is not None:
                self._limiter.take(len(data))
            return self.client.upload_part(
                Bucket=self.store.bucket,
                Key=self.store.object_key(segment.key),
                UploadId=segment.upload_id,
                PartNumber=part_number,
                Body=request_body(data),
                ContentLength=len(data),
                ChecksumAlgorithm="CRC64NVME",
                ChecksumCRC64NVME=value,
            )

        response = self._call(f"uploading part {part_number} of", segment.key, "s3:PutObject", send)
        echoed = response.get("ChecksumCRC64NVME")
        if echoed and echoed != value:
            raise StorageError(f"S3 stored part {part_number} of {segment.key} with checksum {echoed}, expected {value}; run --resume to send it again")
        return str(response["ETag"])

    def _call(self, action: str, key: str, permission: str, request: Callable[[], Any], cancellable: bool = True) -> Any:
        """Run one S3 request with bounded, jittered retries on transient errors."""
        full_key = self.store.object_key(key)
        for attempt in range(self._retry.attempts):
            if cancellable and self._failed.is_set():
                raise _Cancelled()
            try:
                return request()
            except (ClientError, BotoCoreError) as exc:
                if error_code(exc) == "NoSuchUpload":
                    raise _UploadGone(
                        f"the staging upload of s3://{self.store.bucket}/{full_key} was aborted (by the pipeline's cleanup or "
                        f"the bucket lifecycle) while {action} it; start a new backup"
                    ) from None
                if not is_retryable(exc) or attempt + 1 == self._retry.attempts:
                    error = map_error(exc, action=action, bucket=self.store.bucket, key=full_key, permission=permission)
                    if is_retryable(exc):
                        error = type(error)(f"{error.message} (gave up after {self._retry.attempts} attempts)")
                    raise error from None
                self._sleep(self._retry.delay(attempt, self._rng))
        raise AssertionError("unreachable")  # pragma: no cover

    # -------------------------------------------------------------- completion

    def _take_ready(self, segment: _Segment) -> _Segment | None:
        """Under the lock: the segment, if it just became complete-able (once)."""
        if segment.completing or segment.expected is None or len(segment.parts) != segment.expected:
            return None
        segment.completing = True
        return segment

    def _schedule_completion(self, segment: _Segment) -> None:
        with self._lock:
            self._outstanding += 1

        def task() -> None:
            try:
                self._complete_quietly(segment)
            finally:
                self._task_done()

        self._pool.submit(task)

    def _complete_quietly(self, segment: _Segment) -> None:
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

    def _complete(self, segment: _Segment) -> None:
        numbers = sorted(segment.parts)
        if numbers != list(range(1, len(numbers) + 1)):
            raise AssertionError(f"segment {segment.key} has parts {numbers}")  # pragma: no cover
        parts = [segment.parts[n] for n in numbers]
        crc = parts[0].crc
        for part in parts[1:]:
            crc = combine_crc64nvme(crc, part.crc, part.size)
        length = sum(p.size for p in parts)
        checksum = f"{ALGORITHM}:{encode_crc64nvme(crc)}"
        offset = segment.number * self.segment_parts * self.chunk_size

        if segment.record is not None:
            record = segment.record
            part_checksums = [encode_crc64nvme(p.crc) for p in parts]
            if (record.length, record.parts, record.checksum, record.offset, record.part_checksums) != (
                length, len(parts), checksum, offset, part_checksums
            ):
                raise InputError(
                    f"input {self.session.inputs[segment.input_index]} is not the stream that was uploaded before the interruption "
                    f"(segment {segment.number} differs); --resume needs the same bytes: start a new backup instead"
                )
            return
        if segment.stored is not None:
            if (segment.stored.size, segment.stored.checksum or checksum) != (length, checksum):
                raise InputError(
                    f"input {self.session.inputs[segment.input_index]} is not the stream that was uploaded before the interruption "
                    f"(segment {segment.number} differs); --resume needs the same bytes: start a new backup instead"
                )
        else:
            self._complete_upload(segment, parts, numbers, crc, length)
        # Once S3 holds the segment, its record is written even if another
        # part failed meanwhile: the pipeline may start on it, and a resume
        # then skips it.
        record = SegmentRecord(
            input_index=segment.input_index,
            segment=segment.number,
            key=segment.key,
            offset=offset,
            length=length,
            parts=len(parts),
            checksum=checksum,
            part_checksums=[encode_crc64nvme(p.crc) for p in parts],
        )
        self.store.put(segment_record_key(self.ref, segment.input_index, segment.number), record.to_bytes())

    def _complete_upload(self, segment: _Segment, parts: list[_Part], numbers: list[int], crc: int, length: int) -> None:
        value = encode_crc64nvme(crc)
        expected = f"{ALGORITHM}:{value}"
        full_key = self.store.object_key(segment.key)

        def complete() -> Any:
            return self.client.complete_multipart_upload(
                Bucket=self.store.bucket,
                Key=full_key,
                UploadId=segment.upload_id,
                MultipartUpload={
                    "Parts": [
                        {"PartNumber": n, "ETag": p.etag, "ChecksumCRC64NVME": encode_crc64nvme(p.crc)} for n, p in zip(numbers, parts)
                    ]
                },
                ChecksumCRC64NVME=value,
                ChecksumType="FULL_OBJECT",
                MpuObjectSize=length,
            )

        try:
            response = self._call("completing", segment.key, "s3:PutObject", complete)
            stored = checksum_from_response(response)
        except _UploadGone:
            # A retried Complete whose first attempt succeeded finds no upload:
            # the object is there, and HEAD below tells whether it is ours.
            stored = None
        if stored is None:
            info = self.store.head(segment.key)
            if info is None:
                raise StorageError(f"segment s3://{self.store.bucket}/{full_key} is missing after its upload completed; run --resume")
            if info.size != length:
                raise StorageError(f"segment s3://{self.store.bucket}/{full_key} holds {info.size} bytes, {length} were uploaded; run --resume")
            stored = info.checksum or expected  # a store that keeps no checksum: nothing more to compare
        if stored != expected:
            raise StorageError(
                f"segment s3://{self.store.bucket}/{full_key} was stored with checksum {stored}, the uploaded bytes have {expected}; "
                "the data changed on the way: start a new backup"
            )

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
        self._shutdown()
        self._raise_if_failed()  # the first error, or "stopped" after abort()
        lengths = [state.length for state in self._inputs]
        counts = [-(-state.next_number // self.segment_parts) for state in self._inputs]
        for index, state in enumerate(self._inputs):
            for number, segment in state.segments.items():
                if number >= counts[index] or not segment.done:
                    raise InputError(
                        f"input {self.session.inputs[index]} ended at {state.length} bytes, before segment {number} "
                        "that was uploaded before the interruption; --resume needs the same stream: start a new backup"
                    )
        end = StreamEnd(lengths=lengths, segments=counts)
        if self.stream_end is not None and self.stream_end != end:
            raise InputError(f"the re-read inputs of {self.ref} ({lengths} bytes) differ from the completed upload ({self.stream_end.lengths})")
        self.store.put(stream_end_key(self.ref), end.to_bytes())
        self.stream_end = end
        return end

    def abort(self, error: BaseException | None = None) -> None:
        """Stop: queued parts are released unsent; what is in S3 stays for --resume."""
        self._fail(error or _Cancelled())
        self._wait_idle()
        self._shutdown()

    def __enter__(self) -> StagingUpload:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.abort(exc)
        else:
            self._shutdown()

    # ---------------------------------------------------------------- plumbing

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
                    "segments_completed": self.segments_completed,
                }
            self._progress(snapshot)

    @property
    def error(self) -> BaseException | None:
        return self._error


def _check_sizes(chunk_size: int, segment_parts: int, min_part_size: int) -> None:
    if not 0 < chunk_size <= MAX_PART_SIZE:
        raise UsageError(f"chunk size {chunk_size} is outside S3's part sizes (up to 5 GiB)")
    if segment_parts > 1 and chunk_size < min_part_size:
        raise UsageError(f"chunk size {chunk_size} is below S3's minimum part size of {min_part_size} bytes; use --chunk-size 5MiB or more")
    if not 1 <= segment_parts <= MAX_PARTS:
        raise UsageError(f"{segment_parts} parts per segment: S3 allows 1 to {MAX_PARTS}")
    if segment_parts * chunk_size > MAX_OBJECT_SIZE:
        raise UsageError(f"segments of {segment_parts} x {chunk_size} bytes exceed S3's 5 TiB object limit")
