"""The synthesized state machine, executed by moto with the handlers in-process.

The definition is the one CDK synthesizes (tests/support/moto_stack renders
its references to the moto resources); moto's Step Functions parser runs it
and invokes the real handlers through tests/support/inprocess_lambda.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import moto.s3.models
import pytest
from aws_cdk import Duration
from moto import mock_aws

from braid.adapters.aws.kms import KmsKeyService
from braid.adapters.aws.s3 import S3Store
from braid.adapters.aws.stepfunctions import StepFunctionsExecutions
from braid.agent.wake import PipelineWaker
from braid.errors import StorageError
from braid.format.checksum import s3_checksum_value, stored_checksum
from braid.format.chunk import ChunkCodec
from braid.format.ids import BackupRef
from braid.format.layout import chunk_key, data_prefix, manifest_key, staging_prefix
from braid.format.repository import Repository, RepositoryConfig
from braid.format.staging import HoldRecord, ResumeRequest, SegmentRecord, SessionRecord, StagingArea, StreamEnd, WakeRecord, segment_key
from braid.format.timestamps import utc_now
from braid.ops.verify import verify_backup
from braid.pipeline.execution_input import ExecutionInput, execution_name
from braid.pipeline.pacing import ROUND_TARGET_CHUNKS
from support.inprocess_lambda import InProcessLambdas
from support.moto_stack import DeployedStack, SynthesizedStack, deploy, synthesize
from support.s3_lock_semantics import AwsObjectLock
from support.sfn_semantics import AwsStepFunctions

pytestmark = pytest.mark.cloud

CHUNK = 4096
REGION = "us-east-1"


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedStack:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "infra"))
    from braid_infra.pipeline import RetryPolicy

    fast = RetryPolicy(interval=Duration.seconds(1), max_attempts=3, backoff_rate=1.0, max_delay=Duration.seconds(1))
    return synthesize(tmp_path_factory.mktemp("cdk.out"), worker_retry=fast, step_retry=fast)


class Cloud:
    def __init__(self, session: Any, deployed: DeployedStack, lambdas: InProcessLambdas) -> None:
        self.session = session
        self.deployed = deployed
        self.lambdas = lambdas
        self.s3 = session.client("s3")
        self.sfn = session.client("stepfunctions")
        self.store = S3Store(self.s3, deployed.bucket, "")
        self.keys = KmsKeyService(session.client("kms"), deployed.key_arn)
        self.repository = Repository.create(
            self.store, RepositoryConfig.new(key={"type": "kms", "key_id": deployed.key_arn}, created=utc_now())
        )
        # Like the agent, the harness wakes a sleeping pipeline (braid.agent.wake) after each record it stages and while it waits.
        self.executions = StepFunctionsExecutions(self.sfn, deployed.state_machine_arn)
        self.recorded: dict[str, int] = {}
        self.ended: set[str] = set()
        self.started: dict[str, BackupRef] = {}
        self.wakers: dict[str, PipelineWaker] = {}

    def waker(self, ref: BackupRef) -> PipelineWaker:
        name = str(ref)
        if name not in self.wakers:
            area = StagingArea(self.store, ref)
            self.wakers[name] = PipelineWaker(area, self.executions, lambda: self.recorded.get(name, 0), lambda: name in self.ended)
        return self.wakers[name]

    # -- the agent's side of the staging contract, written directly -----------------
    def stage_session(self, ref: BackupRef, inputs: int, segment_chunks: int) -> None:
        session = SessionRecord(str(ref), self.repository.config.id, CHUNK, segment_chunks, 3, [f"pipe{i}" for i in range(inputs)], utc_now())
        StagingArea(self.store, ref).write_session(session)

    def stage_segment(self, ref: BackupRef, input_index: int, segment: int, offset: int, data: bytes, *, wake: bool = True) -> None:
        key = segment_key(ref, input_index, segment)
        upload = self.s3.create_multipart_upload(Bucket=self.deployed.bucket, Key=key)["UploadId"]
        parts = []
        for number, start in enumerate(range(0, len(data), CHUNK), start=1):
            etag = self.s3.upload_part(
                Bucket=self.deployed.bucket, Key=key, UploadId=upload, PartNumber=number, Body=data[start : start + CHUNK]
            )["ETag"]
            parts.append({"ETag": etag, "PartNumber": number})
        self.s3.complete_multipart_upload(Bucket=self.deployed.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
        chunk_checksums = [s3_checksum_value(stored_checksum(data[start : start + CHUNK])) for start in range(0, len(data), CHUNK)]
        record = SegmentRecord(input_index, segment, key, offset, len(data), len(parts), stored_checksum(data), chunk_checksums)
        StagingArea(self.store, ref).write_segment_record(record)
        self.recorded[str(ref)] = self.recorded.get(str(ref), 0) + record.chunks
        if wake:
            self.waker(ref).poke()

    def stage_input(self, ref: BackupRef, input_index: int, data: bytes, segment_chunks: int, first_segment: int = 0) -> int:
        size = CHUNK * segment_chunks
        segments = 0
        for segment, start in enumerate(range(0, len(data), size)):
            if segment >= first_segment:
                self.stage_segment(ref, input_index, segment, start, data[start : start + size])
            segments += 1
        return segments

    def stage_end(self, ref: BackupRef, inputs: list[bytes], segment_chunks: int, *, wake: bool = True) -> None:
        counts = [-(-len(d) // (CHUNK * segment_chunks)) for d in inputs]
        StagingArea(self.store, ref).write_stream_end(StreamEnd([len(d) for d in inputs], counts))
        self.ended.add(str(ref))
        if wake:
            self.waker(ref).poke()

    def stage_backup(self, ref: BackupRef, inputs: list[bytes], segment_chunks: int) -> None:
        self.stage_session(ref, len(inputs), segment_chunks)
        for index, data in enumerate(inputs):
            self.stage_input(ref, index, data, segment_chunks)
        self.stage_end(ref, inputs, segment_chunks)

    # -- the pipeline --------------------------------------------------------------
    def start(self, ref: BackupRef, **options: Any) -> str:
        request = ExecutionInput(backup=str(ref), **{"poll_seconds": 1, "stall_seconds": 30, **options})
        arn = self.sfn.start_execution(
            stateMachineArn=self.deployed.state_machine_arn, name=execution_name(ref), input=json.dumps(request.to_json())
        )["executionArn"]
        self.started[arn] = ref
        return str(arn)

    def wait(self, arn: str, timeout: float = 90, *, wake: bool = True) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            described = self.sfn.describe_execution(executionArn=arn)
            if described["status"] != "RUNNING":
                return described
            if arn in self.started and wake:
                self.waker(self.started[arn]).poke()
            time.sleep(0.2)
        raise AssertionError(f"execution {arn} still running after {timeout} s")

    def failures(self, arn: str) -> list[str]:
        """The failure events of an execution, for assertion messages."""
        events = self.sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
        found = []
        for event in events:
            for name, detail in event.items():
                if name.endswith("EventDetails") and isinstance(detail, dict) and ("error" in detail or "cause" in detail):
                    found.append(f"{event['type']}: {detail.get('error')}: {str(detail.get('cause'))[:400]}")
        return found

    def keys_under(self, prefix: str) -> list[str]:
        return [info.key for info in self.store.list(prefix)]

    def staging_versions(self, prefix: str) -> list[str]:
        """Old versions and delete markers the versioned bucket still holds: raw database bytes."""
        listing = self.s3.list_object_versions(Bucket=self.deployed.bucket, Prefix=prefix)
        return [v["Key"] for v in listing.get("Versions", []) + listing.get("DeleteMarkers", [])]

    def open_uploads(self, prefix: str) -> list[str]:
        return [u["Key"] for u in self.s3.list_multipart_uploads(Bucket=self.deployed.bucket, Prefix=prefix).get("Uploads", [])]

    def restore(self, ref: BackupRef) -> list[bytes]:
        """Decode every chunk of the published backup (authenticated, checksummed), per input."""
        sealed = self.repository.load(ref)
        key = self.keys.unwrap(sealed.manifest.key)
        manifest = sealed.authenticate(key)
        codec = ChunkCodec(key)
        outputs = []
        for entry in manifest.inputs:
            parts = [
                codec.decode(
                    self.store.get_range(chunk_key(ref, c.pack), c.pack_offset, c.stored_length),  # the frame, in its pack
                    backup=str(ref),
                    index=c.index,
                    input_index=c.input_index,
                    plaintext_length=c.length,
                    plaintext_mac=c.mac,
                )
                for c in entry.chunks
            ]
            outputs.append(b"".join(parts))
        return outputs


@contextmanager
def in_process_cloud(synthesized: SynthesizedStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    """`synthesized` deployed into moto, its state machine executed with the handlers in-process."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 256)
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}), AwsStepFunctions(), AwsObjectLock(), InProcessLambdas() as lambdas:
        session = boto3.session.Session(region_name=REGION)
        yield Cloud(session, deploy(synthesized, session), lambdas)


