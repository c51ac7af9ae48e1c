"""The agent's staging uploader against S3 (moto) and the in-memory fake: segments, retries, rate, resume, memory."""

from __future__ import annotations

import io
import json
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import moto.s3.models
import pytest
from botocore.awsrequest import AWSResponse
from moto import mock_aws

from braid.adapters.aws.clients import s3_client
from braid.adapters.aws.retries import RetrySettings
from braid.adapters.aws.s3 import S3Store
from braid.adapters.aws.s3_multipart import S3Multipart
from braid.adapters.local.store import LocalStore
from braid.agent.limits import (
    DEFAULT_BUFFERS,
    DEFAULT_CONCURRENCY,
    GROUPED_RATE_FLOOR,
    SEND_BUFFER_IN_FLIGHT,
    buffers_needed,
    check_part_chunks,
    connection_rate,
    default_concurrency,
    default_part_chunks,
    default_ramp_parts,
    default_segment_chunks,
)
from braid.agent.resume import part_matches
from braid.agent.segments import PartLayout
from braid.agent.throttle import TokenBucket
from braid.agent.uploader import StagingUpload
from braid.errors import AlreadyExistsError, InputError, IntegrityError, NotFoundError, StorageError, UsageError
from braid.format.checksum import crc64nvme, encode_crc64nvme, stored_checksum
from braid.format.ids import BackupRef
from braid.format.staging import (
    SegmentRecord,
    SessionRecord,
    StagingArea,
    StreamEnd,
    session_key,
    stream_end_key,
)
from braid.format.staging.keys import SEGMENT_RECORDS, staging_key
from braid.format.staging.protocol import PROTOCOL, ProtocolMismatchError
from braid.ports.multipart import MultipartStore, StoredPart
from braid.ports.pipeline import MultipartJanitor
from braid.ports.store import ObjectStore
from support.memory_multipart import MemoryMultipart

BUCKET = "braid-staging-test"
CHUNK = 16 * 1024
SMALL_PART = 1024  # moto's minimum part size is lowered to this, and so is ours
REF = BackupRef.new("db")
REPOSITORY_ID = "c0ffee00-0000-4000-8000-000000000001"
ATTEMPTS = 5  # the client's, per request: more than the SlowDowns a test injects


class Crash(Exception):
    """The agent process dying mid-upload."""


class _Raw(io.BytesIO):
    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.read()


@dataclass
class S3Calls:
    """Counts S3 requests and injects failures the way S3 returns them (HTTP responses)."""

    uploads_sent: int = 0
    uploads_ok: int = 0
    slowdowns_left: int = 0
    always_fail: bool = False
    crash_after: int | None = None
    retry_sleeps: list[float] = field(default_factory=list)  # the client's backoff, recorded instead of slept
    retries: list[dict[str, Any]] = field(default_factory=list)  # what the client reported to progress
    part_sizes: list[int] = field(default_factory=list)  # Content-Length of each UploadPart let through to S3
    lock: threading.Lock = field(default_factory=threading.Lock)

    def before_send(self, request: Any, **_: Any) -> AWSResponse | None:
        with self.lock:
            self.uploads_sent += 1
            if self.crash_after is not None and self.uploads_sent > self.crash_after:
                raise Crash()
            if self.always_fail or self.slowdowns_left > 0:
                self.slowdowns_left -= 1
                body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                return AWSResponse(request.url, 503, {"Content-Type": "application/xml"}, _Raw(body))
            self.part_sizes.append(int(request.headers["Content-Length"]))
        return None

    def after_call(self, http_response: Any, **_: Any) -> None:
        if http_response.status_code == 200:
            with self.lock:
                self.uploads_ok += 1


@pytest.fixture
def s3(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[S3Store, S3Calls]]:
    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", SMALL_PART)
    with mock_aws():
        # The client's retries are the only ones; their waits are recorded, not slept.
        calls = S3Calls()
        client = s3_client(
            region="us-east-1", retries=RetrySettings("standard", ATTEMPTS), sleep=calls.retry_sleeps.append, on_retry=calls.retries.append
        )
        client.create_bucket(Bucket=BUCKET)
        client.meta.events.register_first("before-send.s3.UploadPart", calls.before_send)
        client.meta.events.register("after-call.s3.UploadPart", calls.after_call)
        yield S3Store(client, BUCKET, "repo"), calls


class Sleeps:
    """Records retry sleeps instead of sleeping."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def __call__(self, seconds: float) -> None:
        self.total += seconds
        self.count += 1


def options(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"concurrency": 3, "min_part_size": SMALL_PART, "sleep": Sleeps()}
    base.update(overrides)
    return base


@dataclass
class Feeder:
    """The reader's side: a bounded pool of reusable buffers, round-robin over inputs."""

    held: int = 0
    peak_held: int = 0
    released: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def feed(self, upload: StagingUpload, streams: list[bytes], pool_size: int | None = None) -> None:
        import queue

        pool: queue.Queue[bytearray] = queue.Queue()
        for _ in range(pool_size or upload.max_in_flight * 3):
            pool.put(bytearray(upload.chunk_size))
        cursors = [0] * len(streams)
        numbers = [0] * len(streams)
        open_inputs = [i for i, s in enumerate(streams)]
        for i, data in enumerate(streams):
            if not data:
                upload.end_input(i, 0)
                open_inputs.remove(i)
        while open_inputs:
            for i in list(open_inputs):
                data = streams[i]
                piece = data[cursors[i] : cursors[i] + upload.chunk_size]
                buf = pool.get(timeout=10)
                buf[: len(piece)] = piece

                def release(buf: bytearray = buf) -> None:
                    with self.lock:
                        self.held -= 1
                        self.released += 1
                    pool.put(buf)

                with self.lock:
                    self.held += 1
                    self.peak_held = max(self.peak_held, self.held)
                upload.submit(i, numbers[i], memoryview(buf)[: len(piece)], release)
                cursors[i] += len(piece)
                numbers[i] += 1
                if cursors[i] >= len(data):
                    upload.end_input(i, len(data))
                    open_inputs.remove(i)


def uploads_of(store: ObjectStore) -> MultipartStore:
    """The multipart side of the same store: S3's own, or the fake over a local directory."""
    return S3Multipart(store) if isinstance(store, S3Store) else MemoryMultipart(store, min_part_size=SMALL_PART)


