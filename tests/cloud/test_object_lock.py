"""S3 Object Lock on a repository: what is written with retention, and what prune, forget and rekey do under it.

moto's S3 (in-process here, and as a server for the CLI) behaves as AWS
does in what these tests rely on: a PUT with ObjectLockMode and
ObjectLockRetainUntilDate needs Content-MD5 or an SDK checksum (Braid's
CRC64NVME is one) and a bucket with Object Lock; a DELETE without a version
id leaves a delete marker even on a locked object; a DELETE of a locked
version is refused (GOVERNANCE: unless bypassed). The clock of prune and
forget is injected; S3's is not needed, since Braid decides from the date.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from tests.conftest import run_braid

from braid.adapters.aws.s3 import S3Store
from braid.adapters.local.keys import LocalKeyFile
from braid.engine.local import LocalEngine
from braid.engine.port import BackupRequest
from braid.engine.stream import sources_from_args
from braid.errors import RetentionLockError
from braid.format.ids import BackupRef
from braid.format.layout import CONFIG, chunk_key, data_prefix, manifest_key, summary_key
from braid.format.lock import ObjectLock
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import format_timestamp, utc_now
from braid.ops.forget import execute_forget, plan_forget
from braid.ops.open import open_backup
from braid.ops.rekey import rekey_repository
from braid.ops.retention import RetentionPolicy, execute_prune, plan_prune
from braid.ops.verify import verify_published
from braid.pipeline.maintenance import run_maintenance
from braid.ports.pipeline import RecordingPublisher
from support.prune_inline import InlinePruneRuns
from support.s3_lock_semantics import AwsObjectLock

pytestmark = pytest.mark.cloud

BUCKET = "braid-locked"
LOCK = ObjectLock("GOVERNANCE", 10)
NOW = datetime.now(UTC)


@dataclass
class Locked:
    s3: Any
    store: S3Store
    keys: LocalKeyFile
    repository: Repository
    tmp_path: Path

    def backup(self, data: bytes, started: datetime, name: str = "db") -> BackupRef:
        source = self.tmp_path / f"input-{os.urandom(4).hex()}"
        source.write_bytes(data)
        request = BackupRequest(BackupRef.new(name, now=started), sources_from_args([str(source)]), 4096, 3, 2)
        manifest = LocalEngine(self.repository, self.keys).run(request, lambda event: None)
        return BackupRef.parse(manifest.backup)

    def head(self, key: str) -> dict[str, Any]:
        return dict(self.s3.head_object(Bucket=BUCKET, Key=f"repo/{key}"))

    def versions(self, key: str) -> list[str]:
        listing = self.s3.list_object_versions(Bucket=BUCKET, Prefix=f"repo/{key}")
        return [v["VersionId"] for v in listing.get("Versions", []) if v["Key"] == f"repo/{key}"]


@pytest.fixture
def locked(aws_env: None, tmp_path: Path) -> Iterator[Locked]:
    """A repository (key file, this host's engine) on a bucket with Object Lock, retention GOVERNANCE for 10 days."""
    with mock_aws(), AwsObjectLock():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
        keys = LocalKeyFile.create(tmp_path / "master.key")
        store = S3Store(s3, BUCKET, "repo")
        config = RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, utc_now(), object_lock=LOCK)
        Repository.create(store, config)
        yield Locked(s3, store, keys, Repository.open(S3Store(s3, BUCKET, "repo")), tmp_path)


