"""braid.adapters.aws.sigv4 signs as botocore does: the same Authorization for the same request (S3 and Step Functions)."""

from __future__ import annotations

import datetime
import hashlib

import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials as BotoCredentials

from braid.adapters.aws.sigv4 import UNSIGNED_PAYLOAD, Credentials, sign

STAMP = "20261128T210000Z"
KEYS = [Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"), Credentials("ASIAEXAMPLE", "secret/with+chars", "session-token==")]


def _botocore(method: str, url: str, headers: dict[str, str], body: bytes, keys: Credentials, service: str, s3: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: datetime.datetime(2026, 11, 28, 21, 0, 0))
    request = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
    if s3:
        request.context["client_config"] = Config(s3={"payload_signing_enabled": False})  # braid.adapters.aws.clients.s3_client's setting
    auth = (S3SigV4Auth if s3 else SigV4Auth)(BotoCredentials(keys.access_key, keys.secret_key, keys.token), service, "eu-west-1")
    auth.add_auth(request)
    return dict(request.headers.items())


S3_REQUESTS = [
    ("PUT", "https://bucket.s3.eu-west-1.amazonaws.com/repo/data/a%20b/c%2Bd~e", {"Content-Length": "11", "x-amz-checksum-crc64nvme": "Fg5AiE8Eaws=",
     "x-amz-sdk-checksum-algorithm": "CRC64NVME", "If-None-Match": "*", "User-Agent": "braid", "x-amz-meta-braid-sha256": "  ab  cd "}),
    ("POST", "http://127.0.0.1:5123/bucket/repo/staging/x?uploads=", {"x-amz-checksum-algorithm": "CRC64NVME", "x-amz-checksum-type": "FULL_OBJECT"}),
    ("PUT", "http://localhost:80/bucket/k?partNumber=3&uploadId=abc%2Fdef%3D", {"Content-Length": "5", "Expect": "100-continue"}),
    ("GET", "https://s3.eu-west-1.amazonaws.com/my.bucket?list-type=2&prefix=repo%2Fdata%2F&start-after=repo%2Fb&encoding-type=url", {}),
    ("HEAD", "https://[::1]:8443/bucket/k", {"x-amz-checksum-mode": "ENABLED"}),
]


@pytest.mark.parametrize("keys", KEYS, ids=["static", "session"])
@pytest.mark.parametrize(("method", "url", "headers"), S3_REQUESTS, ids=["put", "create-upload", "part", "list", "head-ipv6"])
def test_s3_requests_are_signed_as_botocore_signs_them(method: str, url: str, headers: dict[str, str], keys: Credentials, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _botocore(method, url, headers, b"hello world", keys, "s3", True, monkeypatch)
    ours = sign(method, url, headers, keys, region="eu-west-1", service="s3", timestamp=STAMP, payload_hash=UNSIGNED_PAYLOAD, s3=True)
    assert ours["Authorization"] == expected["Authorization"]
    assert {k.lower(): v for k, v in ours.items()} == {k.lower(): v for k, v in expected.items()}


@pytest.mark.parametrize("keys", KEYS, ids=["static", "session"])
@pytest.mark.parametrize("url", ["https://states.eu-west-1.amazonaws.com/", "http://127.0.0.1:4000", "http://127.0.0.1:4000/a/./b/../c"])
def test_json_requests_are_signed_with_their_payload_as_botocore_signs_them(url: str, keys: Credentials, monkeypatch: pytest.MonkeyPatch) -> None:
    body = b'{"executionArn": "arn:aws:states:eu-west-1:123456789012:execution:m:e"}'
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AWSStepFunctions.DescribeExecution", "Content-Length": str(len(body))}
    expected = _botocore("POST", url, headers, body, keys, "states", False, monkeypatch)
    ours = sign("POST", url, headers, keys, region="eu-west-1", service="states", timestamp=STAMP, payload_hash=hashlib.sha256(body).hexdigest())
    assert ours["Authorization"] == expected["Authorization"]


def test_a_different_secret_or_header_changes_the_signature() -> None:
    """The comparison above is not vacuous: what is signed changes the signature."""
    url = "https://bucket.s3.eu-west-1.amazonaws.com/k"
    base = sign("PUT", url, {"If-None-Match": "*"}, KEYS[0], region="eu-west-1", service="s3", timestamp=STAMP, payload_hash=UNSIGNED_PAYLOAD, s3=True)
    other_key = sign("PUT", url, {"If-None-Match": "*"}, KEYS[1], region="eu-west-1", service="s3", timestamp=STAMP, payload_hash=UNSIGNED_PAYLOAD, s3=True)
    other_header = sign("PUT", url, {"If-Match": "x"}, KEYS[0], region="eu-west-1", service="s3", timestamp=STAMP, payload_hash=UNSIGNED_PAYLOAD, s3=True)
    unsigned = sign("PUT", url, {"If-None-Match": "*", "User-Agent": "x"}, KEYS[0], region="eu-west-1", service="s3", timestamp=STAMP,
                    payload_hash=UNSIGNED_PAYLOAD, s3=True)
    assert len({base["Authorization"], other_key["Authorization"], other_header["Authorization"]}) == 3
    assert unsigned["Authorization"] == base["Authorization"]  # user-agent is never signed
