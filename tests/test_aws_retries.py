"""One retry layer per AWS client: botocore's conditions, our backoff, quota and progress report.

Failures are injected the way S3 sends them (HTTP responses, before-send)
into moto, so what is tested is the client's own retry path end to end.
"""

from __future__ import annotations

import io
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, ConnectionClosedError
from moto import mock_aws

from braid.adapters.aws.clients import HOST, PIPELINE, PIPELINE_KMS
from braid.adapters.aws.retries import RetryNotice, RetrySettings, retry_conflicts
from braid.adapters.aws.s3 import S3Store
from braid.errors import AlreadyExistsError, StorageError, UsageError

BUCKET = "braid-retries"


class _Raw(io.BytesIO):
    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.read()


def _error(request: Any, code: str, status: int) -> AWSResponse:
    body = f"<Error><Code>{code}</Code><Message>m</Message></Error>".encode()
    return AWSResponse(request.url, status, {"Content-Type": "application/xml"}, _Raw(body))


@dataclass
class Faults:
    """The next answers of PutObject: an error code with its status, or a dropped connection."""

    answers: list[tuple[str, int]] = field(default_factory=list)
    sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def before_send(self, request: Any, **_: Any) -> AWSResponse | None:
        with self.lock:
            self.sent += 1
            if not self.answers:
                return None
            code, status = self.answers.pop(0)
        if code == "drop":
            raise ConnectionClosedError(endpoint_url=request.url)
        return _error(request, code, status)


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def s3(aws_env: None) -> Iterator[tuple[S3Store, Faults, Sleeps, list[dict[str, Any]]]]:
    with mock_aws():
        sleeps, events, faults = Sleeps(), [], Faults()
        store = S3Store.from_url(f"s3://{BUCKET}/repo", region="us-east-1", retries=RetrySettings("standard", 4, base=0.5, cap=2.0), sleep=sleeps)
        store.client.create_bucket(Bucket=BUCKET)
        store.client.meta.events.register_first("before-send.s3.PutObject", faults.before_send)
        store.retries.send_to(events.append)
        yield store, faults, sleeps, events


def test_a_retrys_message_says_the_delay_its_event_carries() -> None:
    """The jitter can draw 0.04996 s: the event's delay is 0.05, and the message says 0.1 s with it, not 0.0 s."""
    event = RetryNotice("S3", "PutObject", "SlowDown", 1, 0.04996).to_event()
    assert event["delay"] == 0.05 and event["message"] == f"SlowDown, retrying in {event['delay']:.1f} s" == "SlowDown, retrying in 0.1 s"


def test_slowdown_is_retried_and_each_retry_is_reported_before_its_wait(s3: tuple[S3Store, Faults, Sleeps, list[dict[str, Any]]]) -> None:
    store, faults, sleeps, events = s3
    faults.answers = [("SlowDown", 503), ("SlowDown", 503), ("drop", 0)]
    store.put("a", b"data")
    assert store.get("a") == b"data" and faults.sent == 4
    assert [(e["event"], e["service"], e["operation"], e["reason"], e["attempt"]) for e in events] == [
        ("retry", "S3", "PutObject", "SlowDown", 1),
        ("retry", "S3", "PutObject", "SlowDown", 2),
        ("retry", "S3", "PutObject", "ConnectionClosedError", 3),
    ]
    assert [e["delay"] for e in events] == [round(s, 3) for s in sleeps]  # the wait announced is the wait taken
    assert all(e["message"] == f"{e['reason']}, retrying in {e['delay']:.1f} s" for e in events)
    assert all(0 <= s <= min(2.0, 0.5 * 2 ** (n - 1)) for n, s in enumerate(sleeps, start=1))


def test_a_slowdown_outlasting_the_attempts_names_the_fix(s3: tuple[S3Store, Faults, Sleeps, list[dict[str, Any]]]) -> None:
    store, faults, sleeps, events = s3
    faults.answers = [("SlowDown", 503)] * 4
    with pytest.raises(StorageError, match=r"S3 kept throttling while writing s3://braid-retries/repo/a \(SlowDown\) after retries; lower --concurrency"):
        store.put("a", b"data")
    assert faults.sent == 4 and len(sleeps) == 3 == len(events)  # 4 attempts: 3 waits


def test_errors_that_another_attempt_cannot_fix_are_not_retried(s3: tuple[S3Store, Faults, Sleeps, list[dict[str, Any]]]) -> None:
    store, faults, sleeps, events = s3
    faults.answers = [("AccessDenied", 403)]
    with pytest.raises(StorageError, match="access denied while writing s3://braid-retries/repo/a: the role needs s3:PutObject"):
        store.put("a", b"data")
    assert faults.sent == 1 and sleeps == [] and events == []