def resume(store: ObjectStore, uploads: MultipartStore | None = None, **overrides: Any) -> StagingUpload:
    return StagingUpload.resume(StagingArea(store, REF), uploads or uploads_of(store), **options(**overrides))


def least_concurrency(inputs: int, part_chunks: int) -> int:
    """Our usual 3, or the least that fills parts of `part_chunks` chunks (the tightest memory the agent allows)."""
    return max(3, buffers_needed(inputs, part_chunks) - inputs - 1)


def run(
    store: ObjectStore,
    streams: list[bytes],
    *,
    segment_chunks: int = 4,
    part_chunks: int = 1,
    feeder: Feeder | None = None,
    uploads: MultipartStore | None = None,
    **overrides: Any,
) -> tuple[StagingUpload, StreamEnd]:
    upload = StagingUpload.start(
        StagingArea(store, REF),
        uploads or uploads_of(store),
        repository_id=REPOSITORY_ID,
        inputs=[f"/pipe{i}" for i in range(len(streams))],
        chunk_size=CHUNK,
        level=3,
        segment_chunks=segment_chunks,
        part_chunks=part_chunks,
        **options(**{"concurrency": least_concurrency(len(streams), part_chunks), **overrides}),
    )
    with upload:
        (feeder or Feeder()).feed(upload, streams)
        end = upload.finish()
    return upload, end


def records(store: ObjectStore) -> list[SegmentRecord]:
    found = [SegmentRecord.from_bytes(store.get(info.key)) for info in store.list(staging_key(REF, SEGMENT_RECORDS))]
    return sorted(found, key=lambda r: (r.input_index, r.segment))


def reassemble(store: ObjectStore, input_index: int) -> bytes:
    return b"".join(store.get(r.key) for r in records(store) if r.input_index == input_index)


def crc(data: bytes) -> str:
    return encode_crc64nvme(crc64nvme(data))


def stream(size: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(size)


# Chunks per staging part: one (as agents before wrote), and three, so segments
# of 4 chunks have a full part and a short one, and an input may end mid-part.
PART_CHUNKS = [1, 3]
# S3 parts of segments of 4 chunks holding 4, 4 and 2 chunks.
PARTS_OF_10_CHUNKS = {1: 10, 3: 2 + 2 + 1}


@pytest.mark.parametrize("part_chunks", PART_CHUNKS)
def test_multi_segment_round_trip(s3: tuple[S3Store, S3Calls], part_chunks: int) -> None:
    store, calls = s3
    data = stream(CHUNK * 9 + 1234)  # 10 chunks: segments of 4, 4 and 2
    progress: list[dict[str, Any]] = []
    upload, end = run(store, [data], part_chunks=part_chunks, progress=progress.append)
    assert reassemble(store, 0) == data
    found = records(store)
    assert [(r.segment, r.chunks, r.offset, r.length) for r in found] == [
        (0, 4, 0, 4 * CHUNK),
        (1, 4, 4 * CHUNK, 4 * CHUNK),
        (2, 2, 8 * CHUNK, CHUNK + 1234),
    ]
    for r in found:
        segment = store.get(r.key)
        assert r.checksum == stored_checksum(segment)
        # Per-part checksums, which the worker checks its fetched bytes against.
        assert [f"crc64nvme:{c}" for c in r.chunk_checksums] == [
            stored_checksum(segment[i : i + CHUNK]) for i in range(0, len(segment), CHUNK)
        ]
        info = store.head(r.key)
        assert info is not None and info.checksum == r.checksum  # S3's own full-object CRC64NVME
    assert end == StreamEnd(lengths=[len(data)], segments=[3])
    assert StreamEnd.from_bytes(store.get(stream_end_key(REF))) == end
    session = SessionRecord.from_bytes(store.get(session_key(REF)))
    assert (session.repository, session.chunk_size, session.segment_chunks, session.inputs, session.level) == (REPOSITORY_ID, CHUNK, 4, ["/pipe0"], 3)
    assert session.part_chunks == part_chunks
    assert calls.uploads_ok == PARTS_OF_10_CHUNKS[part_chunks]
    assert progress[-1]["bytes_uploaded"] == len(data) and progress[-1]["parts_uploaded"] == PARTS_OF_10_CHUNKS[part_chunks]
    assert progress[-1]["chunks"] == 10
    assert progress[-1]["segments_completed"] == 3
    # Parts of part_chunks chunks (a segment's last may hold fewer), each sent with its combined CRC, which S3 checked.
    wanted = [min(part_chunks * CHUNK, r.length - i) for r in found for i in range(0, r.length, part_chunks * CHUNK)]
    assert sorted(calls.part_sizes) == sorted(wanted)
    assert store.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


@pytest.mark.parametrize("part_chunks", PART_CHUNKS)
def test_two_inputs_of_unequal_size_and_an_empty_one(s3: tuple[S3Store, S3Calls], part_chunks: int) -> None:
    store, _ = s3
    big, small = stream(CHUNK * 5 + 7, seed=2), stream(CHUNK - 1, seed=3)
    _, end = run(store, [big, small, b""], segment_chunks=4 if part_chunks > 1 else 2, part_chunks=part_chunks)
    assert reassemble(store, 0) == big
    assert reassemble(store, 1) == small
    assert reassemble(store, 2) == b""
    assert end == StreamEnd(lengths=[len(big), len(small), 0], segments=[3, 1, 0] if part_chunks == 1 else [2, 1, 0])


def test_input_ending_on_a_segment_boundary(s3: tuple[S3Store, S3Calls]) -> None:
    store, _ = s3
    data = stream(CHUNK * 4)
    _, end = run(store, [data], segment_chunks=2)
    assert end.segments == [2] and reassemble(store, 0) == data


def test_session_is_written_first_and_never_replaced(s3: tuple[S3Store, S3Calls]) -> None:
    store, _ = s3
    run(store, [b"x" * 10])
    with pytest.raises(AlreadyExistsError, match="--resume"):
        StagingUpload.start(
            StagingArea(store, REF), S3Multipart(store), repository_id=REPOSITORY_ID, inputs=["/pipe0"], chunk_size=CHUNK, level=3, **options()
        )


def test_slowdown_is_retried(s3: tuple[S3Store, S3Calls]) -> None:
    store, calls = s3
    calls.slowdowns_left = 4
    data = stream(CHUNK * 6 + 5)
    run(store, [data])
    assert reassemble(store, 0) == data
    assert calls.uploads_sent == 7 + 4 and calls.uploads_ok == 7
    assert len(calls.retry_sleeps) == 4  # one backoff per failed attempt
    assert [e["message"].split(",")[0] for e in calls.retries] == ["SlowDown"] * 4  # "SlowDown, retrying in 0.3 s"


def test_always_failing_gives_storage_error_and_records_nothing(s3: tuple[S3Store, S3Calls]) -> None:
    store, calls = s3
    calls.always_fail = True
    feeder = Feeder()
    with pytest.raises(StorageError, match="SlowDown.*--concurrency"):
        run(store, [stream(CHUNK * 6)], feeder=feeder)
    assert records(store) == []
    assert store.head(stream_end_key(REF)) is None
    assert feeder.held == 0  # every buffer went back to the reader
    assert calls.uploads_ok == 0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def test_token_bucket_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000.0, burst=100.0, clock=clock, sleep=clock.sleep)
    for _ in range(50):
        bucket.take(200)
    assert 50 * 200 / clock.now == pytest.approx(1000.0, rel=0.02)
    clock.now += 10  # idle: tokens refill to the burst only
    start = clock.now
    bucket.take(100)
    assert clock.now == start
    bucket.take(1000)
    assert clock.now - start == pytest.approx(1.0)


