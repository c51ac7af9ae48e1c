"""The scheduled prune as the synthesized state machine runs it, on the emulated cloud, each step as its own role.

PlanPrune, the Sweep map (EXPRESS children) and TallyPrune run in Lambda
as CDK synthesized them, with per-role IAM enforced (support.emulated_iam):
the planner may delete manifests but no chunk, the sweep chunks but no
manifest. What each step decides in detail is tested in-process
(tests/test_prune_run.py); here: that the state machine wires them so.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.session
import pytest
from test_emulated_e2e import Emulator, braid, start_emulator  # noqa: F401  (the fixture)

from braid import contract
from braid.adapters.aws.clients import kms_client, s3_client
from braid.adapters.aws.kms import KmsKeyService
from braid.adapters.aws.s3 import S3Store
from braid.format.ids import BackupRef
from braid.format.layout import CATALOG_INDEX, data_prefix, manifest_key
from braid.format.repository import Repository
from braid.ops.retention import RetentionPolicy, plan_prune
from support.synthetic_backup import write_backup

pytestmark = pytest.mark.cloud

DAY = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)


def repository_of(cloud: Emulator) -> tuple[Repository, KmsKeyService]:
    """The repository as an inspector sees it (a caller the emulator does not hold to a role)."""
    session = botocore.session.Session()  # the adapters' clients are botocore's (braid.adapters.aws.clients)
    session.set_credentials("test-inspector", "test")
    session.set_config_variable("region", cloud.env["AWS_DEFAULT_REGION"])
    endpoint = cloud.env["AWS_ENDPOINT_URL"]
    repository = Repository.open(S3Store(s3_client(session=session, endpoint_url=endpoint), cloud.bucket, ""))
    keys = KmsKeyService(kms_client(session=session, endpoint_url=endpoint), repository.config.key["key_id"])
    return repository, keys


def stack_output(cloud: Emulator, key: str) -> str:
    (stack,) = cloud.client("cloudformation").describe_stacks(StackName="Braid")["Stacks"]
    (value,) = [o["OutputValue"] for o in stack["Outputs"] if o["OutputKey"] == key]
    return str(value)


def prune_machine(cloud: Emulator) -> str:
    return stack_output(cloud, contract.OUTPUT_PRUNE_STATE_MACHINE)


def finished(cloud: Emulator, arn: str, timeout: float = 180) -> dict[str, Any]:
    """The output of execution `arn`, once it SUCCEEDED (anything else fails the test, with its error and cause)."""
    sfn = cloud.client("stepfunctions")
    deadline = time.monotonic() + timeout
    while (described := sfn.describe_execution(executionArn=arn))["status"] == "RUNNING":
        assert time.monotonic() < deadline, f"{arn} still running after {timeout} s:\n{cloud.tail()}"
        time.sleep(0.5)
    assert described["status"] == "SUCCEEDED", (described.get("error"), described.get("cause"), cloud.tail()[-3000:])
    output: dict[str, Any] = json.loads(described["output"])
    return output


def run_prune(cloud: Emulator, name: str, document: dict[str, Any], timeout: float = 180) -> dict[str, Any]:
    sfn = cloud.client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=prune_machine(cloud), name=name, input=json.dumps(document))["executionArn"]
    return finished(cloud, arn, timeout)


def deletions(cloud: Emulator, role: str) -> list[float]:
    """When the given function's role sent DeleteObjects (or DeleteObject) requests."""
    return [r["t"] for r in cloud.requests(service="s3") if role in str(r.get("caller")) and str(r.get("op", "")).startswith("Delete")]


def test_scheduled_prune_keeps_what_restic_keeps_manifests_first_big_backups_split(cloud: Emulator) -> None:
    repository, keys = repository_of(cloud)
    for day in range(4):
        for hour in (0, 12):
            write_backup(repository, keys, "pg", DAY + timedelta(days=day, hours=hour))
    big = write_backup(repository, keys, "pg", DAY - timedelta(days=30), chunks=7)  # April: a month of its own
    logs = [write_backup(repository, keys, "logs", DAY - timedelta(days=400 + d)) for d in range(3)]
    rules = {"keep_daily": 2, "keep_monthly": 2}
    expected = plan_prune(repository, RetentionPolicy.of(**rules), keys)  # the host's prune, reading every manifest
    assert big in expected.keep and len(expected.forget) == 7 and logs[2] in expected.forget

    output = run_prune(cloud, "prune-restic", {**rules, "slice_chunks": 3, "prefix": ""})

    report = output["report"]
    assert report["ok"] and report["pruned"] == [str(r) for r in expected.forget]
    assert sorted(str(r) for r in repository.backups()) == sorted(str(r) for r in expected.keep)
    for gone in report["pruned"]:
        ref = BackupRef.parse(gone)
        assert repository.store.head(manifest_key(ref)) is None and list(repository.store.list(data_prefix(ref))) == []
    assert output["plan"]["items"] == 7  # seven one-chunk backups: an item each
    # Manifests first: every deletion the planner made came before any the sweep made.
    planner, sweep = deletions(cloud, "FunctionsPruneRole"), deletions(cloud, "FunctionsSweepRole")
    assert planner and sweep and max(planner) < min(sweep)

    # A big backup is split over several items: let the policy go of it now.
    expected = plan_prune(repository, RetentionPolicy.of(keep_last=1), keys)
    assert big in expected.forget and len(expected.forget) == 3
    output = run_prune(cloud, "prune-big", {"keep_last": 1, "slice_chunks": 3})
    assert output["report"]["pruned"] == [str(r) for r in expected.forget]
    assert output["plan"]["items"] == 3 + 2, json.dumps(output["report"])  # 7 chunks in slices of 3, and two one-chunk backups
    assert list(repository.store.list(data_prefix(big))) == [] and output["report"]["objects_deleted"] == 9

    # list, as a host reads it (the catalog the run rebuilt), shows exactly what is left.
    listed = braid(cloud, "host-agent-pg", "list", "--json")
    assert listed.code == 0, listed.stderr
    assert sorted(row["backup"] for row in json.loads(listed.stdout)) == sorted(str(r) for r in repository.backups())
    assert len(cloud.keys(CATALOG_INDEX)) <= 2


