"""The emulated Step Functions fail as AWS fails (support.sfn_semantics), on small hand-written machines.

Each test runs a Distributed Map in moto with an in-process Lambda whose
behaviour the item decides (succeed, fail, or run long), and checks what
AWS documents: the tolerated failure threshold and its error, the output of
failed items within it, the Express 5-minute limit, Lambda's timeout, and a
clock that runs faster without changing any ratio.
"""

from __future__ import annotations

import io
import json
import time
import uuid
import zipfile
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from support.inprocess_lambda import InProcessLambdas
from support.moto_stack import compat_definition
from support.sfn_semantics import DATA_LIMIT_ERROR, EXCEED_THRESHOLD, EXCEED_THRESHOLD_CAUSE, STATE_LIMIT_BYTES, AwsStepFunctions

pytestmark = pytest.mark.cloud

REGION = "us-east-1"
HANDLER = '''
import time
import uuid

def handler(event, context):
    action = event["action"]
    if action == "fail":
        raise RuntimeError(f"item {event['n']} failed" + " at length" * event.get("pad", 0))
    if action == "sleep":
        time.sleep(event["seconds"])
    if action == "remaining":
        return {"n": event["n"], "remaining_ms": context.get_remaining_time_in_millis()}
    return {"n": event["n"]}
'''


class Machines:
    def __init__(self, session: Any, lambdas: InProcessLambdas, semantics: AwsStepFunctions) -> None:
        self.session = session
        self.lambdas = lambdas
        self.semantics = semantics
        self.sfn = session.client("stepfunctions")
        iam = session.client("iam")
        self.role = iam.create_role(RoleName="emulated-sfn", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}))[
            "Role"
        ]["Arn"]
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as zipped:
            zipped.writestr("app.py", HANDLER)
        self.functions = {
            name: session.client("lambda").create_function(
                FunctionName=name, Runtime="python3.11", Role=self.role, Handler="app.handler", Code={"ZipFile": archive.getvalue()}, Timeout=timeout
            )["FunctionArn"]
            for name, timeout in (("item", 900), ("short", 60))
        }

    def map_machine(
        self, name: str, *, function: str = "item", express: bool = False, catch: bool = True, retry: dict[str, Any] | None = None,
        item_catch: bool = False, result_path: str | None = "$.results", **tolerance: Any,
    ) -> str:
        """`item_catch`: the item's failure caught inside its child, ending in a Pass whose output is {} (as Braid's maps do)."""
        item: dict[str, Any] = {"Type": "Task", "Resource": self.functions[function], "End": True}
        states_of_item: dict[str, Any] = {"Item": item}
        if item_catch:
            item["Catch"] = [{"ErrorEquals": ["States.ALL"], "ResultPath": None, "Next": "ItemFailed"}]
            states_of_item["ItemFailed"] = {"Type": "Pass", "OutputPath": None, "End": True}
        map_state: dict[str, Any] = {
            "Type": "Map",
            "ItemsPath": "$.items",
            "ItemProcessor": {
                "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "EXPRESS" if express else "STANDARD"},
                "StartAt": "Item",
                "States": states_of_item,
            },
            "Label": "items",
            "MaxConcurrency": 1,
            "ResultPath": result_path,
            "End": True,
            **tolerance,
        }
        if retry:
            map_state["Retry"] = [retry]
        states: dict[str, Any] = {"Items": map_state}
        if catch:
            map_state["Catch"] = [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Caught"}]
            states["Caught"] = {"Type": "Pass", "End": True}
        definition = json.dumps({"StartAt": "Items", "States": states})
        return self.sfn.create_state_machine(name=name, definition=compat_definition(definition), roleArn=self.role)["stateMachineArn"]

    def run(self, machine: str, items: list[dict[str, Any]], timeout: float = 60) -> dict[str, Any]:
        for n, item in enumerate(items):
            item.setdefault("n", n)
        arn = self.sfn.start_execution(stateMachineArn=machine, name=uuid.uuid4().hex, input=json.dumps({"items": items}))["executionArn"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            described = self.sfn.describe_execution(executionArn=arn)
            if described["status"] != "RUNNING":
                return described
            time.sleep(0.1)
        raise AssertionError(f"{arn} still running after {timeout} s")

    def map_run(self, execution: dict[str, Any]) -> dict[str, Any]:
        (run,) = self.sfn.list_map_runs(executionArn=execution["executionArn"])["mapRuns"]
        return self.sfn.describe_map_run(mapRunArn=run["mapRunArn"])

    def history(self, execution: dict[str, Any]) -> list[str]:
        return [e["type"] for e in self.sfn.get_execution_history(executionArn=execution["executionArn"], maxResults=1000)["events"]]


def _machines(monkeypatch: pytest.MonkeyPatch, time_scale: float) -> Iterator[Machines]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    semantics = AwsStepFunctions(time_scale=time_scale)
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}), semantics, InProcessLambdas(time_scale=time_scale) as lambdas:
        yield Machines(boto3.session.Session(region_name=REGION), lambdas, semantics)


