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
from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from braid import contract

LAMBDA_TRANSIENT = list(contract.LAMBDA_TRANSIENT_ERRORS)


@dataclass(frozen=True)
class RetryPolicy:
    interval: Duration = Duration.seconds(2)
    max_attempts: int = 6
    backoff_rate: float = 2.0
    max_delay: Duration = Duration.seconds(60)


STEP_RETRY = RetryPolicy(max_attempts=3)


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


def logged_machine(scope: Construct, construct_id: str, definition: sfn.IChainable, *, comment: str, timeout: Duration) -> sfn.StateMachine:
    """A Standard state machine, traced, logging every event (without execution data: it may name backups' keys) for 3 months."""
    log_group = logs.LogGroup(scope, "ExecutionLogs", retention=logs.RetentionDays.THREE_MONTHS, removal_policy=RemovalPolicy.DESTROY)
    return sfn.StateMachine(
        scope,
        construct_id,
        definition_body=sfn.DefinitionBody.from_chainable(definition),
        state_machine_type=sfn.StateMachineType.STANDARD,
        comment=comment,
        tracing_enabled=True,
        logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=False),
        timeout=timeout,
    )