def test_chunks_and_manifest_carry_the_backups_retention_and_nothing_else_does(locked: Locked) -> None:
    ref = locked.backup(b"row " * 5000, NOW)
    chunks = [info.key for info in locked.store.list(data_prefix(ref))]
    assert len(chunks) == 5
    until = LOCK.until(ref)
    assert until == (ref.started + timedelta(days=10)).replace(microsecond=0)
    for key in [*chunks, manifest_key(ref)]:
        head = locked.head(key)
        assert (head.get("ObjectLockMode"), head.get("ObjectLockRetainUntilDate")) == ("GOVERNANCE", until), key
    for key in (CONFIG, summary_key(ref)):
        assert "ObjectLockMode" not in locked.head(key), key
    # As on AWS: a locked version cannot be deleted, not even by the repository's owner...
    (version,) = locked.versions(chunks[0])
    with pytest.raises(ClientError, match="AccessDenied"):
        locked.s3.delete_object(Bucket=BUCKET, Key=f"repo/{chunks[0]}", VersionId=version)
    # ...unless GOVERNANCE is bypassed on purpose (s3:BypassGovernanceRetention on AWS).
    locked.s3.delete_object(Bucket=BUCKET, Key=f"repo/{chunks[0]}", VersionId=version, BypassGovernanceRetention=True)
    assert locked.versions(chunks[0]) == []


def test_as_on_aws_a_retain_until_date_in_the_past_is_refused_so_a_late_write_is_kept_a_day(locked: Locked) -> None:
    with pytest.raises(ClientError, match="InvalidArgument"):
        locked.s3.put_object(Bucket=BUCKET, Key="repo/x", Body=b"x", ChecksumAlgorithm="CRC32", ObjectLockMode="GOVERNANCE",
                             ObjectLockRetainUntilDate=NOW - timedelta(days=1))
    ref = locked.backup(b"old " * 3000, NOW - timedelta(days=11))  # its start + 10 days is past: each write floors to a day ahead
    head = locked.head(manifest_key(ref))
    assert head["ObjectLockRetainUntilDate"] > datetime.now(UTC) + timedelta(hours=23)


def test_prune_keeps_a_locked_backup_whole_says_until_when_and_takes_it_after_the_date(locked: Locked) -> None:
    expired = locked.backup(b"a" * 9000, NOW - timedelta(days=20))
    held = locked.backup(b"b" * 9000, NOW - timedelta(days=5))
    newest = locked.backup(b"c" * 9000, NOW - timedelta(days=1))
    policy = RetentionPolicy.of(keep_last=1)

    plan = plan_prune(locked.repository, policy, locked.keys, now=NOW)
    assert (plan.forget, plan.keep) == ([expired], [newest])
    assert plan.to_json()["locked"] == [{"backup": str(held), "until": format_timestamp(LOCK.until(held))}]
    execute_prune(locked.repository, plan)
    assert locked.repository.backups() == [held, newest]
    assert verify_published(locked.repository, held, locked.keys).ok  # whole: manifest and every chunk

    # The expired one is gone from the repository; S3 keeps its versions until their own date (its objects were
    # written just now, so S3 retains them a day: braid.format.lock.MIN_REMAINING), then the lifecycle takes them.
    assert locked.store.head(manifest_key(expired)) is None and list(locked.store.list(data_prefix(expired))) == []
    assert len(locked.versions(manifest_key(expired))) == 1

    later = LOCK.until(held) + timedelta(seconds=1)
    plan = plan_prune(locked.repository, policy, locked.keys, now=later)
    assert (plan.forget, plan.locked) == ([held], [])
    execute_prune(locked.repository, plan)
    assert locked.repository.backups() == [newest]


def test_the_scheduled_prune_plans_with_the_same_check_and_reports_the_locked_backup(locked: Locked) -> None:
    held = locked.backup(b"f" * 9000, NOW - timedelta(days=4))
    newest = locked.backup(b"g" * 9000, NOW - timedelta(hours=1))

    runs = InlinePruneRuns(locked.repository, locked.keys, RecordingPublisher(), now=NOW)
    run_maintenance(runs, prune_input={"keep_last": 1}, now=NOW)

    (report,) = runs.reports
    assert report.pruned == [] and report.locked == [{"backup": str(held), "until": format_timestamp(LOCK.until(held))}]
    assert report.to_json()["locked"] == report.locked
    assert locked.repository.backups() == [held, newest]


