"""Step helpers shared by Braid's state machines: a Lambda step and its retries, written once.

Every coordinating step invokes its function with the payload as the whole
result and no automatic service-exception retry (CDK's default would retry
every error six times, whether transient or not); the retries are explicit:
Lambda's own transient failures for coordinating steps, and those plus
Braid's StorageError and a timed-out attempt for map workers, each with full
jitter so a fan-out of items does not retry in lockstep.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from braid import contract
from braid_infra.pipeline import RetryPolicy

LAMBDA_TRANSIENT = list(contract.LAMBDA_TRANSIENT_ERRORS)


def retried(task: tasks.LambdaInvoke, errors: Sequence[str], policy: RetryPolicy) -> tasks.LambdaInvoke:
    """`task` with one Retry for `errors` under `policy` (full jitter)."""
    task.add_retry(
        errors=list(errors),
        interval=policy.interval,
        max_attempts=policy.max_attempts,
        backoff_rate=policy.backoff_rate,
        max_delay=policy.max_delay,
        jitter_strategy=sfn.JitterType.FULL,
    )
    return task


def lambda_step(scope: Construct, name: str, function: lambda_.IFunction, result_path: str, policy: RetryPolicy) -> tasks.LambdaInvoke:
    """A coordinating step: invoke `function`, its result at `result_path`, retried on Lambda's transient errors."""
    task = tasks.LambdaInvoke(
        scope, name, state_name=name, lambda_function=function, payload_response_only=True, retry_on_service_exceptions=False, result_path=result_path
    )
    return retried(task, LAMBDA_TRANSIENT, policy)
