"""Schedules: a daily deep verify (sampled) of the latest backups, then the prune run.

EventBridge invokes the verify function (the scheduled maintenance) with a
fixed input; a failed verify shows as the VerifyFailures metric and a
"Verify Failed" event. The function then starts the prune state machine
(braid_infra.prune_pipeline) with the same input and, as `distrusted`, the
backups that failed its verify (braid.pipeline.maintenance): it may start
executions of that state machine and of nothing else.

Retention comes from stack configuration: the `retention` prop, else the
CDK context `braid:retention` (a JSON object, or its text), e.g.
`cdk deploy -c 'braid:retention={"keep_daily": 7, "keep_monthly": 12}'`,
with any of keep_last, keep_hourly, keep_daily, keep_weekly, keep_monthly,
keep_yearly, keep_within ("1y6m"), keep_days (braid.format.policy). By
default none is configured: the event carries no rule, and the scheduled
prune then applies only the policies stored in the repository
(`braid prune --name NAME --keep-... --save-policy`), so a stack nobody
configured deletes no backup. Leftovers of backups that never completed
are collected either way (they are not backups).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from braid import contract
from braid.errors import UsageError
from braid.format.policy import KeepRules

RETENTION_CONTEXT = "braid:retention"


def retention_rules(value: Any) -> dict[str, Any]:
    """The schedule event's keep rules from a prop or context value (None: none); a bad value fails synth."""
    if value is None or value == "":
        return {}
    try:
        doc = json.loads(value) if isinstance(value, str) else value
        rules = KeepRules.from_json(dict(doc) if isinstance(doc, Mapping) else doc)
    except (ValueError, UsageError) as exc:
        raise ValueError(f"{RETENTION_CONTEXT}: not a retention policy ({exc}); e.g. {{\"keep_daily\": 7, \"keep_monthly\": 12}}") from None
    return rules.to_json()


class Schedules(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        verify: lambda_.Function,
        prune: sfn.IStateMachine,
        repository_prefix: str,
        sample_percent: float = 10.0,
        retention: Mapping[str, Any] | None = None,
        orphan_grace_hours: int = 48,
    ) -> None:
        super().__init__(scope, construct_id)
        self.retention = retention_rules(retention if retention is not None else self.node.try_get_context(RETENTION_CONTEXT))
        self.rule = events.Rule(
            self,
            "DailyVerify",
            description="Braid: deep-verify a sample of the latest backups, then start the prune run",
            schedule=events.Schedule.cron(minute="17", hour="4"),
        )
        self.rule.add_target(
            targets.LambdaFunction(
                verify,
                event=events.RuleTargetInput.from_object(
                    {
                        "prefix": repository_prefix,
                        "sample_percent": sample_percent,
                        **self.retention,
                        "orphan_grace_hours": orphan_grace_hours,
                    }
                ),
                retry_attempts=2,
            )
        )
        verify.add_environment(contract.ENV_PRUNE_STATE_MACHINE, prune.state_machine_arn)
        prune.grant_start_execution(verify)
