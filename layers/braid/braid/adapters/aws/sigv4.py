"""AWS Signature Version 4 in the header form, with hashlib and hmac: what the agent's light client signs with.

The same canonical request botocore builds (tests pin the Authorization
header against botocore's `SigV4Auth` and `S3SigV4Auth` for fixed inputs):

- every header is signed except botocore's unsigned list (user-agent,
  expect, transfer-encoding, ...); `host` is added from the URL when absent;
- S3 (`s3=True`) keeps the path exactly as sent, and always sends
  `x-amz-content-sha256` (UNSIGNED-PAYLOAD: Braid turns S3 payload signing
  off; every write carries its own CRC64NVME or SHA-256 checksum instead);
  other services normalise the path and sign the payload's SHA-256;
- the query string is taken as sent (already percent-encoded), its pairs
  sorted.

Why not awscrt's signer: `import awscrt.auth` costs ~0.13 CPU-s on the
shared machine (2026-11-28), half of the 0.25 CPU-s the agent's whole
start-up may take (issue 27); this module costs ~1 ms (hashlib and hmac).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

# botocore.auth.SIGNED_HEADERS_BLACKLIST: headers a proxy or the HTTP layer may change.
UNSIGNED_HEADERS = frozenset(
    {
        "baggage", "connection", "expect", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "traceparent",
        "tracestate", "trailer", "transfer-encoding", "upgrade", "user-agent", "x-amzn-trace-id",
    }
)


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None = None


def _host(url: str) -> str:
    """botocore.auth._host_from_url: the host, bracketed when IPv6, with its port unless the scheme's default."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None and parts.port != {"http": 80, "https": 443}.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


def _canonical_query(query: str) -> str:
    if not query:
        return ""
    pairs = []
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        pairs.append((key, value))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _normalized_path(path: str) -> str:
    """botocore.utils.normalize_url_path (dot segments and empty segments removed), then quoted: non-S3 services."""
    if not path:
        return "/"
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment and segment != ".":
            kept.append(segment)
    normalized = ("/" if path[0] == "/" else "") + "/".join(kept) + ("/" if path[-1] == "/" and kept else "")
    return quote(normalized, safe="/~")


def _key(secret: str, day: str, region: str, service: str) -> bytes:
    key = hmac.new(f"AWS4{secret}".encode(), day.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(
    method: str,
    url: str,
    headers: Mapping[str, str],
    credentials: Credentials,
    *,
    region: str,
    service: str,
    timestamp: str,
    payload_hash: str,
    s3: bool = False,
) -> dict[str, str]:
    """The headers to send: `headers` plus X-Amz-Date, the session token, the content hash (S3) and Authorization.

    `timestamp` is `YYYYMMDDTHHMMSSZ` (UTC); `payload_hash` the body's SHA-256
    hex, or UNSIGNED_PAYLOAD (S3 only). Header names are sent as given.
    """
    out = {k: v for k, v in headers.items() if k.lower() not in ("authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256")}
    out["X-Amz-Date"] = timestamp
    if credentials.token:
        out["X-Amz-Security-Token"] = credentials.token
    if s3:
        out["X-Amz-Content-SHA256"] = payload_hash
    signed: dict[str, list[str]] = {}
    for name, value in out.items():
        lower = name.lower()
        if lower not in UNSIGNED_HEADERS:
            signed.setdefault(lower, []).append(" ".join(str(value).split()))
    if "host" not in signed:
        signed["host"] = [_host(url)]
    names = sorted(signed)
    canonical_headers = "\n".join(f"{n}:{','.join(signed[n])}" for n in names)
    signed_names = ";".join(names)
    parts = urlsplit(url)
    path = parts.path if s3 else _normalized_path(parts.path)
    canonical = "\n".join([method.upper(), path or "/", _canonical_query(parts.query), canonical_headers + "\n", signed_names, payload_hash])
    day = timestamp[:8]
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", timestamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    signature = hmac.new(_key(credentials.secret_key, day, region, service), to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, SignedHeaders={signed_names}, Signature={signature}"
    return out
