"""The cloud verify from the host: start one execution of the stack's verify state machine and follow it.

The host only starts and watches (StartExecution, DescribeExecution): the
state machine's own functions read the chunks, so the host downloads
nothing and needs no data access beyond what `braid list` has. The
execution's output is the run's reports (braid.pipeline.verify_record);
an execution that failed or timed out is a verify that could not run, an
ExecutionError with the cause Step Functions recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from braid.adapters.aws.errors import AwsCall, aws_error
from braid.errors import BackupError, ExecutionError, StorageError
from braid.ports.executions import TERMINAL

if TYPE_CHECKING:  # the stubs are a development dependency: the Lambda layer does not ship them
    from types_boto3_stepfunctions.client import SFNClient


class CloudVerifier:
    def __init__(self, client: SFNClient, state_machine_arn: str, *, poll_seconds: float = 2.0) -> None:
        self.client = client
        self.state_machine_arn = state_machine_arn
        self.poll_seconds = poll_seconds

    def start(self, name: str, document: dict[str, Any]) -> str:
        arn = self.state_machine_arn

        def specific(code: str, message: str) -> BackupError | None:
            if code in ("AccessDeniedException", "AccessDenied"):
                return StorageError(f"not allowed to start the verify state machine ({arn}): the host needs states:StartExecution on it")
            if code == "StateMachineDoesNotExist":
                return ExecutionError(f"verify state machine {arn} does not exist: deploy the stack, or re-run 'braid init --stack'")
            return None

        try:
            return str(self.client.start_execution(stateMachineArn=arn, name=name, input=json.dumps(document, sort_keys=True))["executionArn"])
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc, AwsCall("Step Functions", "starting the verify state machine", "states:StartExecution"), ExecutionError, specific) from None

    def wait(self, execution_arn: str, on_poll: Callable[[str], None] | None = None) -> dict[str, Any]:
        """The execution's output once it ended; ExecutionError if it did not succeed."""
        while True:
            try:
                response = self.client.describe_execution(executionArn=execution_arn)
            except (ClientError, BotoCoreError) as exc:
                raise aws_error(exc, AwsCall("Step Functions", "following the verify execution", "states:DescribeExecution"), ExecutionError) from None
            status = str(response["status"])
            if status in TERMINAL:
                break
            if on_poll is not None:
                on_poll(status)
            time.sleep(self.poll_seconds)
        if status != "SUCCEEDED":
            detail = response.get("cause") or response.get("error") or "no cause recorded"
            try:
                parsed = json.loads(detail)
                if isinstance(parsed, dict) and parsed.get("errorMessage"):
                    detail = f"{parsed.get('errorType', response.get('error'))}: {parsed['errorMessage']}"
            except (TypeError, ValueError):
                pass
            raise ExecutionError(f"the cloud verify {status.lower().replace('_', ' ')} ({execution_arn}): {detail}")
        output = json.loads(response.get("output") or "{}")
        if not isinstance(output, dict):
            raise ExecutionError(f"the cloud verify returned no report ({execution_arn})")
        return output

    def run(self, name: str, document: dict[str, Any], on_poll: Callable[[str], None] | None = None) -> dict[str, Any]:
        return self.wait(self.start(name, document), on_poll)
