"""The agent's cloud path wired to AWS: ports built from the repository, retries in the backup's progress."""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.stub import Stubber
from moto import mock_aws

from braid.adapters.aws.clients import stepfunctions_client
from braid.adapters.aws.s3 import S3Store
from braid.adapters.aws.s3_multipart import S3Multipart
from braid.adapters.aws.wiring import cloud_engine
from braid.adapters.local.store import LocalStore
from braid.agent.cloud_engine import CloudOptions
from braid.engine.port import BackupRequest
from braid.engine.stream import sources_from_args
from braid.errors import ExecutionError, NotFoundError, RepositoryError, UsageError
from braid.format.ids import BackupRef
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import utc_now

BUCKET = "braid-wiring"
MACHINE = "arn:aws:states:us-east-1:111122223333:stateMachine:Braid-Backup"
KMS = {"type": "kms", "key_id": "arn:aws:kms:us-east-1:111122223333:key/k"}


@pytest.fixture
def s3_repository(aws_env: None) -> Iterator[Repository]:
    with mock_aws():
        store = S3Store.from_url(f"s3://{BUCKET}/prod", region="us-east-1", sleep=lambda _: None)
        store.client.create_bucket(Bucket=BUCKET)
        yield Repository.create(store, RepositoryConfig.new(KMS, utc_now(), {"stack": "Braid", "state_machine_arn": MACHINE}))


def test_the_engine_gets_the_repositorys_own_store_and_client(s3_repository: Repository) -> None:
    store = s3_repository.store
    assert isinstance(store, S3Store)
    args = argparse.Namespace(concurrency=3, rate_limit_bytes=1000.0, fan_out=7, no_wait=True)
    engine = cloud_engine(s3_repository, args, stepfunctions=stepfunctions_client(region="us-east-1"))
    assert engine.options == CloudOptions(concurrency=3, rate_limit=1000.0, fan_out=7, wait=False)
    assert isinstance(engine.uploads, S3Multipart) and engine.uploads.store is store
    assert engine.retries is store.retries and engine.prefix == "prod"
    assert cloud_engine(s3_repository, argparse.Namespace(), stepfunctions=object()).options == CloudOptions()  # `braid status`


def test_only_a_cloud_repository_with_a_pipeline_has_a_cloud_engine(s3_repository: Repository, tmp_path: Path) -> None:
    local = Repository(LocalStore(tmp_path), RepositoryConfig.new(KMS, utc_now(), {"state_machine_arn": MACHINE}))
    with pytest.raises(UsageError, match="needs an s3:// repository"):
        cloud_engine(local, CloudOptions())
    bare = Repository(s3_repository.store, RepositoryConfig.new(KMS, utc_now(), {"stack": "Braid"}))
    with pytest.raises(RepositoryError, match="names no pipeline: run 'braid init --repo s3://braid-wiring/prod --stack NAME'"):
        cloud_engine(bare, CloudOptions())


class _Raw(io.BytesIO):
    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.read()


def test_retries_go_to_the_progress_of_the_backup_being_followed(s3_repository: Repository) -> None:
    store = s3_repository.store
    assert isinstance(store, S3Store)
    sfn = stepfunctions_client(region="us-east-1")
    engine = cloud_engine(s3_repository, CloudOptions(poll_seconds=0), stepfunctions=sfn)
    ref = BackupRef.new("db")
    events: list[dict[str, Any]] = []
    with Stubber(sfn) as stub:
        stub.add_response("describe_execution", {"executionArn": "a", "stateMachineArn": MACHINE, "status": "FAILED", "startDate": utc_now(), "cause": "x"})
        with pytest.raises(ExecutionError):
            engine.wait(ref, events.append)
    slowdowns = [1]

    def slow_down(request: Any, **_: Any) -> AWSResponse | None:
        if slowdowns:
            slowdowns.pop()
            body = b"<Error><Code>SlowDown</Code><Message>m</Message></Error>"
            return AWSResponse(request.url, 503, {}, _Raw(body))
        return None

    store.client.meta.events.register_first("before-send.s3.PutObject", slow_down)
    store.put("staging/x", b"1")
    assert [e["event"] for e in events] == ["phase", "retry"]  # following: the processing phase, then the retry
    assert [(e["event"], e["backup"], e["reason"]) for e in events[1:]] == [("retry", str(ref), "SlowDown")]
    assert events[1]["message"].startswith("SlowDown, retrying in ")


