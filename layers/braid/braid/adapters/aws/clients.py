"""Every AWS client Braid makes comes from `aws_client`, with the retry budget of where it runs.

One builder, so S3, KMS, Step Functions, EventBridge and CloudFormation
agree on retries, timeouts, the missing-region message and how retries are
reported (braid.adapters.aws.retries). The budgets below are the only
retries on the request path besides the state machine's: the agent has no
retry loop of its own, and the one helper for codes botocore does not retry
(409s: retries.retry_conflicts) is counted here too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import NoRegionError

from braid.adapters.aws.retries import CONFLICT_ATTEMPTS, RetrySettings, install_retries
from braid.errors import UsageError
from braid.ports.progress import ProgressFn
from braid.ports.usage import RequestTally, count_request

if TYPE_CHECKING:  # the stubs are a development dependency: the Lambda layer does not ship them
    from boto3.session import Session
    from types_boto3_cloudformation.client import CloudFormationClient
    from types_boto3_events.client import EventBridgeClient
    from types_boto3_kms.client import KMSClient
    from types_boto3_s3.client import S3Client
    from types_boto3_stepfunctions.client import SFNClient

# The agent on the database host: S3, and KMS, Step Functions, CloudFormation.
# Nothing above it retries a request (a failed backup is continued with
# --resume), so a long SlowDown episode is waited out here: 10 attempts with
# waits of up to 0.5, 1, 2, 4, 8, 16, 30, 30, 30 s (121.5 s in all, about
# half that on average) before the backup stops with "lower --concurrency or
# --rate-limit and resume".
# Worst case: 10 HTTP attempts per request; 10 x 5 = 50 for a create-only
# write that also keeps meeting 409 ConditionalRequestConflict.
HOST = RetrySettings(mode="standard", attempts=10, base=0.5, cap=30.0)

# The pipeline's Lambdas. The state machine retries a failed Worker item on
# StorageError (infra/braid_infra/pipeline.py WORKER_RETRY: 6 attempts, waits
# of 2 s doubling to 60 s), so a request a worker makes is tried at most
# 5 x 6 = 30 times (5 x 5 x 6 = 150 for a create-only chunk write that also
# keeps meeting 409s). The other steps' Retry (STEP_RETRY, 3 attempts) covers
# only Lambda's own invoke failures, when no request was made: 5 at most.
# Waits of up to 0.5 + 1 + 2 + 4 = 7.5 s keep a worker well inside its 180 s
# timeout; the state machine does the long waiting.
PIPELINE = RetrySettings(mode="standard", attempts=5, base=0.5, cap=10.0)

# KMS in the pipeline: a Decrypt that keeps throttling (a burst of workers)
# fails the item with KeyAccessError, which the state machine does not retry,
# so KMS gets the longer wait here: 8 attempts, up to 35.5 s in all.
PIPELINE_KMS = RetrySettings(mode="standard", attempts=8, base=0.5, cap=10.0)

assert CONFLICT_ATTEMPTS == 5, "the worst cases above count 5 attempts of retry_conflicts"

# Every request this process's clients sent: what a host process (one `braid` command) used.
# A Lambda handler counts its own invocation's instead (braid.ports.usage.metering): there
# a process serves one invocation after another, and the emulated cloud many at once.
_PROCESS = RequestTally()


def install_request_counting(client: BaseClient, service: str) -> None:
    """Count every HTTP attempt `client` makes (retries included: each is billed), as `service:Operation`.

    botocore emits `request-created` once per attempt, before signing and
    sending (an emulator's in-process stub answers after it), into the
    process's tally and the tally of the work in progress
    (braid.ports.usage): the manifest's usage is made of these counts.
    """

    def counted(operation_name: str = "", **_: Any) -> None:
        count_request(service, operation_name, _PROCESS)

    client.meta.events.register("request-created", counted)


def process_requests() -> dict[str, int]:
    """What this process's clients (those made by `aws_client`) have sent so far, `service:Operation` -> attempts."""
    return _PROCESS.counts()


def aws_client(
    service: str,
    *,
    retries: RetrySettings = HOST,
    region: str | None = None,
    endpoint_url: str | None = None,
    session: Session | None = None,
    pool: int = 10,
    connect_timeout: float = 10,
    read_timeout: float = 60,
    on_retry: ProgressFn | None = None,
    sleep: Callable[[float], None] = time.sleep,
    **config: Any,
) -> BaseClient:
    """A boto3 client for `service` with Braid's retries (reported to `on_retry`) and timeouts.

    `pool` is how many requests may be in flight at once (boto3 clients are
    thread-safe and shared by threads): the connection pool, and the retry
    quota, so that one long episode in which every one of them fails every
    attempt still fits.
    `AWS_ENDPOINT_URL` (an emulator, s3proxy) is honoured by boto3 itself.
    """
    import boto3

    retry_config: Any = {"mode": retries.mode, "total_max_attempts": retries.attempts}
    settings = Config(
        retries=retry_config,
        max_pool_connections=pool,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        tcp_keepalive=True,
    )
    if config:
        settings = settings.merge(Config(**config))
    kwargs: dict[str, Any] = {"config": settings}
    if region:
        kwargs["region_name"] = region
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
    try:
        factory = session or boto3.session.Session()
        client: BaseClient = factory.client(service, **kwargs)  # type: ignore[call-overload]  # `service` is a str, not one literal
    except NoRegionError:
        raise UsageError("no AWS region configured: set AWS_DEFAULT_REGION or AWS_REGION") from None
    install_retries(client, retries, threads=pool, on_retry=on_retry, sleep=sleep)
    install_request_counting(client, service)
    return client


def s3_client(*, concurrency: int = 10, retries: RetrySettings = HOST, **options: Any) -> S3Client:
    """An S3 client sized for `concurrency` threads sharing it.

    The pool must hold one connection per thread plus a few for records and
    listings, or urllib3 discards and reopens connections; connections open
    lazily, so a generous floor costs nothing when a caller does not say how
    many threads it runs.
    """
    client = aws_client(
        "s3",
        retries=retries,
        pool=max(64, concurrency + 8),
        read_timeout=120,
        # We send CRC64NVME ourselves on every write; botocore's default
        # CRC32 (with aws-chunked trailers) would be redundant work, and some
        # S3-compatible servers do not accept trailers.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_supported",
        # SigV4 would otherwise SHA-256 every payload byte on http endpoints
        # (emulators, s3proxy): over 1 CPU-second per GiB on the host. Every
        # write carries a CRC64NVME that S3 verifies, which covers integrity.
        s3={"payload_signing_enabled": False},
        **options,
    )
    return cast("S3Client", client)


def kms_client(*, retries: RetrySettings = HOST, **options: Any) -> KMSClient:
    """A KMS client (KMS throttles bursts of Decrypt; the budget waits them out)."""
    return cast("KMSClient", aws_client("kms", retries=retries, read_timeout=30, **options))


def stepfunctions_client(*, retries: RetrySettings = HOST, **options: Any) -> SFNClient:
    return cast("SFNClient", aws_client("stepfunctions", retries=retries, **options))


def events_client(*, retries: RetrySettings = PIPELINE, **options: Any) -> EventBridgeClient:
    return cast("EventBridgeClient", aws_client("events", retries=retries, **options))


def cloudformation_client(*, retries: RetrySettings = HOST, **options: Any) -> CloudFormationClient:
    return cast("CloudFormationClient", aws_client("cloudformation", retries=retries, **options))
