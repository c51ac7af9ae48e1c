"""One retry layer per AWS client, sized where it is configured, and told to progress.

botocore's standard retry conditions decide what is worth another attempt
(throttling such as SlowDown, 5xx, timeouts, dropped connections); this
module only swaps in what Braid needs on top of them:

- the backoff: full jitter, `base * 2**retry` capped at `cap`, so the threads
  sharing a client spread their retries instead of hitting S3 in step, and a
  long SlowDown episode is waited out rather than lost (braid.adapters.aws.clients
  sizes each client and writes its worst case down);
- a retry quota sized for the threads that share the client, so one long
  episode in which every thread fails every attempt still fits;
- a report before every wait ("SlowDown, retrying in 3.2 s") to a ProgressFn.
  We sleep here and let botocore resend at once, so the wait is announced
  before it starts and tests need no real clock.

`retry_conflicts` is the one helper for the codes botocore does not retry:
409 ConditionalRequestConflict and OperationAborted (S3 asks for another try
of a conditional write that raced another). NoSuchUpload is never retried:
braid.adapters.aws.s3_multipart turns it into UploadGoneError for the caller
to decide.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError  # botocore.exceptions alone: a few ms, nothing else of botocore

from braid.adapters.aws.errors import error_code
from braid.errors import UsageError
from braid.ports.progress import ProgressFn

if TYPE_CHECKING:
    from botocore.client import BaseClient

T = TypeVar("T")

MODES = ("standard", "adaptive")
# What botocore charges the quota for one retry (RetryQuotaChecker._RETRY_COST); sized against it below.
_RETRY_COST = 14

CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "OperationAborted"})
CONFLICT_ATTEMPTS = 5
CONFLICT_BASE = 0.05  # seconds: the racing write is one request away from done


@dataclass(frozen=True)
class RetrySettings:
    """Attempts per request (the first included) and the jittered backoff between them."""

    mode: str  # "standard", or "adaptive": also slows the client's sending rate after throttling
    attempts: int
    base: float = 0.5  # seconds
    cap: float = 20.0  # seconds, the longest single wait

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"invalid retry mode {self.mode!r}: use standard or adaptive")
        if self.attempts < 1:
            raise UsageError("a client needs at least one attempt per request")

    def ceiling(self, retry: int) -> float:
        """The longest wait before retry `retry` (1 for the first)."""
        return float(min(self.cap, self.base * 2 ** (retry - 1)))

    def delay(self, retry: int, rng: random.Random) -> float:
        """Full jitter: anywhere in [0, ceiling], so threads do not retry in step."""
        return rng.uniform(0.0, self.ceiling(retry))

    @property
    def worst_wait(self) -> float:
        """Seconds one request may wait in all before it fails."""
        return sum(self.ceiling(retry) for retry in range(1, self.attempts))


@dataclass(frozen=True)
class RetryNotice:
    """One retry about to happen: what failed, and how long until the next attempt."""

    service: str
    operation: str
    reason: str  # the error code ("SlowDown"), "HTTP 503", or the exception's name
    attempt: int  # the attempt that failed, 1-based
    delay: float

    @property
    def message(self) -> str:
        """Says the event's own `delay` (rounded to the millisecond first), so the two never disagree at a rounding edge."""
        return f"{self.reason}, retrying in {round(self.delay, 3):.1f} s"

    def to_event(self) -> dict[str, Any]:
        return {
            "event": "retry",
            "service": self.service,
            "operation": self.operation,
            "reason": self.reason,
            "attempt": self.attempt,
            "delay": round(self.delay, 3),
            "message": self.message,
        }


def _jittered_backoff(settings: RetrySettings, rng: random.Random) -> Any:
    """botocore's backoff interface with our full jitter (made here: botocore.retries loads with a full client only)."""
    from botocore.retries.base import BaseRetryBackoff

    class _JitteredBackoff(BaseRetryBackoff):
        def delay_amount(self, context: Any) -> float:
            return settings.delay(int(context.attempt_number), rng)

    return _JitteredBackoff()


