"""Credentials and region for the agent's light AWS client, from the sources it supports; botocore for the rest.

In botocore's order, as far as it goes: the environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), the profile's static keys in the
shared credentials file then the config file (AWS_PROFILE or
AWS_DEFAULT_PROFILE, else `default`), container credentials
(AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI, with its
authorization token), and the EC2 instance role through IMDSv2.

Anything else raises `Unsupported` and the caller uses botocore's full
client instead: a profile that assumes a role, SSO, credential_process,
web identity, a profile naming endpoints or proxies, FIPS or dual-stack
endpoints, or no credentials at all (botocore then reports the error in its
own words). So correctness never depends on this path.

Region, as botocore reads it: AWS_DEFAULT_REGION, else the profile's `region`;
the CA bundle AWS_CA_BUNDLE, else the profile's `ca_bundle`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from braid.adapters.aws.sigv4 import Credentials

if TYPE_CHECKING:
    import configparser

# Profile settings only botocore's full client implements: with any of them, it is used.
_FULL_CLIENT_SETTINGS = frozenset(
    {
        "role_arn", "source_profile", "credential_source", "web_identity_token_file", "credential_process", "sso_session",
        "sso_start_url", "sso_account_id", "sso_role_name", "login_session", "endpoint_url", "services", "s3", "use_fips_endpoint",
        "use_dualstack_endpoint", "sts_regional_endpoints", "aws_account_id_endpoint_mode", "ignore_configured_endpoint_urls",
    }
)
# Environment only botocore's full client implements.
_FULL_CLIENT_ENV = (
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
)
_CONTAINER_HOSTS = frozenset({"169.254.170.2", "169.254.170.23", "fd00:ec2::23", "localhost", "127.0.0.1", "::1"})
_IMDS = "http://169.254.169.254"
_IMDS_TIMEOUT = 1.0  # botocore's metadata_service_timeout
_CONTAINER_TIMEOUT = 2.0  # botocore's ContainerMetadataFetcher.TIMEOUT_SECONDS


class Unsupported(Exception):
    """The light client does not cover this set-up: use botocore's full client (the message says why)."""


@dataclass(frozen=True)
class Resolved:
    credentials: Credentials
    source: str  # "env", "shared-credentials-file", "config-file", "container-role", "iam-role"
    expires: float | None = None  # epoch seconds: temporary credentials are fetched again before then


def _profile_name() -> str:
    return os.environ.get("AWS_DEFAULT_PROFILE") or os.environ.get("AWS_PROFILE") or "default"


def _read(path_env: str, default: str) -> configparser.RawConfigParser | None:
    """The file's settings; None when there is no file (RawConfigParser.read skips it too; configparser is not loaded)."""
    path = os.path.expanduser(os.path.expandvars(os.environ.get(path_env) or default))
    if not os.path.exists(path):
        return None
    import configparser

    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError) as exc:
        raise Unsupported(f"{path}: {exc}") from None  # botocore reports the file's error in its own words
    return parser


def _section(parser: configparser.RawConfigParser | None, name: str) -> dict[str, str] | None:
    return dict(parser.items(name)) if parser is not None and parser.has_section(name) else None


def profile_settings() -> tuple[dict[str, str], dict[str, str]]:
    """The profile's (config file, credentials file) settings; Unsupported when only botocore covers them."""
    name = _profile_name()
    config = _read("AWS_CONFIG_FILE", "~/.aws/config")
    shared = _read("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")
    settings = _section(config, "default" if name == "default" else f"profile {name}")
    if settings is None and name == "default":
        settings = _section(config, "profile default")
    keys = _section(shared, name)
    explicit = bool(os.environ.get("AWS_DEFAULT_PROFILE") or os.environ.get("AWS_PROFILE"))
    if explicit and settings is None and keys is None:
        raise Unsupported(f"profile {name} not found")  # botocore's ProfileNotFound
    for found in (settings or {}, keys or {}):
        special = sorted(_FULL_CLIENT_SETTINGS & set(found))
        if special:
            raise Unsupported(f"profile {name} sets {', '.join(special)}")
    return settings or {}, keys or {}


def check_environment() -> None:
    for name in _FULL_CLIENT_ENV:
        if os.environ.get(name):
            raise Unsupported(f"{name} is set")


def ca_bundle() -> str | None:
    """AWS_CA_BUNDLE, else the profile's ca_bundle: the certificates botocore would trust for https."""
    return os.environ.get("AWS_CA_BUNDLE") or profile_settings()[0].get("ca_bundle") or None


