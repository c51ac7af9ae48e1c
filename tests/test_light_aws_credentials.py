"""Where the light client finds credentials and region (braid.adapters.aws.light_credentials), and when it leaves them to botocore.

Each supported source on its own (the environment, the shared credentials
file, the config file, container credentials, IMDSv2 through a local
metadata server); each set-up only botocore covers makes `s3_client(light=True)`
return botocore's client.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from braid.adapters.aws import light_credentials
from braid.adapters.aws.clients import s3_client, stepfunctions_client
from braid.adapters.aws.light_clients import LightStepFunctions
from braid.adapters.aws.light_s3 import LightS3


@pytest.fixture(autouse=True)
def unhooked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other tests in this process may have imported moto, whose in-process stub turns the light clients off
    (braid.adapters.aws.light_clients._hooked, tested on its own): these tests are about the light clients."""
    monkeypatch.setattr("braid.adapters.aws.light_clients._hooked", lambda: False)


@pytest.fixture
def clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No AWS settings at all: an empty home, no AWS_* variables."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return tmp_path


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def metadata() -> Iterator[tuple[str, list[tuple[str, str, dict[str, str]]]]]:
    """A local metadata server: IMDSv2 (token, role, credentials) and a container credentials endpoint."""
    seen: list[tuple[str, str, dict[str, str]]] = []
    document = {"AccessKeyId": "ASIAROLE", "SecretAccessKey": "role-secret", "Token": "role-token", "Expiration": "2099-01-01T00:00:00Z"}

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self) -> None:
            seen.append(("PUT", self.path, dict(self.headers)))
            ok = self.path == "/latest/api/token" and self.headers.get("x-aws-ec2-metadata-token-ttl-seconds") == "21600"
            self._reply(200 if ok else 400, b"imds-token")

        def do_GET(self) -> None:
            seen.append(("GET", self.path, dict(self.headers)))
            if self.path.startswith("/latest/meta-data/") and self.headers.get("x-aws-ec2-metadata-token") != "imds-token":
                self._reply(401, b"")
            elif self.path == "/latest/meta-data/iam/security-credentials/":
                self._reply(200, b"braid-host-role")
            elif self.path in ("/latest/meta-data/iam/security-credentials/braid-host-role", "/container/creds"):
                self._reply(200, json.dumps(document).encode())
            else:
                self._reply(404, b"")

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_environment_comes_first_with_its_session_token(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(clean / ".aws" / "credentials", "[default]\naws_access_key_id = FILE\naws_secret_access_key = file-secret\n")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")
    found = light_credentials.resolve()
    assert (found.source, found.credentials.access_key, found.credentials.token) == ("env", "ENV", "env-token")


def test_a_named_profile_in_the_shared_credentials_file(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(clean / "creds", "[default]\naws_access_key_id = DEFAULT\naws_secret_access_key = d\n[backup]\naws_access_key_id = BACKUP\naws_secret_access_key = b\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(clean / "creds"))
    monkeypatch.setenv("AWS_PROFILE", "backup")
    found = light_credentials.resolve()
    assert (found.source, found.credentials.access_key, found.credentials.secret_key) == ("shared-credentials-file", "BACKUP", "b")


def test_static_keys_and_region_in_the_config_file(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(clean / ".aws" / "config", "[profile backup]\nregion = eu-central-1\naws_access_key_id = CONFIG\naws_secret_access_key = c\n")
    monkeypatch.setenv("AWS_PROFILE", "backup")
    found = light_credentials.resolve()
    assert (found.source, found.credentials.access_key) == ("config-file", "CONFIG")
    assert light_credentials.region() == "eu-central-1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")  # the environment first, as botocore reads it
    assert light_credentials.region() == "us-west-2"
    client = stepfunctions_client(light=True)
    assert isinstance(client, LightStepFunctions)
    assert client._url == "https://states.us-west-2.amazonaws.com/"


def test_container_credentials_with_their_authorization_token(clean: Path, metadata: tuple[str, list[Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    base, seen = metadata
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{base}/container/creds")
    monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "container-auth")
    found = light_credentials.resolve()
    assert (found.source, found.credentials.access_key, found.credentials.token) == ("container-role", "ASIAROLE", "role-token")
    assert found.expires is not None
    assert seen[-1][2].get("Authorization") == "container-auth"


def test_the_instance_role_through_imdsv2(clean: Path, metadata: tuple[str, list[Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    base, seen = metadata
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", base)
    found = light_credentials.resolve()
    assert (found.source, found.credentials.access_key, found.credentials.token) == ("iam-role", "ASIAROLE", "role-token")
    assert [(m, p) for m, p, _ in seen] == [
        ("PUT", "/latest/api/token"), ("GET", "/latest/meta-data/iam/security-credentials/"),
        ("GET", "/latest/meta-data/iam/security-credentials/braid-host-role"),
    ]


@pytest.mark.parametrize(
    ("config", "env"),
    [
        ("[default]\nrole_arn = arn:aws:iam::123456789012:role/r\nsource_profile = base\n[profile base]\naws_access_key_id = A\naws_secret_access_key = s\n", {}),
        ("[default]\nsso_session = corp\nsso_account_id = 123456789012\nsso_role_name = r\n", {}),
        ("[default]\ncredential_process = /bin/echo\n", {}),
        ("[default]\nendpoint_url = http://127.0.0.1:9\naws_access_key_id = A\naws_secret_access_key = s\n", {}),
        ("", {"AWS_WEB_IDENTITY_TOKEN_FILE": "/tmp/token", "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/r"}),
        ("", {"HTTPS_PROXY": "http://proxy:3128", "AWS_ACCESS_KEY_ID": "A", "AWS_SECRET_ACCESS_KEY": "s"}),
        ("", {"AWS_USE_FIPS_ENDPOINT": "true", "AWS_ACCESS_KEY_ID": "A", "AWS_SECRET_ACCESS_KEY": "s"}),
        ("", {}),  # no credentials anywhere: botocore reports NoCredentialsError in its own words
        ("", {"AWS_PROFILE": "missing"}),
        ("", {"AWS_ACCESS_KEY_ID": "only-half"}),
    ],
    ids=["assume-role", "sso", "credential-process", "endpoint-in-profile", "web-identity", "proxy", "fips", "none", "missing-profile", "partial"],
)
def test_what_only_botocore_covers_gets_botocores_client(config: str, env: dict[str, str], clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(clean / ".aws" / "config", config)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(light_credentials.Unsupported):
        light_credentials.check_environment()
        light_credentials.resolve()
    try:
        client = s3_client(light=True)
    except Exception as exc:  # botocore's own refusal, in its words: proof it, not the light client, decided
        assert type(exc).__module__ == "botocore.exceptions" and type(exc).__name__ in ("ProfileNotFound", "PartialCredentialsError"), exc
        return
    assert not isinstance(client, LightS3) and hasattr(client, "meta")


def test_no_region_and_the_opt_out_get_botocores_client(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "A")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    assert light_credentials.region() is None
    from braid.errors import UsageError

    with pytest.raises(UsageError, match="no AWS region configured"):
        stepfunctions_client(light=True)  # botocore's client, and its NoRegionError in Braid's words
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert isinstance(s3_client(light=True), LightS3)
    monkeypatch.setenv("BRAID_AWS_CLIENT", "botocore")
    assert not isinstance(s3_client(light=True), LightS3)


def test_handlers_added_to_botocore_turn_the_light_clients_off(clean: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's in-process stub (or a benchmark's shim) in botocore's built-in handlers expects every request: botocore's client then."""
    import botocore.handlers

    from braid.adapters.aws import light_clients

    monkeypatch.undo()  # the autouse fixture's stand-in for _hooked, too
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(clean))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "A")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(botocore.handlers, "BUILTIN_HANDLERS", [h for h in botocore.handlers.BUILTIN_HANDLERS if str(getattr(h[1], "__module__", "")).startswith("botocore")])
    assert isinstance(s3_client(light=True), LightS3)

    def foreign(**_: Any) -> None:
        pass

    monkeypatch.setattr(botocore.handlers, "BUILTIN_HANDLERS", [*botocore.handlers.BUILTIN_HANDLERS, ("before-send", foreign)])
    assert light_clients._hooked()
    assert not isinstance(s3_client(light=True), LightS3)


def test_temporary_credentials_are_fetched_again_five_minutes_before_they_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backup outlives an instance role's credentials: the cache resolves again near expiry, and keeps static ones."""
    now = [1_000_000.0]
    monkeypatch.setattr(light_credentials.time, "time", lambda: now[0])
    fresh = light_credentials.Resolved(light_credentials.Credentials("ASIANEW", "new", "t2"), "instance-role", now[0] + 3600)
    calls: list[int] = []

    def resolve() -> light_credentials.Resolved:
        calls.append(1)
        return fresh

    monkeypatch.setattr(light_credentials, "resolve", resolve)
    first = light_credentials.Resolved(light_credentials.Credentials("ASIAOLD", "old", "t1"), "instance-role", now[0] + 900)
    cache = light_credentials.CredentialCache(first)
    assert cache.get().access_key == "ASIAOLD" and not calls  # 15 minutes left: kept
    now[0] += 601  # 4 min 59 s left
    assert cache.get().access_key == "ASIANEW" and len(calls) == 1
    assert cache.get().access_key == "ASIANEW" and len(calls) == 1  # the new ones last an hour
    static = light_credentials.CredentialCache(light_credentials.Resolved(light_credentials.Credentials("AKIA", "s", None), "env"))
    now[0] += 10**9
    assert static.get().access_key == "AKIA" and len(calls) == 1  # no expiry: never resolved again