@pytest.fixture
def machines(monkeypatch: pytest.MonkeyPatch) -> Iterator[Machines]:
    yield from _machines(monkeypatch, 100)


# Where the Express limit itself is tested, every item that must finish within it has 300 s / scale real seconds.
# At 100x that is 3 s, which an in-process invocation on a loaded 2-core machine exceeded (CI under load); at 25x it
# is 12 s, and the items that must outlive it sleep 16 s (400 s of the service's clock).
LIMIT_SCALE = 25


@pytest.fixture
def limit_machines(monkeypatch: pytest.MonkeyPatch) -> Iterator[Machines]:
    yield from _machines(monkeypatch, LIMIT_SCALE)


OK = {"action": "ok"}
FAIL = {"action": "fail"}


def test_one_failed_item_fails_the_map_with_the_aws_error_when_nothing_is_tolerated(machines: Machines) -> None:
    machine = machines.map_machine("default-threshold")

    result = machines.run(machine, [dict(OK), dict(FAIL), dict(OK)])

    # The Catch saw the map's own error, not the item's, and the execution went on.
    assert result["status"] == "SUCCEEDED", result
    error = json.loads(result["output"])["error"]
    assert error == {"Error": EXCEED_THRESHOLD, "Cause": EXCEED_THRESHOLD_CAUSE}
    assert EXCEED_THRESHOLD == "States.ExceedToleratedFailureThreshold"
    run = machines.map_run(result)
    assert run["status"] == "FAILED" and run["itemCounts"]["failed"] == 1
    history = machines.history(result)
    assert "MapRunFailed" in history and "MapStateFailed" in history and "MapRunSucceeded" not in history


def test_an_uncaught_threshold_failure_fails_the_execution_with_that_error(machines: Machines) -> None:
    machine = machines.map_machine("uncaught", catch=False)

    result = machines.run(machine, [dict(FAIL)])

    assert result["status"] == "FAILED"
    assert (result["error"], result["cause"]) == (EXCEED_THRESHOLD, EXCEED_THRESHOLD_CAUSE)


def test_items_after_the_threshold_is_exceeded_never_start(machines: Machines) -> None:
    machine = machines.map_machine("stops-early")  # MaxConcurrency 1: items run in order

    result = machines.run(machine, [dict(FAIL)] + [dict(OK) for _ in range(5)])

    counts = machines.map_run(result)["itemCounts"]
    assert (counts["failed"], counts["succeeded"], counts["aborted"]) == (1, 0, 5)
    assert machines.lambdas.invocation_count("item") == 1


def test_failures_within_a_tolerated_count_leave_the_map_succeeding_with_their_results(machines: Machines) -> None:
    machine = machines.map_machine("count", ToleratedFailureCount=1)

    within = machines.run(machine, [dict(OK), dict(FAIL), dict(OK)])
    beyond = machines.run(machine, [dict(FAIL), dict(OK), dict(FAIL)])

    assert within["status"] == "SUCCEEDED"
    output = json.loads(within["output"])
    assert "error" not in output
    first, failed, last = output["results"]
    assert first == {"n": 0} and last == {"n": 2}
    # A failed child's result is its execution result unchanged (Transformation NONE).
    assert failed["Status"] == "FAILED" and failed["Error"] == "RuntimeError"
    assert "item 1 failed" in failed["Cause"]
    assert json.loads(failed["Input"]) == {"action": "fail", "n": 1}
    assert {"ExecutionArn", "Name", "StartDate", "StopDate", "StateMachineArn"} <= set(failed)
    assert machines.map_run(within)["status"] == "SUCCEEDED"
    assert json.loads(beyond["output"])["error"]["Error"] == EXCEED_THRESHOLD


def test_the_tolerated_percentage_counts_failed_items_over_all_items(machines: Machines) -> None:
    machine = machines.map_machine("percentage", ToleratedFailurePercentage=50)  # as CDK renders it (compat_definition adapts it for moto)

    half = machines.run(machine, [dict(FAIL), dict(OK), dict(FAIL), dict(OK)])
    more = machines.run(machine, [dict(FAIL), dict(FAIL), dict(FAIL), dict(OK)])

    assert "error" not in json.loads(half["output"])  # 50 % is not more than 50 %
    assert json.loads(more["output"])["error"]["Error"] == EXCEED_THRESHOLD