def test_rate_limit_is_honoured(s3: tuple[S3Store, S3Calls]) -> None:
    store, _ = s3
    clock = FakeClock()
    rate = 64 * 1024.0  # four chunks a second
    data = stream(CHUNK * 12)
    run(store, [data], rate_limit=rate, clock=clock, sleep=clock.sleep, concurrency=1)
    achieved = len(data) / clock.now
    assert rate * 0.9 <= achieved <= rate * 1.15  # the burst lets the first part go at once
    assert reassemble(store, 0) == data


def test_memory_bound(s3: tuple[S3Store, S3Calls]) -> None:
    store, _ = s3
    slow = threading.Event()

    def slow_upload(**_: Any) -> None:
        slow.wait(0.005)  # uploads slower than the reader: the reader must wait

    store.client.meta.events.register("before-send.s3.UploadPart", slow_upload)
    feeder = Feeder()
    upload, _ = run(store, [stream(CHUNK * 20), stream(CHUNK * 7 + 3, seed=9)], feeder=feeder, concurrency=2)
    assert upload.peak_in_flight <= upload.concurrency + 2 == 4
    assert upload.peak_in_flight >= 3  # the bound was actually reached
    assert feeder.peak_held <= 4 + 1 and feeder.held == 0


def crash_then_resume(store: S3Store, calls: S3Calls, data: bytes, crash_after: int) -> int:
    """Upload until `crash_after` parts were sent, then die; returns parts stored before the crash."""
    calls.crash_after = crash_after
    with pytest.raises(Crash):
        run(store, [data], segment_chunks=4, concurrency=1)  # one thread: the crash point is exact
    stored = calls.uploads_ok
    calls.crash_after = None
    calls.uploads_sent = calls.uploads_ok = 0
    return stored


def test_resume_sends_only_missing_parts(s3: tuple[S3Store, S3Calls]) -> None:
    store, calls = s3
    data = stream(CHUNK * 16 + 999)  # 17 parts, 5 segments of 4
    stored = crash_then_resume(store, calls, data, crash_after=7)
    assert stored == 7  # segment 0 complete and recorded, 3 parts of segment 1
    assert store.head(stream_end_key(REF)) is None

    upload = resume(store, inputs=["/pipe0"])
    with upload:
        Feeder().feed(upload, [data])  # the database restarts its stream from the beginning
        end = upload.finish()
    assert calls.uploads_ok == 17 - stored
    assert upload.parts_skipped == stored
    assert end == StreamEnd(lengths=[len(data)], segments=[5])
    assert reassemble(store, 0) == data
    assert [r.chunks for r in records(store)] == [4, 4, 4, 4, 1]


def test_resume_resends_a_part_that_differs(s3: tuple[S3Store, S3Calls]) -> None:
    store, calls = s3
    data = stream(CHUNK * 8 + 10)
    stored = crash_then_resume(store, calls, data, crash_after=3)  # segment 0 incomplete
    uploads = store.client.list_multipart_uploads(Bucket=BUCKET)["Uploads"]
    assert len(uploads) == 1
    key, upload_id = uploads[0]["Key"], uploads[0]["UploadId"]
    parts = store.client.list_parts(Bucket=BUCKET, Key=key, UploadId=upload_id)["Parts"]
    victim = parts[0]["PartNumber"]
    store.client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload_id, PartNumber=victim, Body=b"\0" * CHUNK)
    calls.uploads_sent = calls.uploads_ok = 0

    upload = resume(store)
    with upload:
        Feeder().feed(upload, [data])
        upload.finish()
    assert calls.uploads_ok == 9 - stored + 1
    assert reassemble(store, 0) == data


def test_resume_after_a_crash_between_complete_and_record(s3: tuple[S3Store, S3Calls]) -> None:
    """S3 completed segment 0 but the agent died before writing its record."""
    store, calls = s3

    def die_on_record(params: dict[str, Any], **_: Any) -> None:
        if "/segments/" in params["Key"]:
            raise Crash()

    handler_id = "crash-before-record"
    store.client.meta.events.register("before-parameter-build.s3.PutObject", die_on_record, unique_id=handler_id)
    data = stream(CHUNK * 6)
    with pytest.raises(Crash):
        run(store, [data], segment_chunks=4, concurrency=1)
    store.client.meta.events.unregister("before-parameter-build.s3.PutObject", unique_id=handler_id)
    assert records(store) == [] and store.head(f"staging/{REF.name}/{REF.id}/in0/seg00000") is not None
    calls.uploads_sent = calls.uploads_ok = 0

    upload = resume(store)
    with upload:
        Feeder().feed(upload, [data])
        upload.finish()
    assert calls.uploads_ok == 2  # only segment 1; segment 0 was checked against S3's checksum and recorded
    assert [r.chunks for r in records(store)] == [4, 2]
    assert reassemble(store, 0) == data


