"""The agent's S3 calls without botocore: the same method names, parameters, answers and errors as botocore's client.

LightS3 implements what a cloud backup and `wal-push` call (PutObject,
GetObject, HeadObject, DeleteObject(s), ListObjectsV2, the multipart calls)
with exactly the headers botocore sends for them under Braid's settings
(tests compare both on the same arguments): the caller's x-amz-checksum-*
and x-amz-sdk-checksum-algorithm, If-None-Match / If-Match, Object Lock and
user metadata, `x-amz-checksum-mode: ENABLED` on every GetObject (botocore's
"when_supported" validation, so a whole object's CRC64NVME, CRC32 or SHA-256
is checked as it is read), `encoding-type=url` on listings. Any other
method, paginator or parameter goes to botocore's full client, built on
first use, so callers never see a missing feature.

Addressing: an explicit endpoint (AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL:
an emulator, s3proxy, MinIO) is addressed path-style; AWS itself
virtual-hosted (`BUCKET.s3.REGION.amazonaws.com`, path-style for a bucket
with dots). A 301/400 naming another region (x-amz-bucket-region) is sent
again there, as botocore's redirector does.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote
from xml.etree import ElementTree

from botocore.exceptions import ClientError, FlexibleChecksumError, IncompleteReadError

from braid.adapters.aws.light_http import FullClientFallback, Response, Transport
from braid.adapters.aws.sigv4 import UNSIGNED_PAYLOAD

_BODY_HEADERS = {
    "ChecksumAlgorithm": "x-amz-sdk-checksum-algorithm",
    "ChecksumCRC64NVME": "x-amz-checksum-crc64nvme",
    "ChecksumSHA256": "x-amz-checksum-sha256",
    "ChecksumCRC32": "x-amz-checksum-crc32",
    "ChecksumType": "x-amz-checksum-type",
    "IfNoneMatch": "If-None-Match",
    "IfMatch": "If-Match",
    "ObjectLockMode": "x-amz-object-lock-mode",
    "ContentType": "Content-Type",
    "Range": "Range",
    "ChecksumMode": "x-amz-checksum-mode",
    "MpuObjectSize": "x-amz-mp-object-size",
}
_ANSWER_HEADERS = {
    "etag": "ETag", "x-amz-version-id": "VersionId", "x-amz-storage-class": "StorageClass", "content-type": "ContentType",
    "content-range": "ContentRange", "x-amz-checksum-crc64nvme": "ChecksumCRC64NVME", "x-amz-checksum-sha256": "ChecksumSHA256",
    "x-amz-checksum-crc32": "ChecksumCRC32", "x-amz-checksum-crc32c": "ChecksumCRC32C", "x-amz-checksum-sha1": "ChecksumSHA1",
    "x-amz-checksum-type": "ChecksumType", "x-amz-object-lock-mode": "ObjectLockMode", "x-amz-delete-marker": "DeleteMarker",
}


def _iso8601(value: Any) -> str:
    """botocore's header timestamp (iso8601): `YYYY-MM-DDTHH:MM:SSZ`, with microseconds when there are any."""
    if isinstance(value, str):
        return value
    utc = value.astimezone(datetime.UTC) if value.tzinfo else value
    return str(utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if utc.microsecond else "%Y-%m-%dT%H:%M:%SZ"))