def test_with_both_thresholds_exceeding_either_fails_the_map(machines: Machines) -> None:
    machine = machines.map_machine("both", ToleratedFailurePercentage=90.0, ToleratedFailureCount=1)

    result = machines.run(machine, [dict(FAIL), dict(FAIL), dict(OK), dict(OK)])

    assert json.loads(result["output"])["error"]["Error"] == EXCEED_THRESHOLD


def test_a_retry_on_the_map_state_sees_the_threshold_error(machines: Machines) -> None:
    retry = {"ErrorEquals": [EXCEED_THRESHOLD], "IntervalSeconds": 30, "MaxAttempts": 2, "BackoffRate": 2.0}
    machine = machines.map_machine("retried", retry=retry)

    started = time.monotonic()
    result = machines.run(machine, [dict(FAIL)])

    assert json.loads(result["output"])["error"]["Error"] == EXCEED_THRESHOLD
    assert machines.lambdas.invocation_count("item") == 3  # the first run and 2 retries of the whole map
    # 30 s + 60 s of the service's clock, at 100x: 0.9 s, but not none; unscaled it would be 90 s.
    assert 0.8 <= time.monotonic() - started < 90


def test_an_express_child_past_five_minutes_times_out_and_counts_against_the_threshold(limit_machines: Machines) -> None:
    machines = limit_machines
    tolerant = machines.map_machine("express", express=True, ToleratedFailureCount=1)
    strict = machines.map_machine("express-strict", express=True, ToleratedFailureCount=0)
    slow = {"action": "sleep", "seconds": 400 / LIMIT_SCALE}  # 400 s of the service's clock: past 300 s

    tolerated = machines.run(tolerant, [dict(OK), dict(slow)])
    beyond = machines.run(strict, [dict(slow)])

    timed_out = json.loads(tolerated["output"])["results"][1]
    assert (timed_out["Status"], timed_out["Error"]) == ("TIMED_OUT", "States.Timeout")
    assert machines.map_run(tolerated)["itemCounts"]["timedOut"] == 1
    assert json.loads(beyond["output"])["error"]["Error"] == EXCEED_THRESHOLD


def test_a_standard_child_is_not_held_to_the_express_limit(machines: Machines) -> None:
    machine = machines.map_machine("standard")

    result = machines.run(machine, [{"action": "sleep", "seconds": 4}])

    assert json.loads(result["output"]).get("results") == [{"n": 0}], result["output"]


def test_a_lambda_past_its_timeout_fails_with_sandbox_timedout(machines: Machines) -> None:
    machine = machines.map_machine("lambda-timeout", function="short", ToleratedFailureCount=5)
    # The function's Timeout is 60 s: 0.6 real s at 100x.

    result = machines.run(machine, [{"action": "sleep", "seconds": 1.5}, {"action": "remaining"}])

    timed_out, remaining = json.loads(result["output"])["results"]
    assert timed_out["Error"] == "Sandbox.Timedout" and "Task timed out after 60.00 seconds" in timed_out["Cause"]
    assert 50_000 < remaining["remaining_ms"] <= 60_000  # the context counts down the service's clock


def test_many_failed_items_fail_a_map_past_the_state_size_quota_unless_each_child_catches_its_failure(machines: Machines) -> None:
    """Review 3, M1: a failed child's place in the map's output holds its execution result (input, error, cause); with
    enough of them the map's result passes 262,144 bytes and the Map fails with States.DataLimitExceeded, even with
    ResultPath null and every failure tolerated. A Catch inside the item processor ending in a Pass with OutputPath
    null (Braid's ItemFailed) keeps each failed item's place at {}."""
    failing = [{"action": "fail", "pad": 2_000} for _ in range(16)]  # ~20 KB of cause each: ~330 KB in all
    bare = machines.map_machine("fails-whole", ToleratedFailurePercentage=100, result_path=None)
    caught = machines.map_machine("caught-inside", ToleratedFailurePercentage=100, result_path=None, item_catch=True)
    kept = machines.map_machine("caught-kept", ToleratedFailurePercentage=100, item_catch=True)

    overflowing = machines.run(bare, [dict(f) for f in failing])
    within = machines.run(caught, [dict(f) for f in failing])
    results = machines.run(kept, [dict(OK), *[dict(f) for f in failing]])

    error = json.loads(overflowing["output"])["error"]
    assert error["Error"] == DATA_LIMIT_ERROR == "States.DataLimitExceeded" and "exceeding the maximum number of bytes" in error["Cause"]
    assert len(json.dumps([{"Cause": "x" * 20_000}] * 16)) > STATE_LIMIT_BYTES  # the failing run is past the quota, not near it
    assert within["status"] == "SUCCEEDED" and "error" not in json.loads(within["output"])
    assert json.loads(results["output"])["results"] == [{"n": 0}] + [{}] * 16
    assert machines.map_run(within)["itemCounts"]["failed"] == 0  # caught: each child succeeded
    assert machines.lambdas.invocation_count("item") == 16 * 3 + 1