@pytest.fixture
def cloud(synthesized: SynthesizedStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    with in_process_cloud(synthesized, monkeypatch) as emulated:
        yield emulated


def pattern(size: int, seed: int) -> bytes:
    """Compressible but not trivial: distinct per input, so swapped chunks would show."""
    line = f"row {seed:04d} ".encode()
    return (line * (size // len(line) + 1))[:size]


def test_staged_backup_is_published_and_decodes_to_the_original_bytes(cloud: Cloud) -> None:
    ref = BackupRef.new("db")
    inputs = [pattern(CHUNK * 5 + 123, 1), pattern(CHUNK * 2, 2)]
    segment_chunks = 2
    # The agent is still uploading when the pipeline starts: only input 1's
    # first segment is there, so the first round maps while the rest uploads.
    cloud.stage_session(ref, 2, segment_chunks)
    cloud.stage_segment(ref, 1, 0, 0, inputs[1][: CHUNK * 2])
    arn = cloud.start(ref, max_concurrency=2)
    # Stage the rest only once the first round's map has started, however
    # slow the machine: a sleep here made the test depend on load.
    deadline = time.monotonic() + 60
    while not map_runs(cloud, arn):
        assert time.monotonic() < deadline, "the first segment was never fanned out"
        time.sleep(0.1)
    cloud.stage_input(ref, 0, inputs[0], segment_chunks)
    cloud.stage_end(ref, inputs, segment_chunks)

    result = cloud.wait(arn)

    assert result["status"] == "SUCCEEDED", cloud.failures(arn)
    output = json.loads(result["output"])
    assert output["summary"]["chunks"] == 8 and output["summary"]["plaintext_bytes"] == sum(map(len, inputs))
    assert cloud.restore(ref) == inputs
    assert cloud.store.head(manifest_key(ref)) is not None
    assert cloud.keys_under(staging_prefix(ref)) == []
    assert cloud.open_uploads(staging_prefix(ref)) == []
    assert cloud.staging_versions(staging_prefix(ref)) == []  # no plaintext kept as old versions either
    # More than one round ran: fan-out began before the stream ended.
    assert rounds(cloud, arn) >= 2


def rounds(cloud: Cloud, arn: str) -> int:
    """Rounds: Distributed Map runs."""
    history = cloud.sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    entered = [e["stateEnteredEventDetails"]["name"] for e in history if e["type"] == "MapStateEntered"]
    return sum(1 for name in entered if name == "ProcessChunks")


def sleeping(cloud: Cloud, ref: BackupRef, arn: str) -> WakeRecord:
    """Wait until the pipeline sleeps (its wake record is in staging); the record."""
    deadline = time.monotonic() + 60
    while (record := StagingArea(cloud.store, ref).read_wake()) is None:
        assert time.monotonic() < deadline, f"the pipeline never slept: {cloud.failures(arn)}"
        time.sleep(0.1)
    return record


def sleep_outcomes(cloud: Cloud, arn: str) -> list[str]:
    """How each SleepUntilWoken ended: TaskSucceeded (woken) or TaskTimedOut (its timeout)."""
    history = cloud.sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    found, inside = [], False
    for event in history:
        if event["type"] == "TaskStateEntered":
            inside = event["stateEnteredEventDetails"]["name"] == "SleepUntilWoken"
        elif inside and event["type"] in ("TaskSucceeded", "TaskTimedOut", "TaskFailed"):
            found.append(event["type"])
            inside = False
    return found


def test_a_sleeping_pipeline_is_woken_by_the_agent_once_the_stream_ends(cloud: Cloud) -> None:
    """While the stream arrives slowly the planner sleeps (no Lambda billed): SleepUntilWoken leaves its task token in
    staging, and the agent's wake at the stream's end continues the backup at once."""
    ref = BackupRef.new("db")
    data = pattern(CHUNK * 4, 5)
    cloud.stage_session(ref, 1, 2)
    cloud.stage_segment(ref, 0, 0, 0, data[: CHUNK * 2])
    arn = cloud.start(ref)
    record = sleeping(cloud, ref, arn)
    # The first round took the 2 recorded chunks; the next is due at ROUND_TARGET_CHUNKS more (or at the end).
    assert record.chunks == 2 + ROUND_TARGET_CHUNKS and record.token
    cloud.stage_segment(ref, 0, 1, CHUNK * 2, data[CHUNK * 2 :])
    assert cloud.waker(ref).wakes == 0  # 2 more chunks: not what it sleeps for
    cloud.stage_end(ref, [data], 2)
    assert cloud.waker(ref).wakes == 1  # the end always wakes it

    result = cloud.wait(arn, wake=False)

    assert result["status"] == "SUCCEEDED", cloud.failures(arn)
    assert sleep_outcomes(cloud, arn)[0] == "TaskSucceeded"
    assert cloud.restore(ref) == [data]
    assert cloud.keys_under(staging_prefix(ref)) == []  # the wake record goes with staging


def test_a_pipeline_nobody_wakes_looks_again_at_its_sleeps_timeout(cloud: Cloud) -> None:
    """A wake is never needed for correctness: with an agent that never sends the token, the sleep times out
    (within a quarter of the stall window) and the planner finds the stream's end itself."""
    ref = BackupRef.new("db")
    data = pattern(CHUNK * 4, 6)
    cloud.stage_session(ref, 1, 2)
    cloud.stage_segment(ref, 0, 0, 0, data[: CHUNK * 2])
    arn = cloud.start(ref)
    sleeping(cloud, ref, arn)
    cloud.stage_segment(ref, 0, 1, CHUNK * 2, data[CHUNK * 2 :], wake=False)
    cloud.stage_end(ref, [data], 2, wake=False)

    result = cloud.wait(arn, wake=False)

    assert result["status"] == "SUCCEEDED", cloud.failures(arn)
    assert sleep_outcomes(cloud, arn)[0] == "TaskTimedOut"
    assert cloud.restore(ref) == [data]


def map_runs(cloud: Cloud, arn: str) -> int:
    history = cloud.sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    return sum(1 for e in history if e["type"] == "MapRunStarted")


def test_a_worker_that_fails_once_is_retried_and_the_backup_succeeds(cloud: Cloud) -> None:
    ref = BackupRef.new("db")
    inputs = [pattern(CHUNK * 3, 3)]
    cloud.stage_backup(ref, inputs, segment_chunks=4)
    worker = cloud.deployed.functions["worker"]
    cloud.lambdas.fail(worker, lambda: StorageError("S3 kept throttling (SlowDown) after retries"), times=1)

    result = cloud.wait(cloud.start(ref, max_concurrency=1, max_chunks_per_item=1))

    assert result["status"] == "SUCCEEDED", cloud.failures(result["executionArn"])
    assert cloud.lambdas.invocation_count(worker) == 3 + 1
    assert cloud.restore(ref) == inputs


def wait_for_hold(cloud: Cloud, ref: BackupRef, arn: str, timeout: float = 90) -> HoldRecord:
    deadline = time.monotonic() + timeout
    while (hold := StagingArea(cloud.store, ref).read_hold()) is None:
        assert cloud.sfn.describe_execution(executionArn=arn)["status"] == "RUNNING", cloud.failures(arn)
        assert time.monotonic() < deadline, "the backup was never held"
        time.sleep(0.2)
    return hold


def items_seen(cloud: Cloud) -> list[int]:
    """First chunk index of every worker invocation from now on (a fault that never fires, only watches)."""
    seen: list[int] = []
    cloud.lambdas.fail(cloud.deployed.functions["worker"], lambda: AssertionError("never raised"), times=None,
                       when=lambda e: seen.append(int(e["item"]["first_index"])) and False)
    return seen


def test_a_worker_that_keeps_failing_holds_the_backup_and_resume_finishes_only_what_is_missing(cloud: Cloud) -> None:
    ref = BackupRef.new("db")
    inputs = [pattern(CHUNK * 4, 4)]
    cloud.stage_backup(ref, inputs, segment_chunks=2)
    worker = cloud.deployed.functions["worker"]
    seen = items_seen(cloud)
    # Only the items of the second segment fail: the first segment's chunks get stored and stay.
    failing = cloud.lambdas.fail(worker, lambda: StorageError("S3 refused writing: InternalError"), times=None, when=lambda e: e["item"]["seg"] == 1)

    arn = cloud.start(ref, max_concurrency=2, max_chunks_per_item=1)
    hold = wait_for_hold(cloud, ref, arn)

    # (The fault is raised before the handler runs, so no worker wrote a failure record to name:
    # tests/cloud/test_pipeline_plan.py checks that a recorded worker error becomes the cause.)
    assert hold.cause.startswith("chunks 2..2: no result after every retry") and hold.items == 2
    assert cloud.keys_under(data_prefix(ref)) == [chunk_key(ref, 0), chunk_key(ref, 1)]  # finished work is kept
    assert cloud.store.head(segment_key(ref, 0, 0)) is None  # its raw bytes need not wait
    assert cloud.store.head(segment_key(ref, 0, 1)) is not None  # the unfinished segment's stay for the resume
    assert sorted(seen).count(0) == 1 and sorted(seen).count(1) == 1  # each finished item ran once
    assert sorted(seen).count(2) >= 3  # the failing ones: mapped, then planned again twice
    failing.times = 0  # healed

    StagingArea(cloud.store, ref).write_resume_request(ResumeRequest("resume-1"))  # what `braid backup --resume` writes
    result = cloud.wait(arn)

    assert result["status"] == "SUCCEEDED", cloud.failures(arn)
    assert sorted(seen).count(0) == 1 and sorted(seen).count(1) == 1  # nothing finished was processed again
    assert cloud.restore(ref) == inputs
    assert cloud.keys_under(staging_prefix(ref)) == [] and cloud.staging_versions(staging_prefix(ref)) == []


def test_many_items_failing_with_long_errors_are_planned_again_not_a_map_past_its_size_quota(cloud: Cloud) -> None:
    """Review 3, M1: a failed child's execution result (input, error, cause) in the map's output would take it past
    262,144 bytes (the emulator fails such a map with States.DataLimitExceeded, support.sfn_semantics), which holds
    the backup at once, skipping the re-plans. Each failed child ends in ItemFailed ({}) instead."""
    ref = BackupRef.new("db")
    inputs = [pattern(CHUNK * 4, 10)]
    cloud.stage_backup(ref, inputs, segment_chunks=2)
    worker = cloud.deployed.functions["worker"]
    seen = items_seen(cloud)
    long_error = "S3 refused writing: InternalError " + "and said much more " * 7_000  # ~130 KB per failed item
    cloud.lambdas.fail(worker, lambda: StorageError(long_error), times=None, when=lambda e: e["item"]["seg"] == 1)

    arn = cloud.start(ref, max_concurrency=2, max_chunks_per_item=1)
    hold = wait_for_hold(cloud, ref, arn)

    assert hold.cause.startswith("chunks 2..2: no result after every retry") and hold.items == 2, hold  # not "ProcessChunks failed"
    assert sorted(seen).count(2) >= 3 and sorted(seen).count(3) >= 3  # mapped, then planned again twice
    assert not [f for f in cloud.failures(arn) if "DataLimitExceeded" in f]
    StagingArea(cloud.store, ref).write_stream_end(StreamEnd([len(inputs[0])], [2], abandoned="given up"))
    assert cloud.wait(arn)["status"] == "FAILED"


def test_a_failed_backup_leaves_no_staging_object_version_or_upload_on_the_versioned_bucket(cloud: Cloud) -> None:
    """Issue 22 item 6, the failed case: an agent that stops uploading fails the backup (StagingStalledError, which
    never holds); Cleanup removes its staging by version id, its open upload and its chunks."""
    ref = BackupRef.new("db")
    cloud.stage_session(ref, 1, segment_chunks=2)
    data = pattern(CHUNK * 2, 13)
    cloud.stage_segment(ref, 0, 0, 0, data)
    cloud.stage_segment(ref, 0, 0, 0, data)  # a retried upload: its first version is noncurrent now
    cloud.s3.create_multipart_upload(Bucket=cloud.deployed.bucket, Key=segment_key(ref, 0, 1))  # the agent died mid-upload
    assert len(cloud.staging_versions(staging_prefix(ref))) > len(cloud.keys_under(staging_prefix(ref)))

    arn = cloud.start(ref, stall_seconds=2)
    result = cloud.wait(arn, wake=False)

    assert result["status"] == "FAILED" and result["error"] == "StagingStalledError", (result, cloud.failures(arn))
    assert cloud.store.head(manifest_key(ref)) is None and cloud.keys_under(data_prefix(ref)) == []
    assert cloud.keys_under(staging_prefix(ref)) == [] and cloud.staging_versions(staging_prefix(ref)) == []
    assert cloud.open_uploads(staging_prefix(ref)) == []


def test_an_abandoned_hold_fails_the_backup_cleanly(cloud: Cloud) -> None:
    ref = BackupRef.new("db")
    inputs = [pattern(CHUNK * 4, 4)]
    cloud.stage_backup(ref, inputs, segment_chunks=2)
    # A stray upload the agent left behind must be aborted too.
    cloud.s3.create_multipart_upload(Bucket=cloud.deployed.bucket, Key=segment_key(ref, 0, 7))
    worker = cloud.deployed.functions["worker"]
    cloud.lambdas.fail(worker, lambda: StorageError("S3 refused writing: InternalError"), times=None, when=lambda e: e["item"]["seg"] == 1)
    arn = cloud.start(ref, max_concurrency=2, max_chunks_per_item=1)
    wait_for_hold(cloud, ref, arn)

    # The explicit abandon: what the agent writes when it gives the stream up.
    StagingArea(cloud.store, ref).write_stream_end(StreamEnd([len(inputs[0])], [2], abandoned="the operator gave the backup up"))
    result = cloud.wait(arn)

    assert result["status"] == "FAILED", result
    assert result["error"] == "StreamAbandonedError" and "the operator gave the backup up" in result["cause"]
    assert "Nothing was published" in result["cause"]
    assert cloud.store.head(manifest_key(ref)) is None
    assert cloud.keys_under(data_prefix(ref)) == []
    assert cloud.keys_under(staging_prefix(ref)) == []
    assert cloud.open_uploads(staging_prefix(ref)) == []
    assert cloud.staging_versions(staging_prefix(ref)) == []  # no plaintext kept as old versions either
    assert cloud.lambdas.invocation_count(cloud.deployed.functions["cleanup"]) == 1


def invoke_worker(cloud: Cloud, ref: BackupRef, item: dict[str, Any]) -> dict[str, Any]:
    event = {"backup": str(ref), "prefix": "", "repository": cloud.repository.config.id, "level": 3, "item": item}
    response = cloud.session.client("lambda").invoke(FunctionName=cloud.deployed.functions["worker"], Payload=json.dumps(event))
    payload = json.loads(response["Payload"].read() or b"null")
    return {"error": response.get("FunctionError"), "payload": payload}


def test_a_late_or_retried_worker_cannot_replace_a_published_chunk(cloud: Cloud) -> None:
    ref = BackupRef.new("db")
    inputs = [pattern(CHUNK * 3, 5)]
    cloud.stage_backup(ref, inputs, segment_chunks=3)
    assert cloud.wait(cloud.start(ref))["status"] == "SUCCEEDED"
    published = {i: cloud.store.get(chunk_key(ref, i)) for i in range(3)}
    manifest = cloud.repository.load(ref).manifest
    # The items as the planner made them: three chunks after stream end spread over the workers, one each
    # (a retried worker forms the same packs as the first attempt: the round file fixes the items).
    assert {c.pack for c in manifest.chunks()} == {0, 1, 2}

    def items_for(data: bytes) -> list[dict[str, object]]:
        crcs = [s3_checksum_value(stored_checksum(data[i : i + CHUNK])) for i in range(0, len(data), CHUNK)]
        return [{"segment": segment_key(ref, 0, 0), "input": 0, "seg": 0, "seg_offset": 0, "seg_length": CHUNK * 3,
                 "chunk_size": CHUNK, "first_chunk": n + 1, "count": 1, "first_index": n, "crc": [crcs[n]], "packs": [1]} for n in range(3)]

    StagingArea(cloud.store, ref).write_wrapped_key(manifest.key)

    # A retried worker with the same bytes: accepted, the stored chunks untouched.
    cloud.stage_segment(ref, 0, 0, 0, inputs[0])
    assert [invoke_worker(cloud, ref, item)["error"] for item in items_for(inputs[0])] == [None, None, None]
    # Grouped otherwise (an item of all three: packs of 2 and 1), even of the same bytes: never accepted over the stored chunk.
    regrouped = {**items_for(inputs[0])[0], "count": 3, "packs": [2, 1], "crc": [items_for(inputs[0])[n]["crc"][0] for n in range(3)]}
    refused = invoke_worker(cloud, ref, regrouped)
    assert refused["error"] and refused["payload"]["errorType"] == "IntegrityError"
    assert "(chunks 0-1) already exists with different content" in refused["payload"]["errorMessage"]
    # Staged bytes that changed under a planned item: refused before encoding.
    other = pattern(CHUNK * 3, 6)
    cloud.stage_segment(ref, 0, 0, 0, other)
    changed = invoke_worker(cloud, ref, items_for(inputs[0])[0])
    assert changed["error"] and "does not match the checksum the agent recorded" in changed["payload"]["errorMessage"]
    # A late worker of another attempt, with different bytes: refused, the stored chunks untouched.
    late = invoke_worker(cloud, ref, items_for(other)[1])

    assert late["error"] and late["payload"]["errorType"] == "IntegrityError"
    assert "already exists with different content" in late["payload"]["errorMessage"]
    assert {i: cloud.store.get(chunk_key(ref, i)) for i in range(3)} == published
    key = cloud.keys.unwrap(manifest.key)
    assert verify_backup(cloud.store, cloud.repository.load(ref).authenticate(key), key, deep=True).ok


def test_a_worker_error_reaches_the_failed_executions_cause(cloud: Cloud) -> None:
    """Not the map's generic error: the worker's own, from the failure record it left in staging."""
    ref = BackupRef.new("db")
    inputs = [pattern(CHUNK * 4, 7)]
    cloud.stage_backup(ref, inputs, segment_chunks=2)
    # The second segment's bytes change after the agent recorded their checksums.
    cloud.s3.put_object(Bucket=cloud.deployed.bucket, Key=segment_key(ref, 0, 1), Body=pattern(CHUNK * 2, 8))

    arn = cloud.start(ref, max_concurrency=2, max_chunks_per_item=1)
    hold = wait_for_hold(cloud, ref, arn)
    # Held first (what the agent prints), then given up: the failed execution names it too.
    assert hold.cause.startswith("chunks 2..2: IntegrityError:") and "does not match the checksum the agent recorded" in hold.cause
    StagingArea(cloud.store, ref).write_stream_end(StreamEnd([len(inputs[0])], [2], abandoned="given up"))
    result = cloud.wait(arn)

    assert result["status"] == "FAILED", result
    assert "The first failed worker (chunks 2..2: IntegrityError:" in result["cause"], result["cause"]
    assert "does not match the checksum the agent recorded" in result["cause"]
    assert cloud.keys_under(staging_prefix(ref)) == []  # the failure records went with the rest of staging
    assert cloud.staging_versions(staging_prefix(ref)) == []  # ...and every version of them (issue 22 item 6)


def test_an_execution_named_after_another_backup_touches_nothing_of_the_one_it_names(cloud: Cloud) -> None:
    """A host starting an execution with another host's in-flight backup as input (even claiming
    its name in the input) cannot make the pipeline process it nor Cleanup delete it."""
    victim = BackupRef.new("db")
    inputs = [pattern(CHUNK * 3, 9)]
    cloud.stage_backup(victim, inputs, segment_chunks=2)
    cloud.store.put(chunk_key(victim, 0), b"a chunk a worker of the victim already stored")
    before = {key: cloud.store.get(key) for key in cloud.keys_under("")}
    intruder = BackupRef.new("other")
    forged = {**ExecutionInput(backup=str(victim), poll_seconds=1, stall_seconds=30).to_json(), "execution": {"name": str(victim)}}

    arn = cloud.sfn.start_execution(stateMachineArn=cloud.deployed.state_machine_arn, name=execution_name(intruder), input=json.dumps(forged))["executionArn"]
    result = cloud.wait(arn)

    assert result["status"] == "FAILED", result
    assert result["error"] == "ExecutionMismatchError", result
    assert "nothing of" in result["cause"] and str(victim) in result["cause"]
    assert {key: cloud.store.get(key) for key in cloud.keys_under("")} == before  # no key.json, no round, nothing deleted
    assert cloud.lambdas.invocation_count(cloud.deployed.functions["worker"]) == 0


def status_change(cloud: Cloud, name: str, request: ExecutionInput, status: str = "TIMED_OUT") -> dict[str, Any]:
    """Step Functions' EventBridge event for a Standard execution's status change, as AWS documents it
    (Step Functions User Guide, "Execution status change" events)."""
    machine = cloud.deployed.state_machine_arn
    execution = machine.replace(":stateMachine:", ":execution:") + f":{name}"
    return {
        "version": "0", "id": "315c1398-40ff-a850-213b-158f73e60175", "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states", "account": "123456789012", "time": "2026-11-28T18:00:00Z", "region": REGION, "resources": [execution],
        "detail": {
            "executionArn": execution, "stateMachineArn": machine, "name": name, "status": status,
            "startDate": 1764280800000, "stopDate": 1764885600000, "input": json.dumps(request.to_json()), "output": None,
            "inputDetails": {"included": True}, "outputDetails": None, "error": "States.Timeout", "cause": None,
        },
    }


def test_a_timed_out_execution_is_cleaned_up_by_its_status_change_event(cloud: Cloud) -> None:
    """Review 3, M4: an execution past its 7-day timeout runs no Catch; the stack's EventBridge rule sends its
    TIMED_OUT event to Cleanup (braid_infra.timeouts), which removes its staging (every version), uploads and chunks."""
    ref = BackupRef.new("db")
    cloud.stage_session(ref, 1, segment_chunks=2)
    data = pattern(CHUNK * 2, 11)
    cloud.stage_segment(ref, 0, 0, 0, data)
    cloud.stage_segment(ref, 0, 0, 0, data)  # a retried upload: a noncurrent version too
    cloud.s3.create_multipart_upload(Bucket=cloud.deployed.bucket, Key=segment_key(ref, 0, 1))  # the upload in flight
    cloud.store.put(chunk_key(ref, 0), b"a pack a worker stored")
    request = ExecutionInput(backup=str(ref), poll_seconds=1, stall_seconds=30)
    lambda_client = cloud.session.client("lambda")

    response = lambda_client.invoke(FunctionName=cloud.deployed.functions["cleanup"], Payload=json.dumps(status_change(cloud, str(ref), request)))
    failure = json.loads(response["Payload"].read())

    assert "FunctionError" not in response, failure
    assert failure["error"] == "ExecutionTimedOut" and f"backup {ref} failed (ExecutionTimedOut)" in failure["cause"]
    assert "ran past its time limit" in failure["cause"] and "Nothing was published" in failure["cause"]
    assert cloud.keys_under(staging_prefix(ref)) == [] and cloud.staging_versions(staging_prefix(ref)) == []
    assert cloud.open_uploads(staging_prefix(ref)) == [] and cloud.keys_under(data_prefix(ref)) == []


def test_a_status_change_event_of_an_execution_named_otherwise_touches_nothing_and_only_timeouts_are_taken(cloud: Cloud) -> None:
    victim = BackupRef.new("db")
    cloud.stage_backup(victim, [pattern(CHUNK * 2, 12)], segment_chunks=2)
    before = {key: cloud.store.get(key) for key in cloud.keys_under("")}
    lambda_client = cloud.session.client("lambda")

    def invoke(event: dict[str, Any]) -> dict[str, Any]:
        response = lambda_client.invoke(FunctionName=cloud.deployed.functions["cleanup"], Payload=json.dumps(event))
        return {"error": response.get("FunctionError"), "payload": json.loads(response["Payload"].read())}

    forged = invoke(status_change(cloud, str(BackupRef.new("other")), ExecutionInput(backup=str(victim))))
    aborted = invoke(status_change(cloud, str(victim), ExecutionInput(backup=str(victim)), status="ABORTED"))
    blind = status_change(cloud, str(victim), ExecutionInput(backup=str(victim)))
    blind["detail"].update(input=None, inputDetails={"included": False})
    no_input = invoke(blind)

    assert forged["error"] is None and forged["payload"]["error"] == "ExecutionMismatchError", forged
    assert aborted["error"] and "only timed-out executions" in aborted["payload"]["errorMessage"]
    assert no_input["error"] and "carries no execution input naming the backup" in no_input["payload"]["errorMessage"]
    assert {key: cloud.store.get(key) for key in cloud.keys_under("")} == before
