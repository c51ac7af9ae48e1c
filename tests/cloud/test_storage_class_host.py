"""A host's `braid prune` on an `s3://` repository moves old backups' chunks, and prices their deletion.

The real CLI against a moto server on loopback (S3 only, no stack): a
stored policy with `--storage-class STANDARD_IA:0` makes every kept backup
due at once. Prune moves the chunks (head_object says STANDARD_IA),
manifests and the catalog stay in Standard, `list --json`/`show` report
the class and a month of it at the class's price, and a later prune that
removes a backup moved seconds ago reports the early-deletion charge of
nearly the whole 30-day minimum, in text and --json, --dry-run included.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from tests.conftest import run_braid

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]

GB = 2**30
IA_PRICE = 0.0125  # per GB-month, docs/design/2026-11-28-storage-classes.md
STANDARD_PRICE = 0.023


@pytest.fixture
def s3(aws_env: None) -> Iterator[dict[str, str]]:
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


def classes(env: dict[str, str], prefix: str) -> dict[str, str]:
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="plain", Prefix=prefix).get("Contents", [])]
    return {key: client.head_object(Bucket="plain", Key=key).get("StorageClass", "STANDARD") for key in keys}


def test_prune_moves_kept_backups_and_reports_the_early_deletion_charge(s3: dict[str, str], isolated_config: Path) -> None:
    repo = "s3://plain/r"
    assert run_braid("init", "--repo", repo, "--engine", "local", env=s3).code == 0
    first = run_braid("backup", "--repo", repo, "--name", "pg", "--chunk-size", "64KiB", stdin=b"a" * 300_000 + bytes(range(256)) * 400, env=s3)
    assert first.code == 0, first.stderr
    ref = first.out.strip()
    saved = run_braid("prune", "--repo", repo, "--name", "pg", "--keep-last", "1", "--storage-class", "STANDARD_IA:0", "--save-policy", "--json", env=s3)
    assert saved.code == 0, saved.stderr
    assert json.loads(saved.out)["storage"] == {"pg": {"class": "STANDARD_IA", "after_days": 0}}
    shown_policy = run_braid("prune", "--repo", repo, "--show-policy", env=s3)
    assert "pg: --storage-class STANDARD_IA:0 (chunks move to STANDARD_IA after 0 days)" in shown_policy.out

    dry = run_braid("prune", "--repo", repo, "--dry-run", env=s3)
    assert dry.code == 0 and f"would move the chunks of {ref} to STANDARD_IA" in dry.out, dry.stderr
    assert set(classes(s3, "r/data/").values()) == {"STANDARD"}  # a dry run moves nothing

    moved = run_braid("prune", "--repo", repo, "--json", env=s3)
    assert moved.code == 0, moved.stderr
    storage = json.loads(moved.out)["storage"]
    assert storage["moves"] == [{"backup": ref, "class": "STANDARD_IA"}] and storage["moved_objects"] > 0
    assert set(classes(s3, "r/data/").values()) == {"STANDARD_IA"}
    for prefix in ("r/manifests/", "r/catalog/", "r/policies/", "r/storage/", "r/config.json"):
        assert set(classes(s3, prefix).values()) == {"STANDARD"}, prefix
    again = run_braid("prune", "--repo", repo, "--json", env=s3)
    assert json.loads(again.out)["storage"]["moves"] == []  # moved once: the record says so

    (row,) = json.loads(run_braid("list", "--repo", repo, "--json", env=s3).out)
    assert row["storage"]["class"] == "STANDARD_IA" and row["storage"]["since"].endswith("Z")
    assert row["storage"]["per_month"] == pytest.approx(row["stored_bytes"] / GB * IA_PRICE, rel=1e-5)
    assert row["cost"]["storage_per_month"] == row["storage"]["per_month"]
    shown = run_braid("show", "--repo", repo, ref, env=s3)
    assert f"storage     STANDARD_IA since {row['storage']['since']}, USD " in shown.out
    assert json.loads(run_braid("show", "--repo", repo, ref, "--json", env=s3).out)["storage"] == row["storage"]

    second = run_braid("backup", "--repo", repo, "--name", "pg", stdin=b"b" * 5000, env=s3)
    assert second.code == 0, second.stderr
    (_, newest) = sorted(json.loads(run_braid("list", "--repo", repo, "--json", env=s3).out), key=lambda r: r["created"])
    assert newest["storage"]["class"] == "STANDARD" and newest["storage"]["since"] is None
    assert newest["storage"]["per_month"] == pytest.approx(newest["stored_bytes"] / GB * STANDARD_PRICE, rel=1e-5)

    # keep-last 1 now lets the first go, seconds after it moved: ~30 days of its minimum are charged.
    expected = row["stored_bytes"] / GB * IA_PRICE * 30 / 30
    dry = run_braid("prune", "--repo", repo, "--dry-run", "--json", env=s3)
    doc = json.loads(dry.out)["storage"]
    (early,) = doc["early_deletion"]
    assert early["backup"] == ref and early["storage_class"] == "STANDARD_IA" and 29.9 < early["remaining_days"] <= 30
    assert doc["early_deletion_charge"] == pytest.approx(expected, rel=0.01) and doc["currency"] == "USD"
    text = run_braid("prune", "--repo", repo, "--dry-run", env=s3)
    assert f"early deletion of {ref}: in STANDARD_IA since " in text.out and "day(s) short of its minimum storage duration" in text.out
    assert "early-deletion charge this prune would cause: USD " in text.stderr
    done = run_braid("prune", "--repo", repo, env=s3)
    assert done.code == 0 and f"removed {ref}" in done.out and "early-deletion charge caused: USD " in done.stderr, done.stderr
    assert classes(s3, f"r/storage/{ref.replace('@', '/')}/") == {}  # its record went with it
