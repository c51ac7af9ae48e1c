"""The fan-out engine's control plane on AWS: one Step Functions execution per backup.

The agent only starts and watches executions: StartExecution (named by the
backup, so starting twice finds the same one) and DescribeExecution. These
are the only Step Functions permissions its IAM policy grants.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from braid.errors import ExecutionError, NotFoundError, StorageError
from braid.format.ids import BackupRef
from braid.pipeline.execution_input import execution_name

TERMINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")


def stepfunctions_client(region: str | None = None) -> Any:
    return boto3.client("stepfunctions", region_name=region, config=Config(retries={"mode": "standard", "max_attempts": 8}))


@dataclass(frozen=True)
class ExecutionStatus:
    arn: str
    status: str  # RUNNING | SUCCEEDED | FAILED | TIMED_OUT | ABORTED | PENDING_REDRIVE
    error: str | None
    cause: str | None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def failure_message(self, ref: BackupRef) -> str:
        detail = self.cause or self.error or "no cause recorded"
        try:  # Lambda errors arrive as JSON with an errorMessage
            parsed = json.loads(detail)
            if isinstance(parsed, dict) and parsed.get("errorMessage"):
                detail = f"{parsed.get('errorType', self.error)}: {parsed['errorMessage']}"
        except (TypeError, ValueError):
            pass
        if detail.startswith(f"backup {ref} "):  # the pipeline's Cleanup already says it all
            return detail
        return f"backup {ref} {self.status.lower().replace('_', ' ')} in Step Functions ({self.error or 'error'}): {detail}"


class StepFunctionsEngine:
    def __init__(self, client: Any, state_machine_arn: str) -> None:
        self.client = client
        self.state_machine_arn = state_machine_arn

    def execution_arn(self, ref: BackupRef) -> str:
        # arn:aws:states:REGION:ACCOUNT:stateMachine:NAME -> ...:execution:NAME:EXECUTION
        parts = self.state_machine_arn.split(":")
        return ":".join(parts[:5] + ["execution", parts[6], execution_name(ref)])

    def start(self, ref: BackupRef, document: dict[str, Any]) -> str:
        try:
            response = self.client.start_execution(
                stateMachineArn=self.state_machine_arn, name=execution_name(ref), input=json.dumps(document, sort_keys=True)
            )
            return str(response["executionArn"])
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ExecutionAlreadyExists":
                return self.execution_arn(ref)
            if code in ("AccessDeniedException", "AccessDenied"):
                raise StorageError(f"not allowed to start the backup pipeline ({self.state_machine_arn}): the agent needs states:StartExecution") from None
            if code == "StateMachineDoesNotExist":
                raise ExecutionError(f"state machine {self.state_machine_arn} does not exist: deploy the stack, or re-run 'braid init --stack'") from None
            raise ExecutionError(f"cannot start the pipeline for {ref}: {exc}") from None
        except BotoCoreError as exc:
            raise ExecutionError(f"cannot reach Step Functions to start {ref}: {exc}") from None

    def describe(self, ref: BackupRef) -> ExecutionStatus:
        arn = self.execution_arn(ref)
        try:
            response = self.client.describe_execution(executionArn=arn)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ExecutionDoesNotExist":
                raise NotFoundError(f"no pipeline execution for {ref} ({arn})") from None
            raise ExecutionError(f"cannot read the pipeline execution of {ref}: {exc}") from None
        except BotoCoreError as exc:
            raise ExecutionError(f"cannot reach Step Functions for {ref}: {exc}") from None
        return ExecutionStatus(arn, str(response["status"]), response.get("error"), response.get("cause"))
