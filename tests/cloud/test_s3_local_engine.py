"""An `s3://` repository without the stack: `--engine local` compresses and encrypts on the host.

For users who cannot deploy Lambda: plain S3 or an S3-compatible store.
The real CLI runs as a separate process against a moto server on loopback
(S3 and KMS only, no stack), and the repository it writes is read by the
same commands (`list`, `show`, `verify --deep`, `restore`) as any other.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from tests.conftest import run_braid

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]

MiB = 1024**2
MARKER = b"a plaintext row that must never reach the bucket; "


def _data(size: int, seed: int = 7) -> bytes:
    half = size // 2
    return (random.Random(seed).randbytes(half) + MARKER * (size // len(MARKER) + 1))[:size]


@pytest.fixture
def s3(aws_env: None) -> Iterator[dict[str, str]]:
    """A moto server on loopback with one bucket; the environment a host's CLI needs to reach it."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="plain")
    try:
        yield env
    finally:
        server.stop()


def _objects(env: dict[str, str], prefix: str) -> dict[str, bytes]:
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="plain", Prefix=prefix).get("Contents", [])]
    return {key: client.get_object(Bucket="plain", Key=key)["Body"].read() for key in keys}


def test_key_file_repository_on_plain_s3_backs_up_and_restores(s3: dict[str, str], isolated_config: Path, tmp_path: Path) -> None:
    repo = "s3://plain/host-a"
    made = run_braid("init", "--repo", repo, "--engine", "local", "--json", env=s3)
    assert made.code == 0, made.stderr
    init = json.loads(made.out)
    key_file = Path(init["key_file"])
    assert key_file.parent == isolated_config / "braid" / "keys" and oct(key_file.stat().st_mode & 0o777) == "0o600"

    data = _data(3 * MiB + 12345)
    backup = run_braid("backup", "--repo", repo, "--name", "db", "--chunk-size", "1MiB", "--workers", "2", stdin=data, env=s3)
    assert backup.code == 0, backup.stderr
    ref = backup.out.strip()
    assert ref.startswith("db@")

    # The same format: config without a pipeline, chunks compressed and encrypted, no plaintext anywhere.
    stored = _objects(s3, "host-a/")
    config = json.loads(stored["host-a/config.json"])
    assert config["key"] == {"type": "local", "key_id": init["key_id"]} and config["cloud"] == {}
    assert not any(MARKER[:24] in body for body in stored.values())
    assert sum(len(body) for body in stored.values()) < len(data)  # the repeated half compressed

    show = run_braid("show", "--repo", repo, ref, "--json", env=s3)
    assert show.code == 0, show.stderr
    assert '"local"' in show.out  # the manifest records the engine that wrote it
    assert run_braid("verify", "--repo", repo, "--deep", ref, env=s3).code == 0
    restored = run_braid("restore", "--repo", repo, "db@latest", env=s3)
    assert restored.code == 0, restored.stderr
    assert restored.stdout == data

    # Without the key file (lost, or another host): exit 4, nothing written.
    moved = tmp_path / "escrow.key"
    key_file.rename(moved)
    lost = run_braid("restore", "--repo", repo, "db@latest", env=s3)
    assert lost.code == 4 and lost.stdout == b"", lost.stderr
    # The escrowed copy restores (docs/usage.md: the master key of a service user).
    again = run_braid("restore", "--repo", repo, "--key-file", str(moved), "db@latest", env=s3)
    assert again.code == 0 and again.stdout == data, again.stderr


def test_kms_repository_without_the_stack(s3: dict[str, str]) -> None:
    kms = boto3.client("kms", endpoint_url=s3["AWS_ENDPOINT_URL"])
    key_arn = kms.create_key(Description="braid without a stack")["KeyMetadata"]["Arn"]
    repo = "s3://plain/kms"
    made = run_braid("init", "--repo", repo, "--engine", "local", "--kms-key", key_arn, "--json", env=s3)
    assert made.code == 0, made.stderr
    assert json.loads(made.out)["key_id"] == key_arn

    data = _data(2 * MiB + 7, seed=3)
    backup = run_braid("backup", "--repo", repo, "--name", "kmsdb", "--chunk-size", "1MiB", stdin=data, env=s3)
    assert backup.code == 0, backup.stderr
    assert json.loads(_objects(s3, "kms/")["kms/config.json"])["key"] == {"type": "kms", "key_id": key_arn}
    restored = run_braid("restore", "--repo", repo, "kmsdb@latest", env=s3)
    assert restored.code == 0 and restored.stdout == data, restored.stderr
    shown = json.loads(run_braid("show", "--repo", repo, "kmsdb@latest", "--json", env=s3).out)
    assert shown["usage_detail"]["requests"]["kms:GenerateDataKey"] == shown["usage"]["kms_requests"] == 1  # the backup's data key


