"""Steps Braid's state machines build the same way: a Lambda step, a map's worker, their retries, and the machine itself.

The backup, verify and prune pipelines (braid_infra.pipeline,
braid_infra.verify_pipeline, braid_infra.prune_pipeline) invoke their
functions alike: the payload is the function's return value, Step
Functions' own service-exception retry is off (CDK's default would retry
every error six times, transient or not; each policy here says exactly what
is retried), and every retry backs off with full jitter, so a throttled
fan-out does not come back in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from braid import contract

VENDED_LOGS = "/aws/vendedlogs/states/"  # the prefix Step Functions' log groups are named under
LAMBDA_TRANSIENT = list(contract.LAMBDA_TRANSIENT_ERRORS)
TRANSIENT = list(contract.WORKER_TRANSIENT_ERRORS)


@dataclass(frozen=True)
class RetryPolicy:
    interval: Duration = Duration.seconds(2)
    max_attempts: int = 6
    backoff_rate: float = 2.0
    max_delay: Duration = Duration.seconds(60)


# Worker items retry within their EXPRESS child's 5 minutes: 3 attempts of
# at most WORKER_TIMEOUT_SECONDS (55 s), each after up to 10 s of INIT outside
# its timeout, plus backoffs of at most 2 + 4 s, plus the throttle retry's
# 2 + 4 + 8 + 16 + 16 + 16 s: 3 x 65 + 6 + 62 = 263 s <= 270 s, 30 s and more
# inside the child's 300 s (review 3, L6: scheduling), so even a worker that
# times out every time fails its item inside the child instead of the child
# timing out (tests/infra checks the sum). Each attempt's AWS requests are
# first retried by the function's client (braid.adapters.aws.clients.PIPELINE:
# 5 attempts); STEP_RETRY covers only Lambda's own invoke failures, when no
# request was made.
WORKER_RETRY = RetryPolicy(max_attempts=contract.WORKER_RETRIES)
STEP_RETRY = RetryPolicy(max_attempts=3)
# A throttled invoke ran nothing, so it costs only its backoff. Concurrent backups share the stack's worker
# budget (braid.pipeline.account_budget), so their maps stay within it; throttling is left for the moments a
# backup starting later has not yet taken its share, or other functions of the account use its pool: up to a
# minute of back-off (full jitter spreads the retries out) rides that out inside the EXPRESS child; a
# coordinating step rides out minutes.
WORKER_THROTTLE_RETRY = RetryPolicy(interval=Duration.seconds(2), max_attempts=6, max_delay=Duration.seconds(16))
STEP_THROTTLE_RETRY = RetryPolicy(interval=Duration.seconds(2), max_attempts=10, max_delay=Duration.seconds(60))


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


def _invoke(
    scope: Construct, name: str, function: lambda_.IFunction, result_path: str | None, payload: sfn.TaskInput | None = None,
) -> tasks.LambdaInvoke:
    return tasks.LambdaInvoke(
        scope,
        name,
        state_name=name,
        lambda_function=function,
        payload_response_only=True,
        retry_on_service_exceptions=False,
        **({"result_path": result_path} if result_path is not None else {}),
        **({"payload": payload} if payload is not None else {}),
    )


def lambda_step(
    scope: Construct, name: str, function: lambda_.IFunction, result_path: str, retry: RetryPolicy = STEP_RETRY, *, payload: sfn.TaskInput | None = None,
) -> tasks.LambdaInvoke:
    """A coordinating step: retried only on Lambda's own invoke failures (its requests retry in its client), and throttling.

    `payload`: what the function is given (default: the whole state)."""
    throttled = retried(_invoke(scope, name, function, result_path, payload), [contract.LAMBDA_THROTTLED], STEP_THROTTLE_RETRY)
    return retried(throttled, LAMBDA_TRANSIENT, retry)


def worker_step(scope: Construct, name: str, function: lambda_.IFunction, retry: RetryPolicy = WORKER_RETRY) -> tasks.LambdaInvoke:
    """A map's item processor: also retried on StorageError and a timed-out attempt, inside its EXPRESS child's 5 minutes."""
    throttled = retried(_invoke(scope, name, function, None), [contract.LAMBDA_THROTTLED], WORKER_THROTTLE_RETRY)
    return retried(throttled, TRANSIENT, retry)


class ScopedJsonItemReader(sfn.S3JsonItemReader):
    """CDK's S3JsonItemReader granting the state machine s3:GetObject on `objects` only.

    CDK's own grants it on every object of the bucket; the backup machine's would read every staged byte
    of every backup (review 3, L1), where it only needs the items it maps.
    """

    def __init__(self, *, bucket: s3.IBucket, key: str, objects: Sequence[str]) -> None:
        super().__init__(bucket=bucket, key=key)
        self._objects = list(objects)

    def provide_policy_statements(self) -> list[iam.PolicyStatement]:
        return [iam.PolicyStatement(actions=["s3:GetObject"], resources=self._objects)]


class ScopedResultWriter(sfn.ResultWriterV2):
    """CDK's ResultWriterV2 granting its export's requests on `objects` only, not on every object of the bucket."""

    def __init__(self, *, bucket: s3.IBucket, prefix: str, objects: Sequence[str]) -> None:
        super().__init__(bucket=bucket, prefix=prefix)
        self._objects = list(objects)

    def provide_policy_statements(self) -> list[iam.PolicyStatement]:
        actions = ["s3:PutObject", "s3:GetObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]  # a large export is multipart
        return [iam.PolicyStatement(actions=actions, resources=self._objects)]


def item_failed(scope: Construct, name: str) -> sfn.Pass:
    """Where a map item whose step failed after its retries ends: a success whose output is {} (OutputPath null).

    A failed child's place in a map's output holds its whole execution result (input, error, cause), and the
    map's output is capped at 262,144 bytes like any state's; a few dozen failed items would fail the map with
    States.DataLimitExceeded. The failure is not lost: the item recorded it in S3, where the pipeline looks.
    """
    return sfn.Pass(
        scope,
        name,
        state_name=name,
        comment="The item failed after its retries; its error is recorded in S3 and the next plan takes the item again",
        output_path=sfn.JsonPath.DISCARD,
    )


def logged_machine(scope: Construct, construct_id: str, definition: sfn.IChainable, *, comment: str, timeout: Duration) -> sfn.StateMachine:
    """A Standard state machine, traced, logging every event (without execution data: it may name backups' keys) for 3 months.

    Its log group is `/aws/vendedlogs/states/<stack>-<machine>`: Step Functions adds a statement for every log group it
    delivers to to the account's one CloudWatch Logs resource policy (5,120 characters at most) unless the name starts
    with /aws/vendedlogs/ (Step Functions, "Avoiding CloudWatch Logs resource policy size restrictions").
    """
    log_group = logs.LogGroup(
        scope,
        "ExecutionLogs",
        log_group_name=f"{VENDED_LOGS}{Stack.of(scope).stack_name}-{construct_id}",
        retention=logs.RetentionDays.THREE_MONTHS,
        removal_policy=RemovalPolicy.DESTROY,
    )
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
