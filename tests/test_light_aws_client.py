"""The agent's light S3 client: botocore's headers for the same call, its errors, its retries (braid.adapters.aws.light_*).

A scripted HTTP server on loopback answers what each test needs (SlowDown,
409 conflicts, 412, NoSuchKey); the adapters above the client (S3Store)
must turn them into the same typed errors as with botocore's client.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from braid.adapters.aws.clients import process_requests, s3_client
from braid.adapters.aws.light_http import Response, Transport
from braid.adapters.aws.light_s3 import LightS3
from braid.adapters.aws.s3 import S3Store
from braid.adapters.aws.s3_body import request_body
from braid.errors import AlreadyExistsError, NotFoundError, StorageError

SLOWDOWN = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
CONFLICT = b"<Error><Code>ConditionalRequestConflict</Code><Message>A conflicting operation is in progress.</Message></Error>"
PRECONDITION = b"<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold</Message></Error>"
NO_SUCH_KEY = b"<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>"


@pytest.fixture(autouse=True)
def unhooked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other tests in this process may have imported moto, whose in-process stub turns the light clients off
    (braid.adapters.aws.light_clients._hooked, tested on its own): these tests are about the light clients."""
    monkeypatch.setattr("braid.adapters.aws.light_clients._hooked", lambda: False)


@dataclass
class Script:
    answers: list[tuple[int, bytes, dict[str, str]]] = field(default_factory=list)  # taken in order; then 200 with no body
    seen: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            script.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            status, payload, headers = script.answers.pop(0) if script.answers else (200, b"", {})
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _answer

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def light(aws_env: None, server: tuple[str, Script]) -> tuple[S3Store, list[dict[str, Any]], list[float]]:
    endpoint, _ = server
    notices: list[dict[str, Any]] = []
    waits: list[float] = []
    client = s3_client(light=True, endpoint_url=endpoint, on_retry=notices.append, sleep=waits.append)
    assert isinstance(client, LightS3)
    return S3Store(client, "bucket", "repo"), notices, waits


def test_slowdown_is_retried_with_a_notice_and_every_attempt_is_counted(light: tuple[S3Store, list[dict[str, Any]], list[float]], server: tuple[str, Script]) -> None:
    store, notices, waits = light
    _, script = server
    script.answers = [(503, SLOWDOWN, {}), (503, SLOWDOWN, {})]
    before = process_requests().get("s3:PutObject", 0)
    store.put("data/x", b"hello")
    assert [(n["reason"], n["attempt"], n["service"], n["operation"]) for n in notices] == [("SlowDown", 1, "S3", "PutObject"), ("SlowDown", 2, "S3", "PutObject")]
    assert len(waits) == 2 and 0 <= waits[0] <= 0.5 and 0 <= waits[1] <= 1.0  # full jitter under HOST's 0.5 s, 1 s ceilings
    assert process_requests()["s3:PutObject"] - before == 3
    assert len(script.seen) == 3 and {s[3] for s in script.seen} == {b"hello"}  # the body sent again whole each time


def test_slowdown_past_the_host_budget_fails_after_ten_attempts_with_the_advice(light: tuple[S3Store, list[dict[str, Any]], list[float]], server: tuple[str, Script]) -> None:
    store, notices, waits = light
    _, script = server
    script.answers = [(503, SLOWDOWN, {})] * 12
    with pytest.raises(StorageError, match=r"S3 kept throttling while writing s3://bucket/repo/data/x \(SlowDown\) after retries; lower --concurrency"):
        store.put("data/x", b"hello")
    assert len(script.seen) == 10 and len(notices) == 9
    assert max(waits) <= 30.0