def test_unreadable_manifests_are_reported_and_leftovers_found_by_prefix(cloud: Emulator) -> None:
    repository, keys = repository_of(cloud)
    good = write_backup(repository, keys, "db", DAY)
    broken = write_backup(repository, keys, "db", DAY + timedelta(days=1))
    cloud.client("s3").put_object(Bucket=cloud.bucket, Key=manifest_key(broken), Body=b'{"manifest": "truncated')
    leftover = BackupRef("db", "20200101T000000.000Z-0badc0de")  # no manifest; written now, so not idle yet
    repository.store.put(f"{data_prefix(leftover)}0000000000", b"never finished")

    output = run_prune(cloud, "prune-unreadable", {"keep_last": 1})

    report = output["report"]
    assert [p for p in report["pruned"] if p.startswith("db@")] == [] and not report["ok"]
    assert [u["backup"] for u in report["unreadable"]] == [str(broken)]
    assert repository.store.head(manifest_key(good)) is not None and repository.store.head(manifest_key(broken)) is not None
    # Found from a LIST of backup prefixes, looked at again by its item, and spared: it was active within the grace.
    assert report["spared"] == [str(leftover)] and list(repository.store.list(data_prefix(leftover))) != []


def test_the_scheduled_maintenance_starts_the_prune_which_distrusts_what_a_verify_failed(cloud: Emulator) -> None:
    """The daily rules' targets, as EventBridge runs them: the cloud verify records a failure, then the
    maintenance starts the prune run, whose planner counts the failed backup towards no rule."""
    repository, keys = repository_of(cloud)
    older = write_backup(repository, keys, "ledger", DAY)
    newest = write_backup(repository, keys, "ledger", DAY + timedelta(days=1))
    chunk = f"{data_prefix(newest)}0000000000"
    s3 = cloud.client("s3")
    raw = bytearray(s3.get_object(Bucket=cloud.bucket, Key=chunk)["Body"].read())
    raw[-1] ^= 1
    s3.put_object(Bucket=cloud.bucket, Key=chunk, Body=bytes(raw))  # the newest is damaged: it must not push the older one out
    verify_run = cloud.client("stepfunctions").start_execution(
        stateMachineArn=stack_output(cloud, contract.OUTPUT_VERIFY_STATE_MACHINE),
        name="verify-ledger",
        input=json.dumps({"prefix": "", "backups": [str(newest)], "deep": True}),
    )["executionArn"]
    finished(cloud, verify_run)
    lambda_ = cloud.client("lambda")
    # The maintenance function (logical id FunctionsVerify...; the verify pipeline's are FunctionsVerifyplan... etc.).
    (maintenance,) = [f["FunctionName"] for f in lambda_.list_functions()["Functions"] if re.match(r"FunctionsVerify(?![a-z])", f["FunctionName"])]

    answer = lambda_.invoke(FunctionName=maintenance, Payload=json.dumps({"prefix": "", "sample_percent": 100, "keep_last": 1}).encode())

    report = json.loads(answer["Payload"].read())
    assert "FunctionError" not in answer, report
    assert report["prune_run"].startswith(prune_machine(cloud).replace(":stateMachine:", ":execution:"))
    assert isinstance(report["oldest_staging_hours"], float)  # measured under its own role: it may list staging/
    pruned = finished(cloud, report["prune_run"])["report"]
    unreadable = [u for u in pruned["unreadable"] if u["backup"].startswith("ledger@")]
    assert [u["backup"] for u in unreadable] == [str(newest)] and "failed its deep verification" in unreadable[0]["error"]
    assert not [p for p in pruned["pruned"] if p.startswith("ledger@")]
    assert repository.store.head(manifest_key(older)) is not None and repository.store.head(manifest_key(newest)) is not None


def test_a_failed_sweep_item_leaves_its_slice_to_the_next_run_and_says_so(start_emulator: Callable[..., Emulator]) -> None:  # noqa: F811
    """Item 1 (the second slice) fails on every attempt: the map tolerates it, TallyPrune reports the backup whose data remains."""
    cloud = start_emulator("--fail-sweep-item", "1")
    repository, keys = repository_of(cloud)
    big = write_backup(repository, keys, "db", DAY, chunks=5)
    write_backup(repository, keys, "db", DAY + timedelta(days=1))

    output = run_prune(cloud, "prune-failing", {"keep_last": 1, "slice_chunks": 2})

    report = output["report"]
    assert report["pruned"] == [str(big)] and report["incomplete"] == [str(big)] and report["failed_items"] == 1 and not report["ok"]
    assert repository.store.head(manifest_key(big)) is None  # gone from the repository: no listed backup lacks a chunk
    left = [info.key for info in repository.store.list(data_prefix(big))]
    assert left == [f"{data_prefix(big)}{i:010d}" for i in (2, 3)]  # the failed slice's chunks, for the next run to collect
    # The injected fault is what failed: the item's attempts, each an error of the sweep function (the child itself ends
    # in SweepItemFailed, so the map's output stays small: review 3, M1).
    failed = [r for r in cloud.requests(op="Invoke") if "Sweep" in r["function"] and "function_error" in r]
    assert len(failed) == 1 + contract.SWEEP_RETRIES, failed
