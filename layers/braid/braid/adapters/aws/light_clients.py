"""The agent's AWS clients without botocore: a cloud backup's and `wal-push`'s start-up (issue 27).

A cloud backup pays its start-up once per backup and `wal-push` once per
WAL segment. botocore costs most of it: its imports (urllib3, email,
dateutil, jmespath, awscrt through botocore.compat) ~0.27 CPU-s, the
endpoint data, the S3 model and rule set ~0.12 more (docs/design/agent-startup.md),
against a target of 0.25 CPU-s for the whole start-up. These clients
(LightS3, LightStepFunctions) answer the agent's few calls over HTTP/1.1 (braid.adapters.aws.light_wire)
with SigV4 (braid.adapters.aws.sigv4), the HOST retry budget
(braid.adapters.aws.light_http) and botocore's exception classes, so every
adapter above them is unchanged.

`light_client` returns None, and the caller makes botocore's full client,
whenever this host's set-up is one they do not cover (braid.adapters.aws
.light_credentials: assume-role or SSO profiles, credential_process, web
identity, proxies, FIPS, custom CA bundles, no region, ...), for any client
option they do not implement, when handlers were added to botocore's
built-in list (moto's in-process stub: they expect to see every request),
or when BRAID_AWS_CLIENT=botocore. Any call
they do not implement goes to a full client made on first use.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from braid.adapters.aws import light_credentials
from braid.adapters.aws.light_credentials import CredentialCache, Unsupported
from braid.adapters.aws.light_http import FullClientFallback, Transport
from braid.adapters.aws.retries import RetrySettings

ENV_CLIENT = "BRAID_AWS_CLIENT"  # "botocore": never the light clients (a diagnosis, or a set-up they get wrong)
_OPTIONS = frozenset({"region", "endpoint_url", "on_retry", "sleep"})
_SERVICES = {
    # service: (label as botocore's service id, signing name, endpoint host prefix, AWS_ENDPOINT_URL_<ID>)
    "s3": ("S3", "s3", "s3", "AWS_ENDPOINT_URL_S3"),
    "stepfunctions": ("SFN", "states", "states", "AWS_ENDPOINT_URL_SFN"),
}
_credentials: dict[tuple[str | None, ...], CredentialCache] = {}
_credentials_lock = threading.Lock()
_CREDENTIAL_ENV = (
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
)


def _cached_credentials() -> CredentialCache:
    """One resolution per process (an instance role is one metadata round trip), again when the environment changes (tests)."""
    key = tuple(os.environ.get(name) for name in _CREDENTIAL_ENV)
    with _credentials_lock:
        cache = _credentials.get(key)
        if cache is None:
            cache = _credentials[key] = CredentialCache(light_credentials.resolve())
        return cache


def _json_error(status: int, headers: Mapping[str, str], body: bytes) -> tuple[str, str]:
    """botocore's JSON-protocol error: `__type` (after '#'), else x-amzn-ErrorType; `message` or `Message`."""
    try:
        document = json.loads(body) if body.strip() else {}
    except ValueError:
        document = {}
    if not isinstance(document, dict):
        document = {}
    code = str(document.get("__type") or headers.get("x-amzn-errortype", "")).split(":")[0].rsplit("#", 1)[-1]
    return code, str(document.get("message") or document.get("Message") or "")


class LightStepFunctions(FullClientFallback):
    """StartExecution, DescribeExecution and SendTaskSuccess (AWS JSON 1.0); everything else through botocore's client."""

    def __init__(self, transport: Transport, url: str, full: Callable[[], Any]) -> None:
        self._transport = transport
        self._url = url
        FullClientFallback.__init__(self, full)

    def _call(self, operation: str, params: Mapping[str, Any]) -> dict[str, Any]:
        import hashlib

        body = json.dumps(dict(params)).encode()
        headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AWSStepFunctions.{operation}", "Content-Length": str(len(body))}
        response = self._transport.request(operation, "POST", self._url, headers, body, payload_hash=hashlib.sha256(body).hexdigest())
        answer: dict[str, Any] = json.loads(response.body) if response.body.strip() else {}
        answer["ResponseMetadata"] = {"HTTPStatusCode": response.status, "HTTPHeaders": response.headers, "RetryAttempts": 0}
        return answer

    def start_execution(self, **params: Any) -> dict[str, Any]:
        answer = self._call("StartExecution", params)
        if "startDate" in answer:
            answer["startDate"] = datetime.datetime.fromtimestamp(float(answer["startDate"]), datetime.UTC)
        return answer

    def describe_execution(self, **params: Any) -> dict[str, Any]:
        answer = self._call("DescribeExecution", params)
        for name in ("startDate", "stopDate"):
            if name in answer:
                answer[name] = datetime.datetime.fromtimestamp(float(answer[name]), datetime.UTC)
        return answer

    def send_task_success(self, **params: Any) -> dict[str, Any]:
        return self._call("SendTaskSuccess", params)


def _endpoint(service: str, given: str | None) -> str | None:
    """An explicit endpoint: the caller's, else AWS_ENDPOINT_URL_<SERVICE>, else AWS_ENDPOINT_URL (botocore's order)."""
    endpoint = given or os.environ.get(_SERVICES[service][3]) or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise Unsupported(f"endpoint {endpoint}")  # botocore refuses it in its own words
    return endpoint or None


def _hooked() -> bool:
    """Handlers someone added to botocore's built-in list (moto's in-process stub, a benchmark's shim) expect to see
    every request: only botocore's client runs them."""
    handlers = sys.modules.get("botocore.handlers")
    if handlers is None:
        return False
    return any(not str(getattr(entry[1], "__module__", "botocore")).startswith("botocore") for entry in handlers.BUILTIN_HANDLERS)


def light_client(service: str, full: Callable[[], Any], *, retries: RetrySettings, pool: int, read_timeout: float, **options: Any) -> Any:
    """LightS3 or LightStepFunctions for `service`, or None when botocore's client (`full`) must be used."""
    if os.environ.get(ENV_CLIENT, "").lower() == "botocore" or set(options) - _OPTIONS or service not in _SERVICES or _hooked():
        return None
    try:
        endpoint = _endpoint(service, options.get("endpoint_url"))
        light_credentials.check_environment()
        region = options.get("region") or light_credentials.region()
        if not region:
            return None  # botocore says so in its words (braid.adapters.aws.clients: "no AWS region configured")
        if endpoint is None and (region.startswith("cn-") or "-iso" in region):
            return None  # other partitions' domains: botocore's endpoint rules know them
        credentials = _cached_credentials()
        ca_bundle = light_credentials.ca_bundle()
    except Unsupported:
        return None
    label, signing, prefix, _ = _SERVICES[service]
    transport = Transport(
        label=label, counted_as=service, signing_name=signing, region=region, credentials=credentials, retries=retries, pool=pool,
        connect_timeout=10, read_timeout=read_timeout, on_retry=options.get("on_retry"), sleep=options.get("sleep") or time.sleep,
        error_parser=_s3_error() if service == "s3" else _json_error, s3=service == "s3", ca_bundle=ca_bundle,
    )
    if service == "s3":
        from braid.adapters.aws.light_s3 import LightS3

        return LightS3(transport, endpoint, full)
    return LightStepFunctions(transport, endpoint or f"https://{prefix}.{region}.amazonaws.com/", full)


def _s3_error() -> Callable[[int, Mapping[str, str], bytes], tuple[str, str]]:
    from braid.adapters.aws.light_s3 import s3_error

    return s3_error
