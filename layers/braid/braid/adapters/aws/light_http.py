"""The light AWS client's HTTP: pooled HTTP/1.1 connections (braid.adapters.aws.light_wire), SigV4, botocore's standard retries.

Every request is signed (braid.adapters.aws.sigv4), counted as one billed
attempt per try (braid.adapters.aws.clients.process_requests, as botocore's
clients count), and retried exactly as braid.adapters.aws.retries has
botocore retry: the standard conditions (dropped connections and timeouts;
500/502/503/504; 429; the transient and throttling codes such as SlowDown),
at most `RetrySettings.attempts` tries, full-jitter waits announced to
`on_retry` before they are taken, and botocore's retry quota (14 per retry,
given back on success) sized for the threads sharing the client.

Failures are botocore's own exception classes (ClientError with the same
`response` shape, EndpointConnectionError, ReadTimeoutError, ...):
`botocore.exceptions` alone is a few milliseconds and loads nothing else of
botocore, and every caller's `except ClientError` and error mapping stays as
it is.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from botocore.exceptions import ClientError, ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

from braid.adapters.aws.light_credentials import CredentialCache
from braid.adapters.aws.light_wire import Connection
from braid.adapters.aws.retries import RetryNotice, RetrySettings
from braid.adapters.aws.sigv4 import sign
from braid.ports.progress import ProgressFn

if TYPE_CHECKING:
    import ssl

# botocore.retries.standard: TransientRetryableChecker, ThrottledRetryableChecker, ThrottlingStatusCodeChecker.
TRANSIENT_CODES = frozenset({"RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete"})
TRANSIENT_STATUS = frozenset({500, 502, 503, 504})
THROTTLED_CODES = frozenset(
    {
        "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException", "TooManyRequestsException",
        "ProvisionedThroughputExceededException", "TransactionInProgressException", "RequestLimitExceeded", "BandwidthLimitExceeded",
        "LimitExceededException", "RequestThrottled", "SlowDown", "PriorRequestNotComplete", "EC2ThrottledException",
    }
)
THROTTLING_STATUS = frozenset({429})
RETRY_COST = 14  # botocore.retries.standard.RetryQuotaChecker._RETRY_COST (no throttling detector: every retry costs 14)
NO_RETRY_INCREMENT = 1
INITIAL_QUOTA = 500  # botocore.retries.quota.RetryQuota.INITIAL_CAPACITY
USER_AGENT = "braid-light/1"  # unsigned; tells the client apart in a server's log

Body = bytes | Any  # bytes, or braid.adapters.aws.s3_body's reader (views(), seek())
ErrorParser = Callable[[int, Mapping[str, str], bytes], tuple[str, str]]
# What botocore's `before-sign` handlers are to its clients: called with (operation, headers, body) before each
# attempt is signed; may change `headers` in place and returns the body to send. Empty in the product: the
# benchmark's s3proxy shim (scripts/bench_lib/s3compat) adds one.
RequestHook = Callable[[str, dict[str, str], "Body | None"], "Body | None"]
REQUEST_HOOKS: list[RequestHook] = []


def retryable(code: str | None, status: int | None) -> bool:
    """botocore's standard conditions for a response (modeled retryable errors: S3 and Step Functions model none)."""
    return code in TRANSIENT_CODES or code in THROTTLED_CODES or status in TRANSIENT_STATUS or status in THROTTLING_STATUS


def _is_error_document(body: bytes) -> bool:
    """A 200 whose XML root is <Error> (S3 may answer CompleteMultipartUpload so, after its headers went out)."""
    head = body[:1024].lstrip()
    if head.startswith(b"<?xml"):
        head = head[head.find(b"?>") + 2 :].lstrip()
    return head.startswith(b"<Error>")


