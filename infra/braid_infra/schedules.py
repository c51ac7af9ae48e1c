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
        prune_after_days: int = 2,
    ) -> None:
        super().__init__(scope, construct_id)
        self.rule = events.Rule(
            self,
            "DailyVerify",
            description="Braid: deep-verify a sample of the latest backups, prune backups that never completed",
            schedule=events.Schedule.cron(minute="17", hour="4"),
        )
        self.rule.add_target(
            targets.LambdaFunction(
                verify,
                event=events.RuleTargetInput.from_object(
                    {"prefix": repository_prefix, "sample_percent": sample_percent, "prune_after_days": prune_after_days}
                ),
                retry_attempts=2,
            )
        )