def test_a_pipeline_store_locked_by_the_stack_protects_a_repository_whose_config_says_nothing(locked: Locked) -> None:
    """The Lambda functions' store carries the stack's setting (BRAID_OBJECT_LOCK): prune there respects it
    even for a repository initialised before the stack had Object Lock (its config.json names none)."""
    held = locked.backup(b"h" * 9000, NOW - timedelta(days=4))
    locked.backup(b"i" * 9000, NOW - timedelta(hours=1))
    unlocked = replace(locked.repository.config, object_lock=None)
    locked.store.put(CONFIG, unlocked.to_bytes())
    assert Repository.open(S3Store(locked.s3, BUCKET, "repo")).object_lock is None
    pipeline = Repository.open(S3Store(locked.s3, BUCKET, "repo", object_lock=LOCK))
    assert pipeline.object_lock == LOCK
    plan = plan_prune(pipeline, RetentionPolicy.of(keep_last=1), locked.keys, now=NOW)
    assert plan.forget == [] and [entry.ref for entry in plan.locked] == [held]


def test_forget_refuses_a_locked_backup_with_its_date_and_removes_nothing(locked: Locked) -> None:
    ref = locked.backup(b"d" * 9000, NOW - timedelta(days=3))
    until = format_timestamp(LOCK.until(ref))
    with pytest.raises(RetentionLockError) as refused:
        plan_forget(locked.repository, ref, now=NOW)
    assert refused.value.exit_code == 12
    assert str(refused.value) == (
        f"backup {ref} is under Object Lock retention (GOVERNANCE, 10 days from its start) until {until}:"
        " it cannot be removed before then; nothing was removed"
    )
    assert locked.repository.backups() == [ref] and verify_published(locked.repository, ref, locked.keys).ok

    execute_forget(locked.repository, plan_forget(locked.repository, ref, now=LOCK.until(ref)))
    assert locked.repository.backups() == []


def test_rekey_under_lock_gives_the_new_manifest_version_the_same_date_and_keeps_the_old_one(locked: Locked) -> None:
    ref = locked.backup(b"e" * 9000, NOW - timedelta(days=2))
    (old_version,) = locked.versions(manifest_key(ref))
    new = LocalKeyFile.create(locked.tmp_path / "new.key")

    report = rekey_repository(locked.repository, locked.keys, new, locked.keys.rewrapper(new), {"type": "local", "key_id": new.key_id})

    assert report.rewrapped == [str(ref)] and not report.failed
    versions = locked.versions(manifest_key(ref))
    assert len(versions) == 2 and old_version in versions
    head = locked.head(manifest_key(ref))
    assert (head["ObjectLockMode"], head["ObjectLockRetainUntilDate"]) == ("GOVERNANCE", LOCK.until(ref))
    with pytest.raises(ClientError, match="AccessDenied"):  # the version rekey replaced stays until its date
        locked.s3.delete_object(Bucket=BUCKET, Key=f"repo/{manifest_key(ref)}", VersionId=old_version)
    reopened = Repository.open(S3Store(locked.s3, BUCKET, "repo"))
    assert reopened.config.object_lock == LOCK and reopened.config.key["key_id"] == new.key_id  # the config kept its lock
    assert open_backup(reopened, ref, new).manifest.backup == str(ref)
    assert verify_published(reopened, ref, new).ok


# --- the CLI, against a moto server ------------------------------------------------


@pytest.fixture
def server(aws_env: None) -> Iterator[dict[str, str]]:
    """A moto server with a bucket that has Object Lock and one that has not; the environment a host's CLI needs."""
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    semantics = AwsObjectLock().install()
    host, port = moto.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
    client.create_bucket(Bucket="braid-unlocked")
    try:
        yield env
    finally:
        semantics.uninstall()
        moto.stop()