def test_a_part_changed_before_completion_is_not_recorded(s3: tuple[S3Store, S3Calls]) -> None:
    store, _ = s3
    tampered = threading.Event()

    def tamper(params: dict[str, Any], **_: Any) -> None:
        if not tampered.is_set():
            tampered.set()
            key, upload_id = params["Key"], params["UploadId"]
            store.client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload_id, PartNumber=1, Body=b"\1" * CHUNK)

    store.client.meta.events.register("before-parameter-build.s3.CompleteMultipartUpload", tamper)
    with pytest.raises(StorageError):
        run(store, [stream(CHUNK * 3)], segment_chunks=4)
    assert records(store) == [] and store.head(stream_end_key(REF)) is None


def test_resume_refuses_a_different_stream(s3: tuple[S3Store, S3Calls]) -> None:
    store, calls = s3
    data = stream(CHUNK * 8 + 10)
    crash_then_resume(store, calls, data, crash_after=6)
    assert records(store)  # segment 0 was completed before the crash
    changed = bytes([data[0] ^ 0xFF]) + data[1:]
    upload = resume(store)
    with pytest.raises(InputError, match="not the stream"):
        with upload:
            Feeder().feed(upload, [changed])
            upload.finish()


def test_resume_needs_the_session(s3: tuple[S3Store, S3Calls]) -> None:
    store, _ = s3
    with pytest.raises(NotFoundError, match="nothing to resume"):
        resume(store)
    run(store, [b"abc"])
    with pytest.raises(UsageError, match="same inputs"):
        resume(store, inputs=["/a", "/b"])


def test_existing_part_matching() -> None:
    chunk = memoryview(os.urandom(4096))
    crc = crc64nvme(chunk)
    assert part_matches(StoredPart(1, 4096, '"x"', encode_crc64nvme(crc)), chunk, crc)  # S3's per-part CRC64NVME
    assert not part_matches(StoredPart(1, 4096, '"x"', encode_crc64nvme(crc ^ 1)), chunk, crc)
    assert not part_matches(StoredPart(1, 4095, '"x"', encode_crc64nvme(crc)), chunk, crc)
    import hashlib

    md5 = hashlib.md5(chunk).hexdigest()
    assert part_matches(StoredPart(1, 4096, f'"{md5}"', None), chunk, crc)  # no checksum: a plain-MD5 ETag
    assert not part_matches(StoredPart(1, 4096, '"0123abcd-1"', None), chunk, crc)  # SSE-KMS ETag: cannot tell, resend


def test_sizes_are_checked() -> None:
    assert default_segment_chunks(64 * 1024**2) == 32
    assert default_segment_chunks(1024) == 10_000
    store = S3Store(client=None, bucket="b")
    session = SessionRecord("db@x", "s3://b", 1024, 4, 3, ["-"], "now")
    with pytest.raises(UsageError, match="minimum part size"):
        StagingUpload(StagingArea(store, REF), S3Multipart(store), session)


class CrashingMultipart(MemoryMultipart):
    """The fake, with the agent dying once `crash_after` parts were stored."""

    def __init__(self, store: ObjectStore, crash_after: int | None) -> None:
        super().__init__(store, min_part_size=SMALL_PART)
        self.crash_after = crash_after
        self._started = 0
        self._counting = threading.Lock()

    def upload_part(self, key: str, upload_id: str, number: int, data: Any, checksum: str) -> str:
        # Counted as each call starts, under a lock: with parts sent concurrently, exactly the first
        # `crash_after` calls store their part, whichever thread gets there first.
        with self._counting:
            started, self._started = self._started, self._started + 1
        if self.crash_after is not None and started >= self.crash_after:
            raise Crash()
        return super().upload_part(key, upload_id, number, data, checksum)


def test_the_uploader_needs_only_ports_a_directory_and_the_fake_will_do(tmp_path: Any) -> None:
    """No S3 at all: the same segments, records and resume over a LocalStore and MemoryMultipart."""
    store = LocalStore(tmp_path / "repo")
    data = stream(CHUNK * 8 + 77)  # 9 parts: segments of 4, 4 and 1
    uploads = CrashingMultipart(store, crash_after=6)
    with pytest.raises(Crash):
        run(store, [data], uploads=uploads, concurrency=1)
    assert [r.chunks for r in records(store)] == [4] and len(list(uploads.list_uploads(""))) == 1
    uploads.crash_after = None
    uploads.calls.clear()
    upload = resume(store, uploads, inputs=["/pipe0"])
    with upload:
        Feeder().feed(upload, [data])
        end = upload.finish()
    assert uploads.calls.count("upload_part") == 9 - 6 and upload.parts_skipped == 6
    assert end == StreamEnd(lengths=[len(data)], segments=[3])
    assert reassemble(store, 0) == data
    assert [r.checksum for r in records(store)] == [stored_checksum(store.get(r.key)) for r in records(store)]
    assert list(uploads.list_uploads("")) == []


def test_resuming_a_finished_upload_does_not_write_the_stream_end_again(tmp_path: Any) -> None:
    """The pipeline may publish the backup and remove its staging while a resumed agent re-reads the stream:
    the agent must not then write the stream-end record again (a stray object in staging)."""
    store = LocalStore(tmp_path / "repo")
    data = stream(CHUNK * 8 + 77)
    _, first_end = run(store, [data])
    upload = resume(store, inputs=["/pipe0"])
    with upload:
        Feeder().feed(upload, [data])
        area = StagingArea(store, REF)
        store.delete([info.key for info in store.list(area.prefix)])  # Finalize removed staging meanwhile
        end = upload.finish()
    assert end == first_end
    assert list(store.list(area.prefix)) == []


class RemovedOnRead(LocalStore):
    """A store whose staging the pipeline removes (as Finalize or Cleanup does) the moment the
    resuming agent reads `trigger`: a resume racing the end of its execution."""

    trigger = ""

    def get(self, key: str) -> bytes:
        if key == self.trigger:
            self.trigger = ""
            StagingArea(self, REF).remove(MultipartJanitor(MemoryMultipart(self, min_part_size=SMALL_PART)))
        return super().get(key)


@pytest.mark.parametrize("trigger", ["stream-end", "segment-record"])
def test_a_resume_racing_the_removal_of_its_staging_finds_nothing_to_resume(tmp_path: Any, trigger: str) -> None:
    """The session goes first and is read last: a resume that read staging while it was being
    removed says there is nothing to resume (the agent then follows the execution), and writes nothing."""
    store = RemovedOnRead(tmp_path / "repo")
    data = stream(CHUNK * 8 + 77)
    run(store, [data])
    area = StagingArea(store, REF)
    first_record = next(info.key for info in store.list(staging_key(REF, SEGMENT_RECORDS)))
    store.trigger = stream_end_key(REF) if trigger == "stream-end" else first_record
    with pytest.raises(NotFoundError, match="staging was removed"):
        resume(store, inputs=["/pipe0"])
    assert list(store.list(area.prefix)) == []


