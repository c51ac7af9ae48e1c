"""The scheduled prune's retention comes from stack configuration; unconfigured, it deletes no backup."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "infra"))

import aws_cdk as cdk  # noqa: E402
from aws_cdk import aws_lambda as lambda_  # noqa: E402
from aws_cdk import aws_stepfunctions as sfn  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402

from braid.format.policy import KeepRules  # noqa: E402
from braid.pipeline.maintenance import policy_from_event  # noqa: E402
from braid_infra.schedules import RETENTION_CONTEXT, Schedules  # noqa: E402


def schedule_event(context: dict[str, Any] | None = None, retention: dict[str, Any] | None = None) -> dict[str, Any]:
    """The input the daily rule passes the verify function, from a stack holding just the schedule."""
    app = cdk.App(context=context or {})
    stack = cdk.Stack(app, "S")
    verify = lambda_.Function(
        stack, "Verify", runtime=lambda_.Runtime.PYTHON_3_12, handler="app.handler", code=lambda_.Code.from_inline("def handler(e, c): pass")
    )
    prune = sfn.StateMachine(stack, "Prune", definition_body=sfn.DefinitionBody.from_chainable(sfn.Succeed(stack, "Done")))
    Schedules(stack, "Schedules", verify=verify, prune=prune, repository_prefix="repo", retention=retention)
    rules = Template.from_stack(stack).find_resources("AWS::Events::Rule")
    (rule,) = rules.values()
    (target,) = rule["Properties"]["Targets"]
    event: dict[str, Any] = json.loads(target["Input"])
    return event


def test_default_schedule_carries_no_rule_so_only_stored_policies_apply() -> None:
    event = schedule_event()
    assert event == {"prefix": "repo", "sample_percent": 10.0, "orphan_grace_hours": 48}
    assert policy_from_event(event).stored  # with no policy stored in the repository: no backup removed


def test_context_policy_reaches_the_schedule() -> None:
    event = schedule_event({RETENTION_CONTEXT: '{"keep_daily": 7, "keep_monthly": 12, "keep_within": "14d"}'})
    assert {k: v for k, v in event.items() if k.startswith("keep_")} == {"keep_daily": 7, "keep_monthly": 12, "keep_within": "14d"}
    policy = policy_from_event(event)
    assert not policy.stored and policy.rules == KeepRules.from_json({"keep_daily": 7, "keep_monthly": 12, "keep_within": "14d"})
    # Context given as an object (cdk.json) works too; a prop wins over context.
    assert schedule_event({RETENTION_CONTEXT: {"keep_last": 3}})["keep_last"] == 3
    props = schedule_event({RETENTION_CONTEXT: {"keep_last": 3}}, retention={"keep_yearly": 5})
    assert "keep_last" not in props and props["keep_yearly"] == 5


@pytest.mark.parametrize(
    "bad", ['{"keep_daily": 0}', '{"keep_forever": 1}', "not json", '{"keep_within": "soon"}', "[7]", '{"keep_daily": "7"}']
)
def test_a_bad_policy_fails_synth(bad: str) -> None:
    with pytest.raises(ValueError, match=f"{RETENTION_CONTEXT}: not a retention policy"):
        schedule_event({RETENTION_CONTEXT: bad})