def test_a_backup_reports_its_upload_retries_and_starts_its_execution(s3_repository: Repository, tmp_path: Path) -> None:
    store = s3_repository.store
    assert isinstance(store, S3Store)
    data = tmp_path / "dump"
    data.write_bytes(b"rows" * 1000)
    sfn = stepfunctions_client(region="us-east-1")
    engine = cloud_engine(s3_repository, CloudOptions(wait=False), stepfunctions=sfn)
    ref = BackupRef.new("db")
    slowdowns = [1, 1]

    def slow_down(request: Any, **_: Any) -> AWSResponse | None:
        if slowdowns:
            slowdowns.pop()
            return AWSResponse(request.url, 503, {}, _Raw(b"<Error><Code>SlowDown</Code><Message>m</Message></Error>"))
        return None

    store.client.meta.events.register_first("before-send.s3.UploadPart", slow_down)
    events: list[dict[str, Any]] = []
    with Stubber(sfn) as stub:
        stub.add_response("start_execution", {"executionArn": "arn:exec", "startDate": utc_now()})
        assert engine.run(BackupRequest(ref, sources_from_args([str(data)]), 5 * 1024**2, 3, 1), events.append) is None
        stub.assert_no_pending_responses()
    retries = [e for e in events if e["event"] == "retry"]
    assert [(e["backup"], e["operation"], e["reason"], e["attempt"]) for e in retries] == [
        (str(ref), "UploadPart", "SlowDown", 1),
        (str(ref), "UploadPart", "SlowDown", 2),
    ]
    assert [e for e in events if e["event"] == "stream-end"][0]["bytes_read"] == 4000
    assert engine.staged_stream_end(ref) is not None and engine.staged_stream_end(ref).lengths == [4000]


def test_resume_after_staging_is_gone_follows_the_execution_still_running(s3_repository: Repository, tmp_path: Path) -> None:
    """Killed while it waited, the agent is resumed just as Finalize (or Cleanup) removed the
    staging but before the execution ended: --resume waits for the outcome instead of saying
    "nothing to resume" about a backup that is about to be published (or has failed)."""
    data = tmp_path / "dump"
    data.write_bytes(b"rows" * 1000)
    sfn = stepfunctions_client(region="us-east-1")
    engine = cloud_engine(s3_repository, CloudOptions(poll_seconds=0.01), stepfunctions=sfn)
    ref = BackupRef.new("db")
    execution = {"executionArn": "arn:exec", "stateMachineArn": MACHINE, "startDate": utc_now()}
    request = BackupRequest(ref, sources_from_args([str(data)]), 5 * 1024**2, 3, 1, resume=True)
    with Stubber(sfn) as stub:
        stub.add_response("describe_execution", {**execution, "status": "RUNNING"})
        stub.add_response("describe_execution", {**execution, "status": "RUNNING"})
        stub.add_response("describe_execution", {**execution, "status": "FAILED", "error": "BackupFailed", "cause": f"backup {ref} failed: worker error"})
        with pytest.raises(ExecutionError, match="worker error"):
            engine.run(request, lambda _: None)
        stub.assert_no_pending_responses()
    # No execution at all: there is nothing to resume, said as such.
    with Stubber(sfn) as stub:
        stub.add_client_error("describe_execution", "ExecutionDoesNotExist", "no such execution")
        with pytest.raises(NotFoundError, match="nothing to resume"):
            engine.run(request, lambda _: None)


def test_a_held_backup_stops_the_agent_with_the_workers_error_until_its_own_resume(s3_repository: Repository) -> None:
    from braid.format.staging import HoldRecord, ResumeRequest, StagingArea

    engine = cloud_engine(s3_repository, argparse.Namespace(concurrency=None, rate_limit_bytes=None, fan_out=None, no_wait=False))
    ref = BackupRef.new("db")
    area = StagingArea(s3_repository.store, ref)
    assert engine.held_message(ref) is None
    area.write_hold(HoldRecord("chunks 4..5: StorageError: S3 refused writing", "2026-11-23T00:00:00Z", "2026-11-24T00:00:00Z", "", 1))

    with pytest.raises(ExecutionError) as held:
        engine.check_not_held(ref)

    assert held.value.exit_code == 9
    message = str(held.value)
    assert f"backup {ref} is held: workers kept failing on 1 map item(s) (chunks 4..5: StorageError: S3 refused writing)" in message
    assert "kept until 2026-11-24T00:00:00Z" in message and f"'braid backup --resume {ref}' and the same inputs" in message
    # After this agent's own resume request, that older hold is stale (the planner is releasing it) ...
    engine._resumed[str(ref)] = "mine"
    area.write_resume_request(ResumeRequest("mine"))
    assert engine.held_message(ref) is None
    # ... but a hold written after it (the items failed again) stops the agent again.
    area.write_hold(HoldRecord("chunks 4..5: StorageError: again", "2026-11-23T01:00:00Z", "2026-11-24T01:00:00Z", "mine", 1))
    assert "StorageError: again" in (engine.held_message(ref) or "")