def test_the_cli_backs_up_with_retention_prune_reports_it_and_forget_exits_12(server: dict[str, str], isolated_config: Path) -> None:
    repo = f"s3://{BUCKET}/db"
    made = run_braid("init", "--repo", repo, "--engine", "local", "--object-lock", "COMPLIANCE:30", "--json", env=server)
    assert made.code == 0, made.stderr
    client = boto3.client("s3", endpoint_url=server["AWS_ENDPOINT_URL"], region_name="us-east-1")
    config = json.loads(client.get_object(Bucket=BUCKET, Key="db/config.json")["Body"].read())
    assert config["object_lock"] == {"mode": "COMPLIANCE", "days": 30}
    refs = []
    for data in (b"first " * 3000, b"second " * 3000):
        result = run_braid("backup", "--repo", repo, "--name", "pg", "--chunk-size", "8KiB", stdin=data, env=server)
        assert result.code == 0, result.stderr
        refs.append(BackupRef.parse(result.out.strip()))
    head = client.head_object(Bucket=BUCKET, Key=f"db/{manifest_key(refs[0])}")
    assert (head["ObjectLockMode"], head["ObjectLockRetainUntilDate"]) == ("COMPLIANCE", ObjectLock("COMPLIANCE", 30).until(refs[0]))
    assert client.head_object(Bucket=BUCKET, Key=f"db/{chunk_key(refs[1], 0)}")["ObjectLockMode"] == "COMPLIANCE"

    until = format_timestamp(ObjectLock("COMPLIANCE", 30).until(refs[0]))
    dry = run_braid("prune", "--repo", repo, "--keep-last", "1", "--dry-run", "--json", env=server)
    assert dry.code == 0, dry.stderr
    assert json.loads(dry.out)["locked"] == [{"backup": str(refs[0]), "until": until}] and json.loads(dry.out)["forget"] == []
    pruned = run_braid("prune", "--repo", repo, "--keep-last", "1", env=server)
    assert pruned.code == 0, pruned.stderr
    assert f"kept {refs[0]}: under Object Lock retention until {until}; a prune after that date removes it" in pruned.out

    for extra in ((), ("--dry-run",)):
        forget = run_braid("forget", "--repo", repo, str(refs[0]), *extra, env=server)
        assert forget.code == 12, forget.stderr
        assert forget.stderr.strip() == (
            f"braid: error: backup {refs[0]} is under Object Lock retention (COMPLIANCE, 30 days from its start) until {until}:"
            " it cannot be removed before then; nothing was removed"
        )
    show = run_braid("show", "--repo", repo, str(refs[0]), env=server)
    assert show.code == 0 and f"retention   Object Lock COMPLIANCE until {until}" in show.out.splitlines()
    shown = json.loads(run_braid("show", "--repo", repo, str(refs[0]), "--json", env=server).out)
    assert shown["object_lock"] == {"mode": "COMPLIANCE", "until": until}
    listed = run_braid("list", "--repo", repo, "--json", env=server)
    assert [doc["backup"] for doc in json.loads(listed.out)] == [str(r) for r in refs]


def test_a_lock_on_a_bucket_without_object_lock_fails_the_backup_saying_so(server: dict[str, str], isolated_config: Path) -> None:
    repo = "s3://braid-unlocked/db"
    assert run_braid("init", "--repo", repo, "--engine", "local", "--object-lock", "GOVERNANCE:7", env=server).code == 0
    result = run_braid("backup", "--repo", repo, "--name", "pg", stdin=b"rows " * 100, env=server)
    assert result.code == 7, result.stderr
    assert "bucket braid-unlocked has no Object Lock, but the repository's config.json asks for retention" in result.stderr
    assert run_braid("list", "--repo", repo, "--json", env=server).out.strip() == "[]"


def test_init_refuses_a_malformed_object_lock(server: dict[str, str], isolated_config: Path) -> None:
    result = run_braid("init", "--repo", f"s3://{BUCKET}/bad", "--engine", "local", "--object-lock", "GOVERNANCE:forever", env=server)
    assert result.code == 2
    assert result.stderr.strip() == "braid: error: object lock 'GOVERNANCE:forever': expected MODE:DAYS, e.g. GOVERNANCE:30"