def _phrase(status: int) -> str:
    """http.client.responses' phrase for a status ("" for one HTTP does not define)."""
    from http import HTTPStatus  # an enum of every status: loaded for an error answer only

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class RetryQuota:
    """botocore.retries.quota.RetryQuota: a retry takes 14, a success gives back what its retries took, or 1."""

    def __init__(self, capacity: int) -> None:
        self.max = capacity
        self.available = capacity
        self._lock = threading.Lock()

    def acquire(self, amount: int) -> bool:
        with self._lock:
            if amount > self.available:
                return False
            self.available -= amount
            return True

    def release(self, amount: int) -> None:
        with self._lock:
            self.available = min(self.max, self.available + amount)


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    stream: Any = None  # the open light_wire.Answer when the caller streams the body (GetObject)
    release: Callable[[bool], None] = field(default=lambda reusable: None)  # give the connection back (True) or drop it


def _context(ca_bundle: str | None) -> ssl.SSLContext:
    """Certificates as botocore finds them: AWS_CA_BUNDLE (or the profile's), else certifi's bundle when installed, else the system's."""
    import ssl  # only over https: a plain-http endpoint never loads it

    if ca_bundle:
        return ssl.create_default_context(cafile=ca_bundle)
    try:
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:
        return ssl.create_default_context()