def region() -> str | None:
    """AWS_DEFAULT_REGION, else the profile's region (botocore's order)."""
    return os.environ.get("AWS_DEFAULT_REGION") or profile_settings()[0].get("region") or None


def _static(settings: dict[str, str], source: str) -> Resolved | None:
    access, secret = settings.get("aws_access_key_id"), settings.get("aws_secret_access_key")
    if access and secret:
        return Resolved(Credentials(access, secret, settings.get("aws_session_token") or settings.get("aws_security_token")), source)
    if access or secret:
        raise Unsupported(f"partial credentials in the {source}")  # botocore's PartialCredentialsError
    return None


def _get_json(url: str, headers: dict[str, str], timeout: float, method: str = "GET") -> Any:
    import http.client  # for container and instance credentials only: it loads email and ssl (~0.03 CPU-s)

    parts = urlsplit(url)
    connection_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_type(parts.hostname or "", parts.port, timeout=timeout)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.request(method, path or "/", headers=headers)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise Unsupported(f"{url} answered HTTP {response.status}")
        return body.decode() if method == "PUT" or not body.startswith(b"{") else json.loads(body)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise Unsupported(f"{url}: {exc}") from None
    finally:
        connection.close()


def _expiry(document: dict[str, Any]) -> float | None:
    value = document.get("Expiration")
    if not value:
        return None
    import datetime

    return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _from_document(document: Any, source: str) -> Resolved:
    if not isinstance(document, dict) or not document.get("AccessKeyId") or not document.get("SecretAccessKey"):
        raise Unsupported(f"the {source} answered no credentials")
    credentials = Credentials(str(document["AccessKeyId"]), str(document["SecretAccessKey"]), document.get("Token") or None)
    return Resolved(credentials, source, _expiry(document))


def _container() -> Resolved | None:
    relative = os.environ.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
    full = os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
    if relative:
        url = f"http://169.254.170.2{relative}"
    elif full:
        parts = urlsplit(full)
        if parts.scheme != "https" and parts.hostname not in _CONTAINER_HOSTS:
            raise Unsupported(f"container credentials from {parts.hostname}")  # botocore refuses it in its own words
        url = full
    else:
        return None
    headers = {"Accept": "application/json"}
    token = os.environ.get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
    token_file = os.environ.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as handle:
                token = handle.read().strip()
        except OSError as exc:
            raise Unsupported(f"{token_file}: {exc}") from None
    if token and full and not relative:
        headers["Authorization"] = token
    return _from_document(_get_json(url, headers, _CONTAINER_TIMEOUT), "container-role")


def _instance_role() -> Resolved:
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        raise Unsupported("no credentials (the metadata service is disabled)")
    base = (os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or _IMDS).rstrip("/")
    token = _get_json(f"{base}/latest/api/token", {"x-aws-ec2-metadata-token-ttl-seconds": "21600"}, _IMDS_TIMEOUT, method="PUT")
    headers = {"x-aws-ec2-metadata-token": str(token).strip()}
    role = str(_get_json(f"{base}/latest/meta-data/iam/security-credentials/", headers, _IMDS_TIMEOUT)).strip().splitlines()
    if not role:
        raise Unsupported("the instance has no role")
    return _from_document(_get_json(f"{base}/latest/meta-data/iam/security-credentials/{role[0]}", headers, _IMDS_TIMEOUT), "iam-role")


def resolve() -> Resolved:
    """The first source with credentials, in botocore's order; Unsupported when botocore must decide."""
    check_environment()
    access, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    settings, keys = profile_settings()
    if access and secret:
        return Resolved(Credentials(access, secret, os.environ.get("AWS_SESSION_TOKEN") or os.environ.get("AWS_SECURITY_TOKEN")), "env")
    if access or secret:
        raise Unsupported("partial credentials in the environment")
    found = _static(keys, "shared-credentials-file") or _static(settings, "config-file") or _container()
    return found or _instance_role()


class CredentialCache:
    """Credentials resolved once, and again 5 minutes before temporary ones expire (thread-safe enough: a race fetches twice)."""

    def __init__(self, first: Resolved) -> None:
        self._current = first

    @property
    def source(self) -> str:
        return self._current.source

    def get(self) -> Credentials:
        current = self._current
        if current.expires is not None and time.time() > current.expires - 300:
            try:
                current = self._current = resolve()
            except Unsupported:
                pass  # keep the old ones: the request's answer (ExpiredToken) then says what went wrong
        return current.credentials