def test_the_retry_quota_outlasts_a_long_episode_on_every_thread(aws_env: None) -> None:
    """botocore's own quota (500) would stop retrying after a few requests that
    each waited out a SlowDown episode; ours is sized for the client's threads."""
    with mock_aws():
        settings = RetrySettings("standard", attempts=10)
        store = S3Store.from_url(f"s3://{BUCKET}/repo", region="us-east-1", retries=settings, sleep=lambda _: None)
        store.client.create_bucket(Bucket=BUCKET)
        faults = Faults()
        store.client.meta.events.register_first("before-send.s3.PutObject", faults.before_send)
        for n in range(12):
            faults.answers = [("SlowDown", 503)] * 9
            store.put(f"k{n}", b"x")
        assert faults.sent == 12 * 10


def test_budgets_are_what_the_worst_cases_say() -> None:
    """clients.py writes each budget's worst case next to it; these are the numbers it quotes."""
    assert (HOST.mode, HOST.attempts, HOST.worst_wait) == ("standard", 10, 121.5)
    assert (PIPELINE.attempts, PIPELINE.worst_wait) == (5, 7.5)
    assert (PIPELINE_KMS.attempts, PIPELINE_KMS.worst_wait) == (8, 35.5)
    with pytest.raises(UsageError, match="retry mode"):
        RetrySettings("fast", 3)


def test_backoff_is_full_jitter_and_bounded() -> None:
    settings = RetrySettings("standard", attempts=7, base=0.5, cap=4.0)
    rng = random.Random(1)
    for retry in range(1, 7):
        values = [settings.delay(retry, rng) for _ in range(200)]
        ceiling = min(4.0, 0.5 * 2 ** (retry - 1))
        assert all(0 <= v <= ceiling for v in values)
        assert max(values) > ceiling * 0.8 and min(values) < ceiling * 0.2  # spread over the whole range


def _conflict() -> ClientError:
    return ClientError({"Error": {"Code": "ConditionalRequestConflict", "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": 409}}, "PutObject")


def test_conflicts_are_retried_by_the_one_helper() -> None:
    calls, sleeps, events = [], Sleeps(), []

    def request() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _conflict()
        return "stored"

    assert retry_conflicts(request, operation="PutObject", on_retry=events.append, sleep=sleeps, rng=random.Random(3)) == "stored"
    assert len(calls) == 3 and [e["reason"] for e in events] == ["ConditionalRequestConflict"] * 2
    assert all(0 <= s <= 0.05 * 2**n for n, s in enumerate(sleeps))


def test_conflicts_give_up_after_five_and_other_errors_pass_through() -> None:
    attempts: list[int] = []

    def always() -> None:
        attempts.append(1)
        raise _conflict()

    with pytest.raises(ClientError):
        retry_conflicts(always, sleep=lambda _: None)
    assert len(attempts) == 5
    denied = ClientError({"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "PutObject")

    def refuse() -> None:
        attempts.append(1)
        raise denied

    with pytest.raises(ClientError):
        retry_conflicts(refuse, sleep=lambda _: None)
    assert len(attempts) == 6


def test_create_only_write_after_a_conflict_finds_the_object(s3: tuple[S3Store, Faults, Sleeps, list[dict[str, Any]]]) -> None:
    store, faults, sleeps, events = s3
    store.put("chunk", b"published", create_only=True)
    faults.answers = [("ConditionalRequestConflict", 409)]
    with pytest.raises(AlreadyExistsError):
        store.put("chunk", b"late", create_only=True)  # 409, retried, then 412
    assert faults.sent == 3 and [e["reason"] for e in events] == ["ConditionalRequestConflict"]
    assert store.get("chunk") == b"published"


def test_a_client_reports_to_whatever_its_relay_points_at_now(aws_env: None) -> None:
    with mock_aws():
        store = S3Store.from_url(f"s3://{BUCKET}", region="us-east-1", sleep=lambda _: None)
        store.client.create_bucket(Bucket=BUCKET)
        faults = Faults()
        store.client.meta.events.register_first("before-send.s3.PutObject", faults.before_send)
        first, second = [], []
        store.retries.send_to(first.append)
        faults.answers = [("SlowDown", 503)]
        store.put("a", b"1")
        store.retries.send_to(second.append)
        faults.answers = [("InternalError", 500)]
        store.put("b", b"2")
        assert [e["reason"] for e in first] == ["SlowDown"] and [e["reason"] for e in second] == ["InternalError"]