def test_removing_staging_deletes_the_session_before_anything_else(tmp_path: Any) -> None:
    deleted: list[list[str]] = []

    class Recording(LocalStore):
        def delete(self, keys: Any) -> None:
            deleted.append(list(keys))
            super().delete(keys)

    store = Recording(tmp_path / "repo")
    run(store, [stream(CHUNK * 3)])
    StagingArea(store, REF).remove(MultipartJanitor(MemoryMultipart(store, min_part_size=SMALL_PART)))
    assert deleted[0] == [session_key(REF)] and session_key(REF) not in deleted[1] and deleted[1]


# -- staging parts of several chunks ------------------------------------------------


def test_the_default_concurrency_keeps_one_inputs_memory_whatever_the_inputs() -> None:
    """--concurrency not given: 11 chunks in flight with one input, one fewer per further input, at least 2,
    so the agent holds 13 chunk buffers (832 MiB at 64 MiB chunks) with up to ten inputs; a given value is kept."""
    assert DEFAULT_BUFFERS == 13 and default_concurrency(1) == DEFAULT_CONCURRENCY == 11
    assert [default_concurrency(n) for n in (2, 4, 10, 11, 40)] == [10, 8, 2, 2, 2]
    for inputs in range(1, 11):
        assert inputs + default_concurrency(inputs) + 1 == DEFAULT_BUFFERS
        assert default_part_chunks(64 * 1024**2, inputs, default_concurrency(inputs)) >= 1
    assert DEFAULT_BUFFERS * 64 * 1024**2 + 150 * 1024**2 < 1024**3  # the chunks and the interpreter and clients (866 MiB peak measured)
    from braid.agent.cloud_engine import CloudOptions

    assert CloudOptions.from_cli(SimpleNamespace()).concurrency is None  # not given: the engine takes the default for its inputs


def test_part_chunks_follow_the_agents_buffers() -> None:
    """Parts of up to 256 MiB, shrunk until every input's unfinished part and 2 parts being sent fit in
    (inputs + concurrency + 1) buffers; a resumed upload with too little --concurrency is refused."""
    mib = 1024**2
    assert DEFAULT_CONCURRENCY == 11
    assert default_part_chunks(64 * mib, 1, DEFAULT_CONCURRENCY) == 4  # the defaults: 256 MiB parts, 2 in flight, 13 buffers
    assert (1 + DEFAULT_CONCURRENCY + 1) * 64 * mib < 1024**3  # under 1 GiB of chunk buffers at the defaults
    assert default_part_chunks(64 * mib, 2, DEFAULT_CONCURRENCY) == 3
    assert default_part_chunks(64 * mib, 4, DEFAULT_CONCURRENCY) == 2
    assert default_part_chunks(64 * mib, 1, 1) == 1
    assert [default_part_chunks(64 * mib, 1, c) for c in (5, 8, 9, 10, 64)] == [2, 3, 3, 4, 4]  # 256 MiB at most
    assert default_part_chunks(8 * mib, 1, 38) == 13  # (1 + 2) x 13 = 39 buffers <= 1 + 38 + 1
    assert default_part_chunks(2 * 1024 * mib, 1, 64) == 1  # no part beyond 5 GiB
    for inputs in (1, 2, 3, 8):
        for concurrency in (1, 2, 5, 8, 16, 64):
            chunks = default_part_chunks(64 * mib, inputs, concurrency)
            assert (inputs + 2) * chunks <= inputs + concurrency + 1 or chunks == 1
            check_part_chunks(chunks, inputs, concurrency)
    with pytest.raises(UsageError, match="use --concurrency 6 or more"):
        check_part_chunks(4, 1, 5)
    store = S3Store(client=None, bucket="b")
    session = SessionRecord("db@x", "s3://b", CHUNK, 4, 3, ["-"], "now", part_chunks=4)
    with pytest.raises(UsageError, match="use --concurrency 6 or more"):
        StagingUpload(StagingArea(store, REF), S3Multipart(store), session, concurrency=2, min_part_size=SMALL_PART)
    with pytest.raises(UsageError, match="outside S3's part sizes"):
        StagingUpload(StagingArea(store, REF), S3Multipart(store), SessionRecord("db@x", "s3://b", 2 * 1024**3, 4, 3, ["-"], "now", part_chunks=3))