def test_a_locked_wal_push_sends_its_retention_with_the_checksum_s3_requires(light: tuple[S3Store, list[dict[str, Any]], list[float]], server: tuple[str, Script]) -> None:
    """`wal-push` to an s3:// repository under Object Lock (the light client): the PUT carries the mode, the date
    (braid.format.lock: the write plus the days) and an SDK checksum, without which S3 refuses a PUT with retention."""
    from datetime import UTC, datetime

    from braid.format.lock import ObjectLock

    store, _, _ = light
    _, script = server
    lock = ObjectLock("COMPLIANCE", 30)
    store.use_object_lock(lock)
    before = datetime.now(UTC)
    store.put("wal/pg/0000000100000000/000000010000000000000003", b"stored wal", create_only=True)
    after = datetime.now(UTC)
    ((method, path, headers, body),) = script.seen
    assert (method, path, body) == ("PUT", "/bucket/repo/wal/pg/0000000100000000/000000010000000000000003", b"stored wal")
    assert headers["x-amz-object-lock-mode"] == "COMPLIANCE" and headers["if-none-match"] == "*"
    until = datetime.strptime(headers["x-amz-object-lock-retain-until-date"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert lock.wal_until(before) <= until <= lock.wal_until(after)
    assert headers["x-amz-sdk-checksum-algorithm"] == "CRC64NVME" and headers["x-amz-checksum-crc64nvme"]


def test_a_409_conflict_is_tried_again_and_a_412_is_already_exists(light: tuple[S3Store, list[dict[str, Any]], list[float]], server: tuple[str, Script]) -> None:
    store, _, _ = light
    _, script = server
    script.answers = [(409, CONFLICT, {})]
    store.put("data/x", b"hello", create_only=True)  # retry_conflicts: the second attempt succeeds
    assert len(script.seen) == 2 and script.seen[0][2]["if-none-match"] == "*"
    script.answers = [(412, PRECONDITION, {})]
    with pytest.raises(AlreadyExistsError, match="object data/x already exists"):
        store.put("data/x", b"hello", create_only=True)


def test_missing_objects_read_as_botocore_reports_them(light: tuple[S3Store, list[dict[str, Any]], list[float]], server: tuple[str, Script]) -> None:
    store, _, _ = light
    _, script = server
    script.answers = [(404, NO_SUCH_KEY, {"Content-Type": "application/xml"}), (404, b"", {})]
    with pytest.raises(NotFoundError, match="object repo/data/gone not found in s3://bucket"):
        store.get("data/gone")
    assert store.head("data/gone") is None  # a HEAD's 404 has no body: the code is "404", as botocore reads it
    assert script.seen[0][2]["x-amz-checksum-mode"] == "ENABLED"  # GetObject asks for the checksum, as botocore's when_supported does


def test_a_whole_object_whose_crc_does_not_match_is_refused(light: tuple[S3Store, list[dict[str, Any]], list[float]], server: tuple[str, Script]) -> None:
    store, _, _ = light
    _, script = server
    from braid.format.checksum import s3_checksum_value, stored_checksum

    good = s3_checksum_value(stored_checksum(b"hello"))
    script.answers = [(200, b"hello", {"x-amz-checksum-crc64nvme": good}), (200, b"hellp", {"x-amz-checksum-crc64nvme": good})]
    assert store.get("data/x") == b"hello"
    with pytest.raises(StorageError, match="checksum mismatch while reading s3://bucket/repo/data/x"):
        store.get("data/x")


# -- the same request as botocore's client sends ---------------------------------------------------------------------

IGNORED = {"user-agent", "amz-sdk-invocation-id", "amz-sdk-request", "x-amz-date", "authorization", "expect", "host", "transfer-encoding"}


class Sent(Exception):
    pass


def _plain(headers: Any) -> dict[str, str]:
    """Header names lower-cased, values as text (botocore's prepared request holds bytes), the ignored ones left out."""
    return {k.lower(): v.decode() if isinstance(v, bytes) else str(v) for k, v in headers.items() if k.lower() not in IGNORED}


def _botocore_request(endpoint: str, operation: str, params: dict[str, Any]) -> tuple[str, str, dict[str, str], bytes]:
    client = s3_client(endpoint_url=endpoint)
    seen: list[Any] = []

    def capture(request: Any, **_: Any) -> None:
        seen.append(request)
        raise Sent

    client.meta.events.register_first("before-send.s3", capture)
    with pytest.raises(Sent):
        getattr(client, operation)(**params)
    request = seen[0]
    body = request.body if isinstance(request.body, bytes) else (request.body.read() if request.body is not None else b"")
    return request.method, request.url, _plain(request.headers), body or b""


def _light_request(endpoint: str, operation: str, params: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, dict[str, str], bytes]:
    seen: list[Any] = []

    def send(self: Transport, method: str, url: str, headers: dict[str, str], body: Any, stream: bool) -> Response:
        data = body if isinstance(body, bytes) else b"".join(bytes(v) for v in body.views()) if body is not None else b""
        seen.append((method, url, _plain(headers), data))
        raise Sent

    monkeypatch.setattr(Transport, "_send_once", send)
    client = s3_client(light=True, endpoint_url=endpoint, retries=__import__("braid.adapters.aws.retries", fromlist=["x"]).RetrySettings("standard", 1))
    assert isinstance(client, LightS3)
    with pytest.raises(Sent):
        result = getattr(client, operation)(**params)
        if hasattr(result, "__next__") or operation == "list_objects_v2":
            list(result)
    return seen[0]


CHECK = "Fg5AiE8Eaws="
CALLS = [
    ("put_object", {"Bucket": "bucket", "Key": "repo/a b+c~d", "Body": b"hello", "ChecksumAlgorithm": "CRC64NVME", "ChecksumCRC64NVME": CHECK,
                    "IfNoneMatch": "*", "ObjectLockMode": "COMPLIANCE", "ObjectLockRetainUntilDate": __import__("datetime").datetime(2030, 1, 2, 3, 4, 5,
                    tzinfo=__import__("datetime").UTC)}),
    ("put_object", {"Bucket": "bucket", "Key": "wal/x", "Body": b"hello", "ChecksumAlgorithm": "SHA256", "ChecksumSHA256": "LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=",
                    "IfNoneMatch": "*", "Metadata": {"braid-sha256": "ab"}}),
    ("put_object", {"Bucket": "bucket", "Key": "k", "Body": request_body([bytearray(b"he"), memoryview(b"llo")]), "IfMatch": '"etag"'}),
    ("get_object", {"Bucket": "bucket", "Key": "k", "Range": "bytes=0-9"}),
    ("get_object", {"Bucket": "bucket", "Key": "k", "VersionId": "v/1", "ChecksumMode": "ENABLED"}),
    ("head_object", {"Bucket": "bucket", "Key": "k", "ChecksumMode": "ENABLED"}),
    ("delete_object", {"Bucket": "bucket", "Key": "k", "VersionId": "v1"}),
    ("delete_objects", {"Bucket": "bucket", "Delete": {"Objects": [{"Key": "a&b"}, {"Key": "c", "VersionId": "v"}], "Quiet": True}}),
    ("create_multipart_upload", {"Bucket": "bucket", "Key": "s/p", "ChecksumAlgorithm": "CRC64NVME", "ChecksumType": "FULL_OBJECT"}),
    ("upload_part", {"Bucket": "bucket", "Key": "s/p", "UploadId": "u/1=", "PartNumber": 7, "Body": request_body([bytearray(b"hello")]), "ContentLength": 5,
                     "ChecksumAlgorithm": "CRC64NVME", "ChecksumCRC64NVME": CHECK}),
    ("complete_multipart_upload", {"Bucket": "bucket", "Key": "s/p", "UploadId": "u1", "MultipartUpload": {"Parts": [
        {"PartNumber": 1, "ETag": '"e1"', "ChecksumCRC64NVME": CHECK}, {"PartNumber": 2, "ETag": '"e2"', "ChecksumCRC64NVME": CHECK}]},
        "ChecksumCRC64NVME": CHECK, "ChecksumType": "FULL_OBJECT", "MpuObjectSize": 12}),
    ("abort_multipart_upload", {"Bucket": "bucket", "Key": "s/p", "UploadId": "u1"}),
]


@pytest.mark.parametrize(("operation", "params"), CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CALLS)])
def test_each_call_sends_what_botocore_sends(operation: str, params: dict[str, Any], aws_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = "http://127.0.0.1:9"
    ours = _light_request(endpoint, operation, params, monkeypatch)
    if hasattr(params.get("Body"), "seek"):
        params["Body"].seek(0)
    theirs = _botocore_request(endpoint, operation, params)
    assert ours[:2] == theirs[:2]
    assert ours[2] == theirs[2]
    assert ours[3] == theirs[3]


@pytest.mark.parametrize(("name", "params"), [("list_objects_v2", {"Bucket": "bucket", "Prefix": "repo/a b/", "StartAfter": "repo/a b/x"}),
                                              ("list_objects_v2", {"Bucket": "bucket", "Prefix": "repo/", "Delimiter": "/"}),
                                              ("list_parts", {"Bucket": "bucket", "Key": "s/p", "UploadId": "u1"}),
                                              ("list_multipart_uploads", {"Bucket": "bucket", "Prefix": "repo/staging/"})])
def test_each_listing_asks_what_botocore_asks(name: str, params: dict[str, Any], aws_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = "http://127.0.0.1:9"
    seen: list[Any] = []

    def send(self: Transport, method: str, url: str, headers: dict[str, str], body: Any, stream: bool) -> Response:
        seen.append((method, url, _plain(headers)))
        raise Sent

    original = Transport._send_once
    monkeypatch.setattr(Transport, "_send_once", send)
    from braid.adapters.aws.retries import RetrySettings

    client = s3_client(light=True, endpoint_url=endpoint, retries=RetrySettings("standard", 1))
    with pytest.raises(Sent):
        next(iter(client.get_paginator(name).paginate(**params)))
    monkeypatch.setattr(Transport, "_send_once", original)
    full = s3_client(endpoint_url=endpoint)
    caught: list[Any] = []

    def capture(request: Any, **_: Any) -> None:
        caught.append(request)
        raise Sent

    full.meta.events.register_first("before-send.s3", capture)
    with pytest.raises(Sent):
        next(iter(full.get_paginator(name).paginate(**params)))
    from urllib.parse import parse_qsl, urlsplit

    ours, theirs = urlsplit(seen[0][1]), urlsplit(caught[0].url)
    assert (seen[0][0], ours.path, sorted(parse_qsl(ours.query, keep_blank_values=True))) == (
        caught[0].method, theirs.path, sorted(parse_qsl(theirs.query, keep_blank_values=True)))
    assert seen[0][2] == _plain(caught[0].headers)


def test_a_complete_that_answers_200_with_an_error_is_retried(light: tuple[S3Store, list[dict[str, Any]], list[float]], server: tuple[str, Script]) -> None:
    """S3 can fail a CompleteMultipartUpload after sending 200: botocore reads the <Error> body and retries; so does the light client."""
    store, notices, _ = light
    _, script = server
    failed = b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code><Message>We encountered an internal error.</Message></Error>'
    done = b"<CompleteMultipartUploadResult><Bucket>bucket</Bucket><Key>repo/k</Key><ETag>\"e-1\"</ETag></CompleteMultipartUploadResult>"
    script.answers = [(200, failed, {}), (200, done, {})]
    answer = store.client.complete_multipart_upload(Bucket="bucket", Key="repo/k", UploadId="u", MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"e"'}]})
    assert answer["ETag"] == '"e-1"' and [n["reason"] for n in notices] == ["InternalError"]


def test_the_path_to_s3_is_measured_on_the_clients_own_connection(light: tuple[S3Store, list[dict[str, Any]], list[float]], tmp_path: Any) -> None:
    """The part-grouping policy's inputs: the RTT the kernel measured on a pooled connection, and the host's tcp_wmem."""
    from braid.adapters.aws.light_wire import round_trip_seconds, send_buffer_max
    from braid.adapters.aws.s3_multipart import S3Multipart

    store, _, _ = light
    assert store.client.round_trip_seconds() is None  # no connection yet: nothing measured
    store.put("data/x", b"hello")
    rtt = store.client.round_trip_seconds()
    assert rtt is not None and 0 < rtt < 0.5  # loopback: microseconds to a few milliseconds
    sample = S3Multipart(store).path_sample()
    wmem = send_buffer_max()
    assert (sample is None) == (wmem is None) and (sample is None or sample == (rtt, wmem))
    import socket

    with socket.socket() as unconnected:
        assert round_trip_seconds(unconnected) is None
    (tmp_path / "wmem").write_text("4096\t16384\t4194304\n")
    assert send_buffer_max(str(tmp_path / "wmem")) == 4194304
    (tmp_path / "bad").write_text("4096 16384\n")
    assert send_buffer_max(str(tmp_path / "bad")) is None and send_buffer_max(str(tmp_path / "gone")) is None


def test_botocores_client_has_no_path_sample(aws_env: None, server: tuple[str, Script]) -> None:
    from braid.adapters.aws.s3_multipart import S3Multipart

    endpoint, _ = server
    full = S3Store(s3_client(light=False, endpoint_url=endpoint), "bucket", "repo")
    assert S3Multipart(full).path_sample() is None  # then parts are grouped as before the policy knew the RTT