class _ReportingRetries:
    """Wraps botocore's RetryHandler: announce the wait, take it, then let botocore resend."""

    def __init__(self, handler: Any, service: str, on_retry: ProgressFn | None, sleep: Callable[[float], None]) -> None:
        self._handler = handler
        self._service = service
        self._on_retry = on_retry
        self._sleep = sleep

    def needs_retry(self, **kwargs: Any) -> float | bool | None:
        delay = self._handler.needs_retry(**kwargs)
        if delay is None or delay is False:
            return delay  # no retry (False: and no later handler may ask for one)
        operation = kwargs.get("operation")
        notice = RetryNotice(
            self._service, getattr(operation, "name", "?"), _reason(kwargs), int(kwargs.get("attempts", 0)), float(delay)
        )
        if self._on_retry is not None:
            self._on_retry(notice.to_event())
        self._sleep(notice.delay)
        return 0  # not None: botocore retries, after sleeping 0 s


def _reason(kwargs: dict[str, Any]) -> str:
    caught = kwargs.get("caught_exception")
    if caught is not None:
        return type(caught).__name__
    http_response, parsed = kwargs.get("response") or (None, None)
    code = (parsed or {}).get("Error", {}).get("Code") if isinstance(parsed, dict) else None
    if code:
        return str(code)
    return f"HTTP {getattr(http_response, 'status_code', '?')}"


def install_retries(
    client: BaseClient,
    settings: RetrySettings,
    *,
    threads: int = 1,
    on_retry: ProgressFn | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> None:
    """Replace the client's retry handler with botocore's standard one, our backoff, quota and report.

    `threads` is how many requests may be in flight on the client at once:
    the quota holds one episode in which every one of them fails every attempt.
    Call it on a client created with `retries={"mode": settings.mode,
    "total_max_attempts": settings.attempts}` (braid.adapters.aws.clients
    does): the adaptive mode's rate limiter stays as botocore registered it.
    """
    from botocore.retries import quota, standard

    service = client.meta.service_model.service_id.hyphenize()
    checker = standard.RetryQuotaChecker(quota.RetryQuota(initial_capacity=max(quota.RetryQuota.INITIAL_CAPACITY, threads * (settings.attempts - 1) * _RETRY_COST)))
    handler = standard.RetryHandler(
        retry_policy=standard.RetryPolicy(
            retry_checker=standard.StandardRetryConditions(max_attempts=settings.attempts),
            retry_backoff=_jittered_backoff(settings, rng or random.Random()),
        ),
        retry_event_adapter=standard.RetryEventAdapter(),
        retry_quota=checker,  # type: ignore[arg-type]  # the stubs name the quota; botocore passes its checker
    )
    events = client.meta.events
    unique_id = f"retry-config-{service}"  # how botocore registers its own handler
    events.unregister(f"needs-retry.{service}", unique_id=unique_id)
    # First, so ours decides even if botocore ever registered its own under another id.
    reporting = _ReportingRetries(handler, _service_label(client), on_retry, sleep)
    # The stubs type handlers as returning None; botocore reads a needs-retry handler's answer (the delay).
    events.register_first(f"needs-retry.{service}", reporting.needs_retry, unique_id=unique_id)  # type: ignore[arg-type]
    events.register(f"after-call.{service}", checker.release_retry_quota)


def _service_label(client: BaseClient) -> str:
    return str(client.meta.service_model.service_id)


def retry_conflicts(
    request: Callable[[], T],
    *,
    service: str = "S3",
    operation: str = "",
    on_retry: ProgressFn | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    attempts: int = CONFLICT_ATTEMPTS,
) -> T:
    """Run `request`, again on 409 ConditionalRequestConflict / OperationAborted (botocore does not).

    S3 answers 409 when a conditional write raced another to the same key;
    the next attempt then succeeds or finds the object (412). Every other
    error, and the last conflict, goes to the caller unchanged. Worst case:
    `attempts` (5) requests, each itself retried by the client.
    """
    draw = rng or random.Random()
    for attempt in range(1, attempts + 1):
        try:
            return request()
        except ClientError as exc:
            code = error_code(exc)
            if code not in CONFLICT_CODES or attempt == attempts:
                raise
            delay = draw.uniform(0.0, CONFLICT_BASE * 2 ** (attempt - 1))
            if on_retry is not None:
                on_retry(RetryNotice(service, operation, code, attempt, delay).to_event())
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
