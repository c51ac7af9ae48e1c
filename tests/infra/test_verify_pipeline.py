"""The verify state machine as CDK synthesizes it: fan-out like the backup's, its schedule, its outputs and alarms."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "infra"))

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402
from test_stack import Placeholders  # noqa: E402

from braid import contract  # noqa: E402
from braid.pipeline.verify_request import VerifyRequest  # noqa: E402
from braid_infra.stack import BraidStack  # noqa: E402
from braid_infra.verify_pipeline import VERIFY_CONTEXT, verify_schedule  # noqa: E402
from support.moto_stack import cdk_context, resources_of  # noqa: E402


def synth(tmp: Path, **context: Any) -> dict[str, Any]:
    app = cdk.App(context={**cdk_context(), **context}, outdir=str(tmp))
    stack = BraidStack(app, "Braid", repository_prefix="prod")
    return Template.from_stack(stack).to_json()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return synth(tmp_path_factory.mktemp("cdk.out"))


def definition(template: dict[str, Any]) -> dict[str, Any]:
    (machine,) = [m for lid, m in resources_of(template, "AWS::StepFunctions::StateMachine").items() if lid.startswith("VerifyPipeline")]
    assert machine["Properties"]["StateMachineType"] == "STANDARD"
    doc: dict[str, Any] = json.loads(Placeholders().render(machine["Properties"]["DefinitionString"]))
    return doc


def test_deep_runs_fan_out_on_express_children_and_quick_runs_need_no_map(template: dict[str, Any]) -> None:
    doc = definition(template)
    states = doc["States"]
    assert doc["StartAt"] == "Identify" and states["Identify"]["Next"] == "PlanVerify" and states["PlanVerify"]["Next"] == "Deep?"
    assert states["Deep?"]["Choices"] == [{"Variable": "$.plan.map", "BooleanEquals": True, "Next": "CheckChunks"}]
    assert states["Deep?"]["Default"] == "RecordVerify"  # quick: PlanVerify checked already
    check = states["CheckChunks"]
    assert check["ItemProcessor"]["ProcessorConfig"] == {"Mode": "DISTRIBUTED", "ExecutionType": "EXPRESS"}
    assert check["ItemReader"]["Parameters"]["Key.$"] == "$.plan.items_object"
    assert check["MaxConcurrencyPath"] == "$.plan.max_concurrency"
    assert check["ToleratedFailurePercentage"] == 100  # failed items are recorded as failed chunks, not lost with the run
    assert check["ResultWriter"]["Parameters"]["Prefix"] == "prod/verify-runs/map-results"  # under the repository's prefix
    assert check["ItemSelector"] == {"prefix.$": "$.prefix", "item.$": "$$.Map.Item.Value"}
    assert check["Next"] == "RecordVerify" and states["RecordVerify"]["Next"] == "VerifySucceeded"
    assert states["VerifySucceeded"]["OutputPath"] == "$.report"  # what `braid verify` prints
    for name in ("PlanVerify", "CheckChunks", "RecordVerify"):
        assert states[name]["Catch"][0]["Next"] == "VerifyFailed", name


def test_every_worker_attempt_and_its_backoff_fit_the_express_child(template: dict[str, Any]) -> None:
    worker = definition(template)["States"]["CheckChunks"]["ItemProcessor"]["States"]["VerifyWorker"]
    throttled, retry = worker["Retry"]
    assert throttled["ErrorEquals"] == [contract.LAMBDA_THROTTLED]
    attempts = retry["MaxAttempts"] + 1
    backoffs = sum(min(retry["IntervalSeconds"] * retry["BackoffRate"] ** i, retry["MaxDelaySeconds"]) for i in range(retry["MaxAttempts"]))
    backoffs += sum(min(throttled["IntervalSeconds"] * throttled["BackoffRate"] ** i, throttled["MaxDelaySeconds"]) for i in range(throttled["MaxAttempts"]))
    # Each attempt may start a new environment, whose Init runs outside the timeout (review 3, L6).
    # The EXPRESS child's 300 s less a 30 s margin for scheduling (review 3, L6).
    timeout = [f["Properties"]["Timeout"] for f in resources_of(template, "AWS::Lambda::Function").values() if "Braid verify worker" in f["Properties"]["Description"]]
    assert timeout == [contract.WORKER_TIMEOUT_SECONDS] and contract.EXPRESS_CHILD_SECONDS == 300
    assert attempts * (contract.WORKER_TIMEOUT_SECONDS + contract.LAMBDA_INIT_SECONDS) + backoffs <= 270
    assert "StorageError" in retry["ErrorEquals"] and "Sandbox.Timedout" in retry["ErrorEquals"]


def test_the_daily_schedule_verifies_each_names_latest_backup(template: dict[str, Any]) -> None:
    rules = [r for lid, r in resources_of(template, "AWS::Events::Rule").items() if lid.startswith("VerifyPipeline")]
    (rule,) = rules
    (target,) = rule["Properties"]["Targets"]
    assert target["Arn"]["Ref"].startswith("VerifyPipelineVerify")
    event = json.loads(target["Input"])
    assert event == {"backups": "latest", "prefix": "prod", "deep": True, "sample_percent": 10.0}
    assert VerifyRequest.from_event(event).backups == "latest"  # the planner takes what the schedule sends


def test_the_schedule_follows_the_context(tmp_path: Path) -> None:
    def event(value: Any) -> dict[str, Any] | None:
        found = [r for lid, r in resources_of(synth(tmp_path / str(len(str(value))), **{VERIFY_CONTEXT: value}), "AWS::Events::Rule").items()
                 if lid.startswith("VerifyPipeline")]
        return json.loads(found[0]["Properties"]["Targets"][0]["Input"]) if found else None

    assert event('{"deep": true, "rotate": 7}') == {"backups": "latest", "prefix": "prod", "deep": True, "rotate": 7}
    assert event({"enabled": False}) is None


@pytest.mark.parametrize(
    "bad", ['{"rotate": 0}', '{"sample_percent": 0}', '{"sample_percent": 10, "rotate": 3}', '{"deep": "yes"}', '{"daily": 1}', "[1]"]
)
def test_a_bad_schedule_fails_synth(bad: str) -> None:
    with pytest.raises(ValueError, match=VERIFY_CONTEXT):
        verify_schedule(bad)


def test_the_stack_outputs_the_verify_state_machine_and_alarms_on_failed_runs(template: dict[str, Any]) -> None:
    assert template["Outputs"][contract.OUTPUT_VERIFY_STATE_MACHINE]["Value"]["Ref"].startswith("VerifyPipelineVerify")
    alarms = [r["Properties"] for r in resources_of(template, "AWS::CloudWatch::Alarm").values()]
    watched = {
        (a["MetricName"], a["Dimensions"][0]["Value"]["Ref"])
        for a in alarms
        if a.get("Namespace") == "AWS/States" and isinstance(a["Dimensions"][0]["Value"], dict) and "Ref" in a["Dimensions"][0]["Value"]
    }
    machine = next(lid for lid in resources_of(template, "AWS::StepFunctions::StateMachine") if lid.startswith("VerifyPipeline"))
    assert {("ExecutionsFailed", machine), ("ExecutionsTimedOut", machine)} <= watched
    assert any(a.get("MetricName") == contract.METRIC_VERIFY_FAILURES for a in alarms)