def test_a_result_writer_exports_each_status_to_its_own_file_with_a_manifest(machines: Machines) -> None:
    s3 = machines.session.client("s3")
    s3.create_bucket(Bucket="results")
    writer = {"Resource": "arn:aws:states:::s3:putObject", "Parameters": {"Bucket": "results", "Prefix": "runs"}}
    machine = machines.map_machine("exported", ToleratedFailureCount=1, ResultWriter=writer)

    result = machines.run(machine, [dict(OK), dict(FAIL), dict(OK)])

    details = json.loads(result["output"])["results"]
    assert details["ResultWriterDetails"]["Bucket"] == "results" and details["MapRunArn"] == machines.map_run(result)["mapRunArn"]
    manifest = json.loads(s3.get_object(Bucket="results", Key=details["ResultWriterDetails"]["Key"])["Body"].read())
    assert manifest["DestinationBucket"] == "results" and manifest["ResultFiles"]["PENDING"] == []
    (succeeded,) = manifest["ResultFiles"]["SUCCEEDED"]
    (failed,) = manifest["ResultFiles"]["FAILED"]
    assert succeeded["Key"].startswith("runs/") and succeeded["Key"].endswith("/SUCCEEDED_0.json")
    rows = json.loads(s3.get_object(Bucket="results", Key=succeeded["Key"])["Body"].read())
    assert [json.loads(r["Output"]) for r in rows] == [{"n": 0}, {"n": 2}] and {r["Status"] for r in rows} == {"SUCCEEDED"}
    body = s3.get_object(Bucket="results", Key=failed["Key"])["Body"].read()
    (row,) = json.loads(body)
    assert failed["Size"] == len(body)
    assert (row["Status"], row["Error"], json.loads(row["Input"])) == ("FAILED", "RuntimeError", {"action": "fail", "n": 1})


VERSIONED = '''
import os
import time

CODE = {code!r}

def handler(event, context):
    if event.get("gate"):
        open(os.path.join(event["gate"], "started"), "w").close()
        while not os.path.exists(os.path.join(event["gate"], "go")):  # the test deploys B meanwhile
            time.sleep(0.01)
    return {{"code": CODE}}
'''


def _zipped(source: str) -> bytes:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("app.py", source)
    return archive.getvalue()


def test_an_execution_started_on_version_a_finishes_on_a_while_b_is_deployed(machines: Machines, tmp_path: Any) -> None:
    """As AWS does: an execution keeps the definition it started with, and a qualified ARN runs that version's code."""
    client = machines.session.client("lambda")
    client.create_function(FunctionName="pinned", Runtime="python3.11", Role=machines.role, Handler="app.handler", Code={"ZipFile": _zipped(VERSIONED.format(code="A"))}, Timeout=900)

    def definition(arn: str) -> str:
        first = {"Type": "Task", "Resource": arn, "ResultPath": "$.first", "Next": "Second"}
        return json.dumps({"StartAt": "First", "States": {"First": first, "Second": {"Type": "Task", "Resource": arn, "Parameters": {}, "ResultPath": "$.second", "End": True}}})

    version_a = client.publish_version(FunctionName="pinned")["FunctionArn"]
    machine = machines.sfn.create_state_machine(name="pinned", definition=definition(version_a), roleArn=machines.role)["stateMachineArn"]
    started = machines.sfn.start_execution(stateMachineArn=machine, name="on-a", input=json.dumps({"gate": str(tmp_path)}))["executionArn"]
    while not (tmp_path / "started").exists():  # A's first step runs
        time.sleep(0.01)
    client.update_function_code(FunctionName="pinned", ZipFile=_zipped(VERSIONED.format(code="B")))  # the deploy of B
    version_b = client.publish_version(FunctionName="pinned")["FunctionArn"]
    machines.sfn.update_state_machine(stateMachineArn=machine, definition=definition(version_b))
    (tmp_path / "go").touch()

    def finished(arn: str) -> dict[str, Any]:
        while (described := machines.sfn.describe_execution(executionArn=arn))["status"] == "RUNNING":
            time.sleep(0.05)
        assert described["status"] == "SUCCEEDED", described
        return json.loads(described["output"])

    output = finished(started)
    assert (output["first"], output["second"]) == ({"code": "A"}, {"code": "A"}) and version_a != version_b
    later = finished(machines.sfn.start_execution(stateMachineArn=machine, name="on-b", input="{}")["executionArn"])
    assert later["second"] == {"code": "B"}
