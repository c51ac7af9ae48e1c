"""The synthesized verify state machine, executed by moto with the handlers in-process (AWS's map semantics:
support.sfn_semantics). What only a fault can show: a failed map item counts as failed chunks, with the
worker's own error, and the run still records every backup; many items over several backups fold right."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from test_state_machine import CHUNK, Cloud, cloud, pattern, synthesized  # noqa: F401  (fixtures)

from braid.format.ids import BackupRef
from braid.ops.verification import latest_verification
from braid.pipeline.verify_request import CHUNKS_PER_ITEM

pytestmark = pytest.mark.cloud


def publish(cloud: Cloud, name: str, chunks: int) -> BackupRef:  # noqa: F811
    ref = BackupRef.new(name)
    cloud.stage_backup(ref, [pattern(CHUNK * chunks, chunks)], segment_chunks=4)
    result = cloud.wait(cloud.start(ref, max_concurrency=4))
    assert result["status"] == "SUCCEEDED", cloud.failures(result["executionArn"])
    return ref


def run_verify(cloud: Cloud, **request: Any) -> dict[str, Any]:  # noqa: F811
    arn = cloud.sfn.start_execution(
        stateMachineArn=cloud.deployed.verify_state_machine_arn, name=f"verify-{time.monotonic_ns()}", input=json.dumps({"prefix": "", **request})
    )["executionArn"]
    result = cloud.wait(arn, timeout=120)
    assert result["status"] == "SUCCEEDED", cloud.failures(arn)
    output: dict[str, Any] = json.loads(result["output"])
    return output


def test_a_failed_item_counts_as_failed_chunks_with_the_workers_error(cloud: Cloud) -> None:  # noqa: F811
    ref = publish(cloud, "db", CHUNKS_PER_ITEM + 2)  # two items: the first fails, the second is checked
    worker = cloud.deployed.functions["verifyworker"]
    cloud.lambdas.fail(worker, lambda: RuntimeError("the disk is on fire"), times=None, when=lambda e: e["item"]["chunks"][0] == 0)

    output = run_verify(cloud, backups=[str(ref)], deep=True)

    (report,) = output["reports"]
    assert not output["ok"] and not report["ok"] and not report["corrupt"]  # not checked is not proven corrupt
    assert report["chunks_checked"] == 2 and report["failure_count"] == CHUNKS_PER_ITEM
    assert report["failures"][0] == f"chunk 0 of backup {ref} was not checked: the verify worker failed: RuntimeError: the disk is on fire"
    record = latest_verification(cloud.store, ref)
    assert record is not None and record.engine == "stepfunctions" and record.failure_count == CHUNKS_PER_ITEM
    assert cloud.keys_under("verify-runs/") == []


def test_latest_verifies_each_names_newest_backup_over_many_items(cloud: Cloud) -> None:  # noqa: F811
    old = publish(cloud, "db", 3)
    new = publish(cloud, "db", 2 * CHUNKS_PER_ITEM + 1)
    logs = publish(cloud, "logs", 1)

    output = run_verify(cloud, backups="latest", deep=True)

    assert output["ok"]
    checked = {r["backup"]: (r["chunks_checked"], r["chunks_total"]) for r in output["reports"]}
    assert checked == {str(new): (2 * CHUNKS_PER_ITEM + 1, 2 * CHUNKS_PER_ITEM + 1), str(logs): (1, 1)}
    assert latest_verification(cloud.store, old) is None


def test_a_request_the_planner_refuses_fails_the_run_with_its_reason(cloud: Cloud) -> None:  # noqa: F811
    arn = cloud.sfn.start_execution(
        stateMachineArn=cloud.deployed.verify_state_machine_arn, name="verify-bad", input=json.dumps({"prefix": "", "backups": "some"})
    )["executionArn"]
    result = cloud.wait(arn)
    assert result["status"] == "FAILED" and result["error"] == "UsageError"
    assert "invalid verify request" in result["cause"]
