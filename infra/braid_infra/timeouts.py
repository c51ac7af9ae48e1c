"""TimedOutCleanup: a backup execution that times out is cleaned up like one that failed.

An execution past its TimeoutSeconds (braid_infra.storage.EXECUTION_TIMEOUT, 7
days) ends TIMED_OUT without running any Catch, so the pipeline's Cleanup state
never runs: its staging, raw database bytes, would wait for the bucket
lifecycle and its stored chunks for the next prune. Step Functions sends an
EventBridge event for every status change of a Standard execution ("Step
Functions Execution Status Change", source aws.states, which no one else may
send); this rule sends the backup machine's TIMED_OUT ones to the Cleanup
function (the version the stack published), which reads the backup from the
execution's input and cleans up as the Cleanup state does
(braid.pipeline.cleanup.timed_out_state). An execution stopped by hand
(ABORTED) is left alone: `braid backup --abandon` is the way to give a backup up.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from braid.pipeline.cleanup import STATUS_CHANGE


class TimedOutCleanup(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, state_machine: sfn.StateMachine, cleanup: lambda_.IFunction) -> None:
        super().__init__(scope, construct_id)
        source, detail_type = STATUS_CHANGE
        self.rule = events.Rule(
            self,
            "TimedOut",
            description="Braid: clean up after a backup execution that timed out (no Catch runs then)",
            event_pattern=events.EventPattern(
                source=[source],
                detail_type=[detail_type],
                detail={"status": ["TIMED_OUT"], "stateMachineArn": [state_machine.state_machine_arn]},
            ),
        )
        # Cleanup is idempotent (it deletes what is there), so EventBridge's and Lambda's retries are safe.
        self.rule.add_target(targets.LambdaFunction(cleanup, retry_attempts=8, max_event_age=Duration.hours(24)))