def test_kms_key_this_host_cannot_use_fails_the_init_and_writes_nothing(s3: dict[str, str]) -> None:
    missing = "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000"
    made = run_braid("init", "--repo", "s3://plain/nokey", "--engine", "local", "--kms-key", missing, env=s3)
    assert made.code == 4, made.stderr
    assert "kms:GenerateDataKey" in made.stderr or missing in made.stderr
    assert _objects(s3, "nokey/") == {}


def test_usage_errors_name_the_fix(s3: dict[str, str]) -> None:
    repo = "s3://plain/usage"
    no_stack = run_braid("init", "--repo", repo, env=s3)
    assert no_stack.code == 2 and "--engine local" in no_stack.stderr and "--stack NAME" in no_stack.stderr

    both = run_braid("init", "--repo", repo, "--engine", "local", "--stack", "Braid", env=s3)
    assert both.code == 2 and "exclude each other" in both.stderr

    kms_on_dir = run_braid("init", "--repo", "/tmp/never-made-by-braid-test", "--kms-key", "arn:x", env=s3)
    assert kms_on_dir.code == 2 and "--kms-key" in kms_on_dir.stderr

    assert run_braid("init", "--repo", repo, "--engine", "local", env=s3).code == 0
    twice = run_braid("init", "--repo", repo, "--engine", "local", env=s3)
    assert twice.code == 3 and "already a Braid repository" in twice.stderr

    pipeline = run_braid("backup", "--repo", repo, "--name", "x", "--engine", "stepfunctions", stdin=b"data", env=s3)
    assert pipeline.code == 2 and "has no pipeline" in pipeline.stderr

    cloud_only = run_braid("backup", "--repo", repo, "--name", "x", "--no-wait", stdin=b"data", env=s3)
    assert cloud_only.code == 2 and "--no-wait applies only to the cloud pipeline" in cloud_only.stderr
    assert run_braid("list", "--repo", repo, "--json", env=s3).out.strip() == "[]"


def test_a_local_backup_to_s3_records_the_requests_it_sent(s3: dict[str, str], isolated_config: Path, tmp_path: Path) -> None:
    """The local engine bills no Lambda and no Step Functions, but on S3 every chunk is a PUT: the manifest counts them."""
    repo = "s3://plain/counted"
    assert run_braid("init", "--repo", repo, "--engine", "local", env=s3).code == 0
    source = tmp_path / "in"
    source.write_bytes(_data(3 * MiB + 5))
    ref = run_braid("backup", "--repo", repo, "--name", "db", "--chunk-size", "1MiB", "--input", str(source), env=s3).out.strip()
    shown = run_braid("show", "--repo", repo, ref, "--json", env=s3)
    assert shown.code == 0, shown.stderr
    detail = json.loads(shown.stdout)
    usage, requests = detail["usage"], detail["usage_detail"]["requests"]
    # A PUT per chunk and the lease's, counted up to sealing (the summary, marker and manifest PUTs come after);
    # one LIST checks every chunk before the manifest is sealed.
    assert requests["s3:PutObject"] == detail["chunks"] + 1 == 5
    assert requests["s3:ListObjectsV2"] == 1
    assert usage["s3_put_requests"] == 6 and (usage["lambda_invocations"], usage["sfn_transitions"], usage["staged_bytes"]) == (0, 0, 0)
    assert usage["cpu_seconds"] > 0 and usage["stored_bytes"] == detail["stored_bytes"]
    assert detail["cost"]["total"] == pytest.approx(6 * 0.000005 + usage["s3_get_requests"] * 0.0000004, rel=1e-5)
