"""Steps both state machines build the same way: a Lambda step and a map's worker, with their retries.

The backup pipeline (braid_infra.pipeline) and the verify pipeline
(braid_infra.verify_pipeline) invoke their functions alike: the payload is
the function's return value, Step Functions' own service-exception retry is
off (each policy here says exactly what is retried), and every retry backs
off with full jitter, so a throttled fan-out does not come back in step.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from braid import contract

LAMBDA_TRANSIENT = list(contract.LAMBDA_TRANSIENT_ERRORS)
TRANSIENT = list(contract.WORKER_TRANSIENT_ERRORS)


@dataclass(frozen=True)
class RetryPolicy:
    interval: Duration = Duration.seconds(2)
    max_attempts: int = 6
    backoff_rate: float = 2.0
    max_delay: Duration = Duration.seconds(60)


# Worker items retry within their EXPRESS child's 5 minutes: 4 attempts of
# at most WORKER_TIMEOUT_SECONDS (60 s; a 16-chunk item takes ~10 s) plus
# backoffs of at most 2 + 4 + 8 s is 254 s < 300 s, so even a worker that
# times out every time fails its item inside the child instead of the child
# timing out (tests/infra checks the sum). Each attempt's AWS requests are
# first retried by the function's client (braid.adapters.aws.clients.PIPELINE:
# 5 attempts); STEP_RETRY covers only Lambda's own invoke failures, when no
# request was made.
WORKER_RETRY = RetryPolicy(max_attempts=contract.WORKER_RETRIES)
STEP_RETRY = RetryPolicy(max_attempts=3)


def _invoke(scope: Construct, name: str, function: lambda_.IFunction, errors: list[str], retry: RetryPolicy, result_path: str | None) -> tasks.LambdaInvoke:
    task = tasks.LambdaInvoke(
        scope,
        name,
        state_name=name,
        lambda_function=function,
        payload_response_only=True,
        retry_on_service_exceptions=False,
        **({"result_path": result_path} if result_path is not None else {}),
    )
    task.add_retry(
        errors=errors,
        interval=retry.interval,
        max_attempts=retry.max_attempts,
        backoff_rate=retry.backoff_rate,
        max_delay=retry.max_delay,
        jitter_strategy=sfn.JitterType.FULL,
    )
    return task


def lambda_step(scope: Construct, name: str, function: lambda_.IFunction, result_path: str, retry: RetryPolicy = STEP_RETRY) -> tasks.LambdaInvoke:
    """A coordinating step: retried only on Lambda's own invoke failures (its requests retry in its client)."""
    return _invoke(scope, name, function, LAMBDA_TRANSIENT, retry, result_path)


def worker_step(scope: Construct, name: str, function: lambda_.IFunction, retry: RetryPolicy = WORKER_RETRY) -> tasks.LambdaInvoke:
    """A map's item processor: also retried on StorageError and a timed-out attempt, inside its EXPRESS child's 5 minutes."""
    return _invoke(scope, name, function, TRANSIENT, retry, None)
