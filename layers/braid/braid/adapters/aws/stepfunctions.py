"""Executions over AWS Step Functions: one execution per backup.

The agent starts and watches executions: StartExecution (named by the
backup, so starting twice finds the same one) and DescribeExecution; and it
wakes its sleeping execution with the task token the pipeline left in the
backup's staging (SendTaskSuccess, braid.format.staging.wake). These are the
only Step Functions permissions its IAM policy grants.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from braid.adapters.aws.errors import AwsCall, aws_error
from braid.errors import BackupError, ExecutionError, NotFoundError, StorageError
from braid.format.ids import BackupRef
from braid.pipeline.execution_input import execution_name
from braid.ports.executions import ExecutionStatus

if TYPE_CHECKING:  # the stubs are a development dependency: the Lambda layer does not ship them
    from types_boto3_stepfunctions.client import SFNClient


# SendTaskSuccess for a token whose task no longer waits (already woken, timed out, or its execution ended).
STALE_TOKEN_ERRORS = frozenset({"TaskTimedOut", "TaskDoesNotExist", "InvalidToken"})


class StepFunctionsExecutions:
    """Executions of one state machine (the stack's backup pipeline)."""

    def __init__(self, client: SFNClient, state_machine_arn: str) -> None:
        self.client = client
        self.state_machine_arn = state_machine_arn

    def execution_arn(self, ref: BackupRef) -> str:
        # arn:aws:states:REGION:ACCOUNT:stateMachine:NAME -> ...:execution:NAME:EXECUTION
        parts = self.state_machine_arn.split(":")
        return ":".join(parts[:5] + ["execution", parts[6], execution_name(ref)])

    def start(self, ref: BackupRef, document: dict[str, Any]) -> str:
        arn = self.state_machine_arn

        def specific(code: str, message: str) -> BackupError | None:
            if code in ("AccessDeniedException", "AccessDenied"):
                return StorageError(f"not allowed to start the backup pipeline ({arn}): the agent needs states:StartExecution")
            if code == "StateMachineDoesNotExist":
                return ExecutionError(f"state machine {arn} does not exist: deploy the stack, or re-run 'braid init --stack'")
            return None

        try:
            response = self.client.start_execution(stateMachineArn=arn, name=execution_name(ref), input=json.dumps(document, sort_keys=True))
            return str(response["executionArn"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ExecutionAlreadyExists":
                return self.execution_arn(ref)  # started before (a resumed backup): follow that one
            raise aws_error(exc, self._call(f"starting the pipeline of {ref}", "states:StartExecution"), ExecutionError, specific) from None
        except BotoCoreError as exc:
            raise aws_error(exc, self._call(f"starting the pipeline of {ref}", "states:StartExecution"), ExecutionError) from None

    def describe(self, ref: BackupRef) -> ExecutionStatus:
        arn = self.execution_arn(ref)

        def specific(code: str, message: str) -> BackupError | None:
            if code == "ExecutionDoesNotExist":
                return NotFoundError(f"no pipeline execution for {ref} ({arn})")
            return None

        try:
            response = self.client.describe_execution(executionArn=arn)
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc, self._call(f"reading the pipeline execution of {ref}", "states:DescribeExecution"), ExecutionError, specific) from None
        return ExecutionStatus(arn, str(response["status"]), response.get("error"), response.get("cause"))

    def wake(self, token: str) -> bool:
        # The state discards whatever is sent: a wake can only make the planner look sooner.
        try:
            self.client.send_task_success(taskToken=token, output="{}")
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in STALE_TOKEN_ERRORS:
                return False  # woken already, or timed out: the execution moved on
            raise aws_error(exc, self._call("waking the backup pipeline", "states:SendTaskSuccess"), ExecutionError) from None
        except BotoCoreError as exc:
            raise aws_error(exc, self._call("waking the backup pipeline", "states:SendTaskSuccess"), ExecutionError) from None

    def _call(self, doing: str, permission: str) -> AwsCall:
        return AwsCall("Step Functions", doing, permission)


class StepFunctionsPruneRuns:
    """braid.ports.pipeline.PruneRuns over the stack's prune state machine: one execution per run, named by it."""

    def __init__(self, client: SFNClient, state_machine_arn: str) -> None:
        self.client = client
        self.state_machine_arn = state_machine_arn

    def start(self, run: str, document: Mapping[str, Any]) -> str:
        call = AwsCall("Step Functions", f"starting prune run {run}", "states:StartExecution")
        try:
            response = self.client.start_execution(stateMachineArn=self.state_machine_arn, name=run, input=json.dumps(dict(document), sort_keys=True))
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc, call, ExecutionError) from None
        return str(response["executionArn"])
