"""Schedules: a daily deep verify (sampled) of the latest backups, and prune.

EventBridge invokes the verify function with a fixed input; a failed verify
shows as the VerifyFailures metric and a "Verify Failed" event.
"""

from __future__ import annotations

from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from constructs import Construct


class Schedules(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        verify: lambda_.IFunction,
        repository_prefix: str,
        sample_percent: float = 10.0,
        keep_last: int = 7,
        keep_days: int = 35,
        orphan_grace_hours: int = 48,
    ) -> None:
        super().__init__(scope, construct_id)
        self.rule = events.Rule(
            self,
            "DailyVerify",
            description="Braid: deep-verify a sample of the latest backups, then apply retention",
            schedule=events.Schedule.cron(minute="17", hour="4"),
        )
        self.rule.add_target(
            targets.LambdaFunction(
                verify,
                event=events.RuleTargetInput.from_object(
                    {
                        "prefix": repository_prefix,
                        "sample_percent": sample_percent,
                        "keep_last": keep_last,
                        "keep_days": keep_days,
                        "orphan_grace_hours": orphan_grace_hours,
                    }
                ),
                retry_attempts=2,
            )
        )