class Transport:
    """Signed, retried requests to one service; thread-safe, one pooled connection per request in flight."""

    def __init__(
        self,
        *,
        label: str,
        counted_as: str,
        signing_name: str,
        region: str,
        credentials: CredentialCache,
        retries: RetrySettings,
        pool: int,
        connect_timeout: float,
        read_timeout: float,
        on_retry: ProgressFn | None,
        sleep: Callable[[float], None],
        error_parser: ErrorParser,
        s3: bool = False,
        ca_bundle: str | None = None,
    ) -> None:
        self.label, self.counted_as, self.signing_name, self.region = label, counted_as, signing_name, region
        self.credentials = credentials
        self.retries = retries
        self.pool = pool
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.on_retry, self.sleep = on_retry, sleep
        self.error_parser = error_parser
        self.s3 = s3
        self.ca_bundle = ca_bundle
        self.quota = RetryQuota(max(INITIAL_QUOTA, pool * (retries.attempts - 1) * RETRY_COST))
        self._idle: dict[tuple[str, str, int | None], list[Connection]] = {}
        self._lock = threading.Lock()
        self._rng = random.Random()
        self._tls: ssl.SSLContext | None = None

    # -- connections -----------------------------------------------------------

    def _connection(self, scheme: str, host: str, port: int | None) -> Connection:
        with self._lock:
            idle = self._idle.get((scheme, host, port))
            if idle:
                return idle.pop()
            if scheme == "https" and self._tls is None:
                self._tls = _context(self.ca_bundle)
        return Connection(host, port, self.connect_timeout, self._tls if scheme == "https" else None)

    def round_trip_seconds(self) -> float | None:
        """The least smoothed RTT among the idle pooled connections (the path's, queueing aside); None with none measured."""
        with self._lock:
            samples = [rtt for idle in self._idle.values() for connection in idle if (rtt := connection.round_trip_seconds())]
        return min(samples, default=None)

    def _give_back(self, key: tuple[str, str, int | None], connection: Connection, reusable: bool) -> None:
        if reusable:
            with self._lock:
                idle = self._idle.setdefault(key, [])
                if len(idle) < self.pool:
                    idle.append(connection)
                    return
        connection.close()

    def _send_once(self, method: str, url: str, headers: dict[str, str], body: Body | None, stream: bool) -> Response:
        parts = urlsplit(url)
        key = (parts.scheme, parts.hostname or "", parts.port)
        connection = self._connection(*key)
        try:
            if connection.sock is None:
                try:
                    connection.connect()
                except TimeoutError as exc:
                    raise ConnectTimeoutError(endpoint_url=url, error=exc) from None
                except OSError as exc:
                    raise EndpointConnectionError(endpoint_url=url, error=exc) from None
                sock: socket.socket = connection.sock  # type: ignore[assignment]  # set by connect()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # botocore's tcp_keepalive=True
                sock.settimeout(self.read_timeout)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            connection.send_head(method, path, headers)
            if isinstance(body, bytes):
                if body:
                    connection.send(body)
            elif body is not None:
                for view in body.views():  # the caller's buffers, sent without a copy
                    connection.send(view)
            answer = connection.getresponse(method)
        except BaseException:
            connection.close()
            raise
        names = {k.lower(): v for k, v in answer.getheaders()}
        if stream and 200 <= answer.status < 300:
            return Response(answer.status, names, stream=answer, release=lambda reusable: self._give_back(key, connection, reusable and not answer.will_close))
        try:
            data = answer.read()
        except BaseException:
            connection.close()
            raise
        self._give_back(key, connection, not answer.will_close)
        return Response(answer.status, names, data)

    # -- requests ----------------------------------------------------------------

    def request(
        self,
        operation: str,
        method: str,
        url: str,
        headers: dict[str, str],
        body: Body | None = None,
        *,
        payload_hash: str,
        stream: bool = False,
        region: str | None = None,
    ) -> Response:
        """One operation: signed, counted and retried; ClientError (botocore's shape) for an error answer."""
        from braid.adapters.aws.clients import _PROCESS
        from braid.ports.usage import count_request

        host = urlsplit(url).netloc
        attempt = 1
        while True:
            count_request(self.counted_as, operation, _PROCESS)
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            sent = {"Host": host, "User-Agent": USER_AGENT, **headers}
            for hook in REQUEST_HOOKS:
                body = hook(operation, sent, body)
            signed = sign(
                method, url, sent, self.credentials.get(), region=region or self.region, service=self.signing_name,
                timestamp=stamp, payload_hash=payload_hash, s3=self.s3,
            )
            if body is not None and not isinstance(body, bytes):
                body.seek(0)
            failure: BaseException
            try:
                response = self._send_once(method, url, signed, body, stream)
            except (ConnectTimeoutError, EndpointConnectionError) as exc:
                failure, reason, retry = exc, type(exc).__name__, True
            except TimeoutError as exc:
                failure = ReadTimeoutError(endpoint_url=url, error=exc)
                reason, retry = type(failure).__name__, True
            except OSError as exc:  # light_wire.ProtocolError too: an answer cut short or unreadable
                failure = ConnectionClosedError(endpoint_url=url, error=exc)
                reason, retry = type(failure).__name__, True
            else:
                if response.status < 300 and not (operation == "CompleteMultipartUpload" and _is_error_document(response.body)):
                    self.quota.release(RETRY_COST if attempt > 1 else NO_RETRY_INCREMENT)  # what the last retry took, as botocore
                    return response
                code, message = self.error_parser(response.status, response.headers, response.body)
                error = {"Code": code or str(response.status), "Message": message or _phrase(response.status)}
                document: Any = {
                        "Error": error,
                        "ResponseMetadata": {
                            "HTTPStatusCode": response.status, "HTTPHeaders": response.headers, "RetryAttempts": attempt - 1,
                            "RequestId": response.headers.get("x-amz-request-id") or response.headers.get("x-amzn-requestid", ""),
                        },
                }
                failure = ClientError(document, operation)
                retry = retryable(code, response.status) or (response.status == 200)  # a 200 that carries an error: botocore retries it
                reason = error["Code"]  # as botocore reads it: a bodiless answer's code is its status ("503")
            if not retry or attempt >= self.retries.attempts or not self.quota.acquire(RETRY_COST):
                raise failure
            delay = self.retries.delay(attempt, self._rng)
            if self.on_retry is not None:
                self.on_retry(RetryNotice(self.label, operation, reason, attempt, delay).to_event())
            self.sleep(delay)
            attempt += 1


class FullClientFallback:
    """What a light client does not cover goes to botocore's client, built once on first use (thread-safe)."""

    def __init__(self, full: Callable[[], Any]) -> None:
        self._make_full = full
        self._full: Any = None
        self._full_lock = threading.Lock()

    def full(self) -> Any:
        with self._full_lock:
            if self._full is None:
                self._full = self._make_full()
            return self._full

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.full(), name)