def _strip(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _text(node: ElementTree.Element, name: str) -> str | None:
    found = node.find(f"{{*}}{name}")
    return None if found is None else (found.text or "")


_MONTHS = {name: number for number, name in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}


def http_date(text: str) -> datetime.datetime:
    """A Last-Modified header as email.utils.parsedate_to_datetime reads it: `Sun, 06 Nov 1994 08:49:37 GMT` (what S3
    sends) directly, any other form through email.utils (which loads the email package, ~0.01 CPU-s, only then)."""
    words = text.split()
    if len(words) == 6 and words[0][-1:] == "," and words[5] == "GMT" and words[2] in _MONTHS and words[3].isdigit() and len(words[3]) == 4:
        clock = words[4].split(":")
        if words[1].isdigit() and len(clock) == 3 and all(part.isdigit() for part in clock):
            hour, minute, second = (int(part) for part in clock)
            return datetime.datetime(int(words[3]), _MONTHS[words[2]], int(words[1]), hour, minute, second, tzinfo=datetime.UTC)
    import email.utils

    return email.utils.parsedate_to_datetime(text)


def _timestamp(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def s3_error(status: int, headers: Mapping[str, str], body: bytes) -> tuple[str, str]:
    """An S3 error document's Code and Message (("", "") for a bodiless answer: HEAD, some 5xx)."""
    if not body.strip():
        return "", ""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return "", ""
    return _text(root, "Code") or "", _text(root, "Message") or ""


def _crc64nvme(data: bytes | memoryview, previous: int) -> int:
    from braid.format.checksum import crc64nvme

    return crc64nvme(data, previous)


class StreamingBody:
    """botocore's StreamingBody, as used: read(n), readinto(b), close(); the length, and a whole object's checksum, are checked at the end."""

    def __init__(self, response: Response, url: str) -> None:
        self._answer = response.stream
        self._release = response.release
        self._url = url
        self._length = int(response.headers.get("content-length", "-1"))
        self._seen = 0
        self._check: tuple[str, str, Any] | None = None
        for name, start in (("crc64nvme", 0), ("crc32", 0), ("sha256", None)):
            value = response.headers.get(f"x-amz-checksum-{name}")
            if value and "-" not in value:
                self._check = (name, value, hashlib.sha256() if name == "sha256" else start)
                break
        self._done = False

    def _account(self, data: bytes | memoryview) -> None:
        self._seen += len(data)
        if self._check is not None and len(data):
            name, value, state = self._check
            if name == "crc64nvme":
                state = _crc64nvme(data, state)
            elif name == "crc32":
                state = zlib.crc32(data, state)
            else:
                state.update(data)
            self._check = (name, value, state)

    def _finish(self, got_nothing: bool) -> None:
        if self._done or not got_nothing:
            return
        self._done = True
        self._release(True)
        if self._length >= 0 and self._seen != self._length:
            raise IncompleteReadError(actual_bytes=self._seen, expected_bytes=self._length)
        if self._check is not None:
            name, value, state = self._check
            width = 8 if name == "crc64nvme" else 4
            actual = base64.b64encode(state.digest() if name == "sha256" else int(state).to_bytes(width, "big")).decode()
            if actual != value:
                raise FlexibleChecksumError(error_msg=f"Expected checksum {value} did not match calculated checksum: {actual}")

    def read(self, amt: int | None = None) -> bytes:
        data = self._answer.read() if amt is None else self._answer.read(amt)
        self._account(data)
        self._finish(not data or amt is None or (self._length >= 0 and self._seen >= self._length))
        return bytes(data)

    def readinto(self, buffer: Any) -> int:
        n = self._answer.readinto(buffer)
        self._account(memoryview(buffer)[:n])
        self._finish(not n or (self._length >= 0 and self._seen >= self._length))
        return int(n)

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._answer.close()
            self._release(False)


class _Paginator:
    def __init__(self, pages: Callable[..., Iterator[dict[str, Any]]]) -> None:
        self._pages = pages

    def paginate(self, **params: Any) -> Iterator[dict[str, Any]]:
        return self._pages(**params)


class LightS3(FullClientFallback):
    """An S3 client for the calls above; `full` builds botocore's client for everything else."""

    light = True  # what braid.adapters.aws.wiring looks for: make the Step Functions client light too

    def __init__(self, transport: Transport, endpoint: str | None, full: Callable[[], Any]) -> None:
        self._transport = transport
        self._endpoint = endpoint.rstrip("/") if endpoint else None
        FullClientFallback.__init__(self, full)
        self._regions: dict[str, str] = {}  # bucket -> region, learnt from a redirect

    # -- requests -------------------------------------------------------------------

    def round_trip_seconds(self) -> float | None:
        """The RTT to the endpoint of a connection this client has made (Transport.round_trip_seconds)."""
        return self._transport.round_trip_seconds()

    def _url(self, bucket: str, key: str | None, query: str) -> tuple[str, str | None]:
        path = "" if key is None else "/" + quote(key, safe="/~")
        suffix = f"?{query}" if query else ""
        if self._endpoint is not None:
            return f"{self._endpoint}/{bucket}{path}{suffix}", None
        region = self._regions.get(bucket, self._transport.region)
        if "." in bucket:
            return f"https://s3.{region}.amazonaws.com/{bucket}{path}{suffix}", region
        return f"https://{bucket}.s3.{region}.amazonaws.com{path or '/'}{suffix}", region

    def _call(
        self, operation: str, method: str, bucket: str, key: str | None, query: str, headers: dict[str, str], body: Any = None, *,
        stream: bool = False,
    ) -> Response:
        if body is None and method not in ("GET", "HEAD"):
            headers = {**headers, "Content-Length": "0"}  # as botocore sends a bodiless PUT, POST or DELETE
        for _ in range(2):
            url, region = self._url(bucket, key, query)
            try:
                return self._transport.request(operation, method, url, headers, body, payload_hash=UNSIGNED_PAYLOAD, stream=stream, region=region)
            except ClientError as exc:
                meta = exc.response.get("ResponseMetadata", {})
                elsewhere = meta.get("HTTPHeaders", {}).get("x-amz-bucket-region")
                if self._endpoint is not None or not elsewhere or elsewhere == region or meta.get("HTTPStatusCode") not in (301, 400):
                    raise
                self._regions[bucket] = elsewhere  # the bucket lives elsewhere: botocore's S3RegionRedirector sends it there
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _headers(params: Mapping[str, Any], allowed: frozenset[str]) -> dict[str, str] | None:
        """The request headers of `params`, or None when a parameter is one the light client does not send (botocore then does)."""
        headers: dict[str, str] = {}
        for name, value in params.items():
            if name not in allowed:
                return None
            if name == "Metadata":
                headers.update({f"x-amz-meta-{k}": str(v) for k, v in value.items()})
            elif name == "ObjectLockRetainUntilDate":
                headers["x-amz-object-lock-retain-until-date"] = _iso8601(value)
            elif name == "MpuObjectSize" or name == "ContentLength":
                headers[_BODY_HEADERS.get(name, "Content-Length")] = str(int(value))
            elif name in _BODY_HEADERS:
                headers[_BODY_HEADERS[name]] = str(value)
        return headers

    @staticmethod
    def _answer(response: Response) -> dict[str, Any]:
        headers = response.headers
        out: dict[str, Any] = {_ANSWER_HEADERS[k]: v for k, v in headers.items() if k in _ANSWER_HEADERS}
        if "DeleteMarker" in out:
            out["DeleteMarker"] = out["DeleteMarker"] == "true"
        if "content-length" in headers:
            out["ContentLength"] = int(headers["content-length"])
        if "last-modified" in headers:
            out["LastModified"] = http_date(headers["last-modified"])
        if "x-amz-object-lock-retain-until-date" in headers:
            out["ObjectLockRetainUntilDate"] = _timestamp(headers["x-amz-object-lock-retain-until-date"])
        metadata = {k[len("x-amz-meta-") :]: v for k, v in headers.items() if k.startswith("x-amz-meta-")}
        out["Metadata"] = metadata
        out["ResponseMetadata"] = {"HTTPStatusCode": response.status, "HTTPHeaders": headers, "RetryAttempts": 0}
        return out

    # -- objects -------------------------------------------------------------------------

    _PUT = frozenset({"Bucket", "Key", "Body", "ChecksumAlgorithm", "ChecksumCRC64NVME", "ChecksumSHA256", "IfNoneMatch", "IfMatch",
                      "Metadata", "ObjectLockMode", "ObjectLockRetainUntilDate", "ContentLength", "ContentType"})

    def put_object(self, **params: Any) -> dict[str, Any]:
        headers = self._headers(params, self._PUT)
        if headers is None:
            return dict(self.full().put_object(**params))
        body = params.get("Body", b"")
        headers["Content-Length"] = str(len(body))
        return self._answer(self._call("PutObject", "PUT", params["Bucket"], params["Key"], "", headers, body))

    _GET = frozenset({"Bucket", "Key", "Range", "VersionId", "ChecksumMode"})

    def get_object(self, **params: Any) -> dict[str, Any]:
        headers = self._headers(params, self._GET)
        if headers is None:
            return dict(self.full().get_object(**params))
        headers["x-amz-checksum-mode"] = "ENABLED"
        query = f"versionId={quote(params['VersionId'], safe='-_.~')}" if params.get("VersionId") else ""
        response = self._call("GetObject", "GET", params["Bucket"], params["Key"], query, headers, stream=True)
        out = self._answer(response)
        out["Body"] = StreamingBody(response, params["Key"])
        return out

    def head_object(self, **params: Any) -> dict[str, Any]:
        headers = self._headers(params, self._GET - {"Range"})
        if headers is None:
            return dict(self.full().head_object(**params))
        query = f"versionId={quote(params['VersionId'], safe='-_.~')}" if params.get("VersionId") else ""
        return self._answer(self._call("HeadObject", "HEAD", params["Bucket"], params["Key"], query, headers))

    def delete_object(self, **params: Any) -> dict[str, Any]:
        if set(params) - {"Bucket", "Key", "VersionId"}:
            return dict(self.full().delete_object(**params))
        query = f"versionId={quote(params['VersionId'], safe='-_.~')}" if params.get("VersionId") else ""
        return self._answer(self._call("DeleteObject", "DELETE", params["Bucket"], params["Key"], query, {}))

    def delete_objects(self, **params: Any) -> dict[str, Any]:
        if set(params) - {"Bucket", "Delete"}:
            return dict(self.full().delete_objects(**params))
        from braid.adapters.aws.light_s3_xml import delete_document, delete_result

        body = delete_document(params["Delete"])
        headers = {
            "Content-Length": str(len(body)), "x-amz-sdk-checksum-algorithm": "CRC32",
            "x-amz-checksum-crc32": base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode(),
        }
        response = self._call("DeleteObjects", "POST", params["Bucket"], None, "delete", headers, body)
        return delete_result(response.body)

    # -- listings and multipart uploads: light_s3_xml --------------------------------------

    def get_paginator(self, name: str) -> Any:
        from braid.adapters.aws import light_s3_xml

        pages = light_s3_xml.PAGINATORS.get(name)
        if pages is None:
            return self.full().get_paginator(name)
        return _Paginator(lambda **params: pages(self, **params))

    def create_multipart_upload(self, **params: Any) -> dict[str, Any]:
        from braid.adapters.aws.light_s3_xml import create_multipart_upload

        return create_multipart_upload(self, params)

    def upload_part(self, **params: Any) -> dict[str, Any]:
        from braid.adapters.aws.light_s3_xml import upload_part

        return upload_part(self, params)

    def complete_multipart_upload(self, **params: Any) -> dict[str, Any]:
        from braid.adapters.aws.light_s3_xml import complete_multipart_upload

        return complete_multipart_upload(self, params)

    def abort_multipart_upload(self, **params: Any) -> dict[str, Any]:
        if set(params) - {"Bucket", "Key", "UploadId"}:
            return dict(self.full().abort_multipart_upload(**params))
        query = f"uploadId={quote(params['UploadId'], safe='-_.~')}"
        return self._answer(self._call("AbortMultipartUpload", "DELETE", params["Bucket"], params["Key"], query, {}))