def test_part_grouping_keeps_the_parts_in_flight_able_to_fill_ten_gigabits_at_the_measured_rtt(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a 4 MiB send buffer (half of it in flight), 256 MiB parts up to 3.4 ms of RTT, then 3, 2 and 1 chunk;
    unmeasured, as before; off (BRAID_PART_GROUPING=off), one-chunk parts and no ramp, written in the session."""
    mib, wmem = 1024**2, 4 * 1024**2
    assert connection_rate(None) is None and connection_rate((0.02, wmem)) == wmem * SEND_BUFFER_IN_FLIGHT / 0.02
    chunks = [default_part_chunks(64 * mib, 1, DEFAULT_CONCURRENCY, connection_rate((rtt / 1000, wmem))) for rtt in (0.05, 1, 3.3, 3.4, 5, 5.1, 8.3, 8.5, 20)]
    assert chunks == [4, 4, 4, 3, 3, 2, 2, 1, 1]
    assert default_part_chunks(64 * mib, 1, DEFAULT_CONCURRENCY, None) == 4
    assert default_part_chunks(64 * mib, 4, DEFAULT_CONCURRENCY, connection_rate((0.001, wmem))) == 2  # never more than the buffers allow
    for rtt in (0.001, 0.004, 0.006, 0.02):  # whatever it picks, its parts in flight carry the floor, or it is down to one chunk
        k = default_part_chunks(64 * mib, 1, DEFAULT_CONCURRENCY, connection_rate((rtt, wmem)))
        assert k == 1 or (DEFAULT_BUFFERS // k - 1) * wmem * SEND_BUFFER_IN_FLIGHT / rtt >= GROUPED_RATE_FLOOR
    store = LocalStore(tmp_path)
    uploads = MemoryMultipart(store, min_part_size=SMALL_PART)

    def session(name: str) -> tuple[int, int]:
        area = StagingArea(store, BackupRef("db", name))
        with StagingUpload.start(area, uploads, repository_id=REPOSITORY_ID, inputs=["-"], chunk_size=64 * mib, level=3):
            pass
        record = area.read_session()
        return record.part_chunks, record.ramp_parts

    assert session("a1") == (4, 32)
    uploads.path = (0.02, wmem)  # 20 ms away: 11 one-chunk parts in flight, as the ramp
    assert session("a2") == (1, 0)
    uploads.path = (0.0005, wmem)
    assert session("a3") == (4, 32)
    monkeypatch.setenv("BRAID_PART_GROUPING", "off")
    assert session("a4") == (1, 0)

def test_session_keeps_part_chunks_and_its_protocol_and_refuses_another_protocol() -> None:
    grouped = SessionRecord(str(REF), REPOSITORY_ID, CHUNK, 4, 3, ["-"], "now", part_chunks=4)
    assert SessionRecord.from_bytes(grouped.to_bytes()) == grouped
    doc = json.loads(grouped.to_bytes())
    assert doc["protocol"] == PROTOCOL and type(doc["protocol"]) is int
    older = {k: v for k, v in doc.items() if k not in ("protocol", "part_chunks")}  # as agents of protocol 1 wrote it
    with pytest.raises(ProtocolMismatchError, match=f"speaks staging protocol 1; this braid speaks protocol {PROTOCOL}"):
        SessionRecord.from_bytes(json.dumps(older).encode())
    with pytest.raises(ProtocolMismatchError, match=f"protocol {PROTOCOL + 1}; this braid speaks protocol {PROTOCOL}"):
        SessionRecord.from_bytes(json.dumps({**doc, "protocol": PROTOCOL + 1}).encode())
    for wrong in (True, str(PROTOCOL), float(PROTOCOL)):
        with pytest.raises(IntegrityError, match="protocol must be an integer"):
            SessionRecord.from_bytes(json.dumps({**doc, "protocol": wrong}).encode())
    with pytest.raises(IntegrityError, match="impossible settings"):
        SessionRecord(str(REF), REPOSITORY_ID, CHUNK, 4, 3, ["-"], "now", part_chunks=0).check(REF, "session.json")


def test_memory_bound_with_grouped_parts_in_the_agents_own_buffers(s3: tuple[S3Store, S3Calls]) -> None:
    """Two inputs read in turn from exactly (inputs + concurrency + 1) buffers, parts of 2 chunks, slow uploads: no deadlock."""
    store, calls = s3
    def slow_upload(**_: Any) -> None:
        threading.Event().wait(0.005)  # uploads slower than the reader: buffers run short

    store.client.meta.events.register("before-send.s3.UploadPart", slow_upload)
    feeder = Feeder()
    streams = [stream(CHUNK * 13, seed=4), stream(CHUNK * 6 + 5, seed=5)]
    concurrency = least_concurrency(2, 2)
    assert concurrency == 3
    done = threading.Event()
    result: list[Any] = []

    def go() -> None:
        upload = StagingUpload.start(
            StagingArea(store, REF), uploads_of(store), repository_id=REPOSITORY_ID, inputs=["/p0", "/p1"], chunk_size=CHUNK, level=3,
            segment_chunks=4, part_chunks=2, **options(concurrency=concurrency),
        )
        with upload:
            feeder.feed(upload, streams, pool_size=2 + concurrency + 1)
            result.append((upload, upload.finish()))
        done.set()

    worker = threading.Thread(target=go, daemon=True)
    worker.start()
    assert done.wait(60), "the reader and the uploader deadlocked (or the upload failed)"
    upload, end = result[0]
    assert reassemble(store, 0) == streams[0] and reassemble(store, 1) == streams[1]
    assert end.segments == [4, 2]
    assert feeder.peak_held <= 2 + concurrency + 1 and feeder.held == 0
    assert upload.peak_in_flight <= concurrency + 2
    # Input 0: 13 chunks in segments of 4, 4, 4 and 1 (parts 2+2, 2+2, 2+2, 1); input 1: 7 chunks, the last of
    # 5 bytes, in segments of 4 and 3 (parts 2+2, 2+1).
    assert calls.uploads_ok == 7 + 4
    assert sorted(calls.part_sizes) == sorted([2 * CHUNK] * 9 + [CHUNK, 5])


@pytest.mark.parametrize("crash_after", [1, 3, 4])
def test_resume_of_grouped_parts_sends_only_missing_parts(s3: tuple[S3Store, S3Calls], crash_after: int) -> None:
    """Killed after some 2-chunk parts were sent (mid-segment, at a segment's end): the resumed run sends only the rest."""
    store, calls = s3
    data = stream(CHUNK * 16 + 999)  # 17 chunks: segments of 4, 2-chunk parts: 2+2+2+2+1 = 9 parts
    calls.crash_after = crash_after
    with pytest.raises(Crash):
        run(store, [data], segment_chunks=4, part_chunks=2)
    stored = calls.uploads_ok
    assert stored >= crash_after - 0 and store.head(stream_end_key(REF)) is None
    calls.crash_after = None
    calls.uploads_sent = calls.uploads_ok = 0
    calls.part_sizes.clear()

    upload = resume(store, inputs=["/pipe0"])
    assert upload.part_chunks == 2  # from the session, whatever the defaults are now
    with upload:
        Feeder().feed(upload, [data])
        end = upload.finish()
    assert calls.uploads_ok == 9 - stored and upload.parts_skipped == stored
    assert end == StreamEnd(lengths=[len(data)], segments=[5])
    assert reassemble(store, 0) == data
    assert [r.chunks for r in records(store)] == [4, 4, 4, 4, 1]
    assert list(uploads_of(store).list_uploads("")) == []


def test_resume_of_grouped_parts_resends_a_part_that_differs(tmp_path: Any) -> None:
    """Over the fake: a stored 2-chunk part whose bytes differ from the re-read ones is sent again."""
    store = LocalStore(tmp_path / "repo")
    data = stream(CHUNK * 6 + 77)  # segments of 4 chunks: parts of 2 chunks, 2 + 2 of them
    uploads = CrashingMultipart(store, crash_after=1)  # one part stored (whichever was first), then the agent dies
    with pytest.raises(Crash):
        run(store, [data], uploads=uploads, part_chunks=2)
    deadline = time.monotonic() + 10  # the one part that started may still be storing when the crash reaches us
    while True:
        stored = [(u, part) for u in uploads.list_uploads("") for part in uploads.list_parts(u.key, u.upload_id)]
        if stored or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    ((open_upload, part),) = stored
    segment = int(open_upload.key.rpartition("seg")[2])
    start = segment * 4 * CHUNK + (part.number - 1) * 2 * CHUNK
    original = data[start : min(start + 2 * CHUNK, (segment + 1) * 4 * CHUNK, len(data))]
    tampered = original[:-1] + bytes([original[-1] ^ 1])
    uploads.crash_after = None
    uploads.upload_part(open_upload.key, open_upload.upload_id, part.number, [tampered], crc(tampered))
    uploads.calls.clear()
    upload = resume(store, uploads, inputs=["/pipe0"])
    with upload:
        Feeder().feed(upload, [data])
        upload.finish()
    assert uploads.calls.count("upload_part") == 4 and upload.parts_skipped == 0  # 2 + 2 parts, the differing one again
    assert reassemble(store, 0) == data


def test_a_failure_frees_the_chunks_still_waiting_for_their_part(s3: tuple[S3Store, S3Calls]) -> None:
    """Every UploadPart fails: the chunks read towards a part that is never sent go back to the reader too."""
    store, calls = s3
    calls.always_fail = True
    feeder = Feeder()
    with pytest.raises(StorageError, match="SlowDown"):
        run(store, [stream(CHUNK * 11)], part_chunks=3, feeder=feeder)
    assert feeder.held == 0 and records(store) == []


def test_a_part_body_over_several_buffers_rewinds_for_retries() -> None:
    from braid.adapters.aws.s3_body import request_body

    pieces = [memoryview(bytearray(b"abc")), b"", memoryview(b"defgh"), bytearray(b"ij")]
    body = request_body(pieces)
    assert len(body) == 10
    assert body.read(2) == b"abc"  # a read answers up to 1 MiB, within one buffer
    assert body.read() == b"defghij"
    body.seek(0)
    out = bytearray(7)
    assert body.readinto(out) == 7 and bytes(out) == b"abcdefg"
    assert [body.read(100), body.read(100), body.read(100)] == [b"h", b"ij", b""]  # one buffer per read, then the end
    body.seek(-4, io.SEEK_END)
    assert body.tell() == 6 and body.read() == b"ghij"


def _submit(upload: StagingUpload, number: int, data: bytes, released: list[int]) -> None:
    upload.submit(0, number, memoryview(bytearray(data)), lambda: released.append(number))


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_segments_upload_opens_while_its_first_chunk_is_still_being_read(tmp_path: Any) -> None:
    """With parts of 2 chunks, the first chunk of a segment opens its multipart upload, so the
    part is sent as soon as its second chunk is read; later chunks of the segment open nothing."""
    store = LocalStore(tmp_path / "repo")
    uploads = MemoryMultipart(store, min_part_size=SMALL_PART)
    data = stream(CHUNK * 5 + 9)  # segments of 4 chunks: parts 2+2, then 2 (the last one short)
    pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    released: list[int] = []
    upload = StagingUpload.start(
        StagingArea(store, REF), uploads, repository_id=REPOSITORY_ID, inputs=["/pipe0"], chunk_size=CHUNK, level=3,
        segment_chunks=4, part_chunks=2, **options(),
    )
    with upload:
        _submit(upload, 0, pieces[0], released)
        _wait_for(lambda: len(list(uploads.list_uploads(""))) == 1, "the segment's upload was not opened before its first part was complete")
        (opened,) = uploads.list_uploads("")
        assert list(uploads.list_parts(opened.key, opened.upload_id)) == [] and released == []  # nothing sent yet: the part waits for chunk 1
        for number in range(1, 5):
            _submit(upload, number, pieces[number], released)
        _wait_for(lambda: len(list(uploads.list_uploads(""))) == 1 and upload.segments_completed == 1, "segment 0 did not complete")
        _submit(upload, 5, pieces[5], released)  # the last chunk, short: its part and segment complete at the input's end
        upload.end_input(0, len(data))
        end = upload.finish()
    assert uploads.calls.count("create") == 2  # one per segment, never a second for a segment
    assert end == StreamEnd(lengths=[len(data)], segments=[2])
    assert reassemble(store, 0) == data and sorted(released) == list(range(6))
    assert list(uploads.list_uploads("")) == []


def test_an_upload_that_cannot_be_opened_stops_the_reader_with_its_error(tmp_path: Any) -> None:
    """CreateMultipartUpload refused while the first part is still being read: the next chunk raises that error, every buffer comes back."""
    store = LocalStore(tmp_path / "repo")

    class Refusing(MemoryMultipart):
        def create_upload(self, key: str) -> str:
            raise StorageError(f"access denied starting the upload of {key}")

    released: list[int] = []
    upload = StagingUpload.start(
        StagingArea(store, REF), Refusing(store, min_part_size=SMALL_PART), repository_id=REPOSITORY_ID, inputs=["/pipe0"], chunk_size=CHUNK,
        level=3, segment_chunks=4, part_chunks=2, **options(),
    )
    with pytest.raises(StorageError, match="access denied starting the upload of"):
        with upload:
            _submit(upload, 0, stream(CHUNK), released)
            _wait_for(lambda: upload.error is not None, "the refused CreateMultipartUpload was not recorded")
            _submit(upload, 1, stream(CHUNK, seed=2), released)
    assert sorted(released) == [0, 1] and records(store) == []


def test_part_layout_ramps_then_groups() -> None:
    layout = PartLayout(per_part=4, ramp=3)
    assert [layout.part_of(c) for c in range(9)] == [(1, 1), (2, 1), (3, 1), (4, 4), (4, 4), (4, 4), (4, 4), (5, 4), (5, 4)]
    assert [layout.first_chunk(p) for p in (1, 2, 3, 4, 5, 6)] == [0, 1, 2, 3, 7, 11]
    assert [layout.parts(n) for n in (0, 1, 3, 4, 7, 8, 32)] == [0, 1, 3, 4, 4, 5, 11]
    assert PartLayout(per_part=3).part_of(7) == (3, 3) and PartLayout(per_part=3).first_chunk(3) == 6  # no ramp: as before


def test_the_default_ramp_fills_the_pipe_from_the_same_buffers() -> None:
    """At the defaults (4-chunk parts) the whole first segment goes one chunk per part; one-chunk parts get no ramp."""
    segment = default_segment_chunks(64 * 1024**2)
    assert default_ramp_parts(default_part_chunks(64 * 1024**2, 1, DEFAULT_CONCURRENCY), segment) == segment == 32
    assert default_ramp_parts(1, 32) == 0
    assert default_ramp_parts(4, 8) == 8  # never more than a segment's chunks


def test_start_records_the_default_ramp_in_the_session(s3: tuple[S3Store, S3Calls]) -> None:
    store, _ = s3
    upload = StagingUpload.start(
        StagingArea(store, REF), uploads_of(store), repository_id=REPOSITORY_ID, inputs=["/p0"], chunk_size=64 * 1024**2, level=3,
        **options(concurrency=DEFAULT_CONCURRENCY, min_part_size=5 * 1024**2),
    )
    upload.abort()
    session = SessionRecord.from_bytes(store.get(session_key(REF)))
    assert (session.part_chunks, session.ramp_parts) == (4, default_segment_chunks(64 * 1024**2))  # the whole first segment


def test_the_part_ramp_policy_is_switched_off_by_no_part_ramp_and_the_session_records_it(s3: tuple[S3Store, S3Calls]) -> None:
    from braid.agent.cloud_engine import CloudOptions
    from braid.cli.parser import build_parser

    args = build_parser().parse_args(["backup", "--name", "db", "--no-part-ramp", "-"])
    assert CloudOptions.from_cli(args).part_ramp is False
    assert CloudOptions.from_cli(build_parser().parse_args(["backup", "--name", "db", "-"])).part_ramp is True
    store, _ = s3
    upload = StagingUpload.start(
        StagingArea(store, REF), uploads_of(store), repository_id=REPOSITORY_ID, inputs=["/p0"], chunk_size=64 * 1024**2, level=3,
        ramp_parts=0, **options(concurrency=DEFAULT_CONCURRENCY, min_part_size=5 * 1024**2),
    )
    upload.abort()
    session = SessionRecord.from_bytes(store.get(session_key(REF)))
    assert (session.part_chunks, session.ramp_parts) == (4, 0)  # full-size parts from the first chunk, as recorded
    assert PartLayout(session.part_chunks, session.ramp_parts).part_of(0) == (1, 4)


def test_session_keeps_ramp_parts_and_reads_sessions_without_it() -> None:
    ramped = SessionRecord(str(REF), REPOSITORY_ID, CHUNK, 8, 3, ["-"], "now", part_chunks=4, ramp_parts=11)
    assert SessionRecord.from_bytes(ramped.to_bytes()) == ramped
    before = SessionRecord(str(REF), REPOSITORY_ID, CHUNK, 8, 3, ["-"], "now", part_chunks=4)
    doc = json.loads(before.to_bytes())
    del doc["ramp_parts"]  # as an agent without the ramp wrote it
    assert SessionRecord.from_bytes(json.dumps(doc).encode()).ramp_parts == 0
    with pytest.raises(IntegrityError, match="impossible settings"):
        SessionRecord(str(REF), REPOSITORY_ID, CHUNK, 4, 3, ["-"], "now", ramp_parts=-1).check(REF, "session.json")


def _ramped(store: ObjectStore, data: bytes, uploads: MultipartStore | None = None) -> tuple[StagingUpload, StreamEnd]:
    upload = StagingUpload.start(
        StagingArea(store, REF), uploads or uploads_of(store), repository_id=REPOSITORY_ID, inputs=["/pipe0"], chunk_size=CHUNK, level=3,
        segment_chunks=8, part_chunks=2, ramp_parts=3, **options(concurrency=least_concurrency(1, 2)),
    )
    with upload:
        Feeder().feed(upload, [data])
        end = upload.finish()
    return upload, end


# 13 chunks (the last short) in segments of 8: segment 0 is 3 one-chunk parts then 2-chunk parts (2, 2, 1);
# segment 1 (5 chunks) has no ramp: 2, 2, and the short one.
RAMPED_SIZES = [CHUNK] * 3 + [2 * CHUNK] * 2 + [CHUNK] + [2 * CHUNK] * 2 + [777]


def test_a_stream_starts_with_one_chunk_parts_then_larger_ones(s3: tuple[S3Store, S3Calls]) -> None:
    store, calls = s3
    data = stream(CHUNK * 12 + 777)
    upload, end = _ramped(store, data)
    assert reassemble(store, 0) == data and end == StreamEnd(lengths=[len(data)], segments=[2])
    assert sorted(calls.part_sizes) == sorted(RAMPED_SIZES) and calls.uploads_ok == len(RAMPED_SIZES)
    assert [r.chunks for r in records(store)] == [8, 5]  # the records count chunks, whatever the parts: the worker's view is unchanged
    for r in records(store):
        segment = store.get(r.key)
        assert r.checksum == stored_checksum(segment) and store.head(r.key).checksum == r.checksum  # type: ignore[union-attr]
        assert [f"crc64nvme:{c}" for c in r.chunk_checksums] == [stored_checksum(segment[i : i + CHUNK]) for i in range(0, len(segment), CHUNK)]
    assert upload.peak_in_flight <= upload.max_in_flight


@pytest.mark.parametrize("crash_after", [2, 4, 7])
def test_resume_of_a_ramped_upload_sends_only_missing_parts(s3: tuple[S3Store, S3Calls], crash_after: int) -> None:
    """Killed inside the ramp, just after it, in the second segment: the resumed run regroups the re-read chunks the same way."""
    store, calls = s3
    data = stream(CHUNK * 12 + 777)
    calls.crash_after = crash_after
    with pytest.raises(Crash):
        _ramped(store, data)
    stored = calls.uploads_ok
    calls.crash_after = None
    calls.uploads_sent = calls.uploads_ok = 0
    calls.part_sizes.clear()
    upload = resume(store, inputs=["/pipe0"], concurrency=least_concurrency(1, 2))
    assert upload.session.ramp_parts == 3
    with upload:
        Feeder().feed(upload, [data])
        end = upload.finish()
    assert calls.uploads_ok == len(RAMPED_SIZES) - stored and upload.parts_skipped == stored
    assert end == StreamEnd(lengths=[len(data)], segments=[2]) and reassemble(store, 0) == data
    assert list(uploads_of(store).list_uploads("")) == []
