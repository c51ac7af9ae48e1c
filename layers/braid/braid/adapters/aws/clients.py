"""Every AWS client Braid makes comes from `aws_client`, with the retry budget of where it runs.

One builder, so S3, KMS, Step Functions, EventBridge and CloudFormation
agree on retries, timeouts, the missing-region message and how retries are
reported (braid.adapters.aws.retries). The budgets below are the only
retries on the request path besides the state machine's: the agent has no
retry loop of its own, and the one helper for codes botocore does not retry
(409s: retries.retry_conflicts) is counted here too.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from braid.adapters.aws.retries import CONFLICT_ATTEMPTS, RetrySettings, install_retries
from braid.errors import UsageError
from braid.ports.progress import ProgressFn
from braid.ports.usage import RequestTally, count_request

if TYPE_CHECKING:  # the stubs are a development dependency: the Lambda layer does not ship them
    import botocore.session
    from botocore.client import BaseClient
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


def _model_loader(extra: list[str] | None) -> Any:
    """botocore's loader, minus the walk over every service it ships to check one name.

    `Loader.load_service_model` lists all ~440 directories under
    botocore/data (about 2,600 stat and listdir calls, ~35 ms of CPU per
    model type) only to refuse an unknown name; listing the one service's
    own directory tells the same (UnknownServiceError, a DataNotFoundError).
    Made here, not at import: botocore loads only when a full client is made
    (the agent's light clients need none of it: braid.adapters.aws.light_clients).
    """
    from botocore.exceptions import DataNotFoundError, UnknownServiceError
    from botocore.loaders import Loader, instance_cache

    class _ModelLoader(Loader):
        @instance_cache
        def load_service_model(self, service_name: str, type_name: str, api_version: str | None = None) -> Any:
            if api_version is None:
                try:
                    api_version = self.determine_latest_version(service_name, type_name)
                except DataNotFoundError:
                    raise UnknownServiceError(service_name=service_name, known_service_names="(see botocore/data)") from None
            model = self.load_data(os.path.join(service_name, api_version, type_name))
            loader: Any = self  # botocore's own (untyped) helpers for the `.sdk-extras` files, as its method uses them
            loader._extras_processor.process(model, loader._find_extras(service_name, type_name, api_version))
            return model

    return _ModelLoader(extra_search_paths=extra)


_SESSION_ENV = ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
_sessions: dict[tuple[object, ...], Any] = {}
_sessions_lock = threading.Lock()


def shared_session() -> botocore.session.Session:
    """The process's botocore session: one per process, not one per client.

    Each new session costs ~80 ms of CPU (built-in handlers, the endpoint
    data, the service models parsed again) and resolves credentials again
    (on an instance role, a request to the metadata service): a cloud
    backup makes an S3 and a Step Functions client, `wal-push` the same,
    once per WAL segment. Clients never share event handlers (each gets a
    copy of the session's). A new one is made when the credentials'
    environment changes (tests) or handlers were added to botocore's
    built-in list since (moto, the benchmark's shim register there).
    """
    import botocore.handlers
    import botocore.session

    key = (*(os.environ.get(name) for name in _SESSION_ENV), len(botocore.handlers.BUILTIN_HANDLERS))
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None:
            session = botocore.session.get_session()
            data_path = session.get_config_variable("data_path")  # AWS_DATA_PATH, as botocore's own loader honours it
            extra = [os.path.expanduser(os.path.expandvars(p)) for p in data_path.split(os.pathsep)] if data_path else None
            session.register_component("data_loader", _model_loader(extra))
            _sessions.clear()
            _sessions[key] = session
        return session


def aws_client(
    service: str,
    *,
    retries: RetrySettings = HOST,
    region: str | None = None,
    endpoint_url: str | None = None,
    session: botocore.session.Session | None = None,
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
    from botocore.config import Config
    from botocore.exceptions import NoRegionError

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
        client: BaseClient = (session or shared_session()).create_client(service, **kwargs)
    except NoRegionError:
        raise UsageError("no AWS region configured: set AWS_DEFAULT_REGION or AWS_REGION") from None
    install_retries(client, retries, threads=pool, on_retry=on_retry, sleep=sleep)
    install_request_counting(client, service)
    return client


def s3_client(*, concurrency: int = 10, retries: RetrySettings = HOST, light: bool = False, **options: Any) -> S3Client:
    """An S3 client sized for `concurrency` threads sharing it.

    The pool must hold one connection per thread plus a few for records and
    listings, or urllib3 discards and reopens connections; connections open
    lazily, so a generous floor costs nothing when a caller does not say how
    many threads it runs.

    `light`: the agent's client without botocore (braid.adapters.aws.light_clients:
    the same methods, answers and errors for the calls a cloud backup and
    `wal-push` make), when this host's credentials and settings are ones it
    covers; else, and for any other call, botocore's.
    """
    pool = max(64, concurrency + 8)

    def full() -> S3Client:
        client = aws_client(
            "s3",
            retries=retries,
            pool=pool,
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

    if light:
        from braid.adapters.aws.light_clients import light_client

        made = light_client("s3", full, retries=retries, pool=pool, read_timeout=120, **options)
        if made is not None:
            return cast("S3Client", made)
    return full()


def kms_client(*, retries: RetrySettings = HOST, **options: Any) -> KMSClient:
    """A KMS client (KMS throttles bursts of Decrypt; the budget waits them out)."""
    return cast("KMSClient", aws_client("kms", retries=retries, read_timeout=30, **options))


def stepfunctions_client(*, retries: RetrySettings = HOST, light: bool = False, **options: Any) -> SFNClient:
    """A Step Functions client; `light` as for s3_client (StartExecution, DescribeExecution, SendTaskSuccess)."""

    def full() -> SFNClient:
        return cast("SFNClient", aws_client("stepfunctions", retries=retries, **options))

    if light:
        from braid.adapters.aws.light_clients import light_client

        made = light_client("stepfunctions", full, retries=retries, pool=10, read_timeout=60, **options)
        if made is not None:
            return cast("SFNClient", made)
    return full()


def events_client(*, retries: RetrySettings = PIPELINE, **options: Any) -> EventBridgeClient:
    return cast("EventBridgeClient", aws_client("events", retries=retries, **options))


def cloudformation_client(*, retries: RetrySettings = HOST, **options: Any) -> CloudFormationClient:
    return cast("CloudFormationClient", aws_client("cloudformation", retries=retries, **options))
