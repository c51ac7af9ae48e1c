"""WAL retention under S3 Object Lock: the WAL a locked backup needs stays, and an archived object under its own
retention is reported with its date, never deleted (a DELETE would only hide it behind a delete marker).

moto's S3 in-process with AWS's lock semantics (support.s3_lock_semantics), as tests/cloud/test_object_lock.py;
the WAL is pushed by a host with the key (one object per file) and by the WAL worker's packing (a pack of several).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from tests.cloud.test_object_lock import BUCKET, LOCK, NOW, Locked, server  # noqa: F401  (the moto server fixture)
from tests.conftest import run_braid
from tests.test_wal_pack import StoreStaging, _stage
from tests.test_wal_retention import label_tar, seg
from tests.wal_segments import write_segment

from braid.adapters.aws.s3 import S3Store
from braid.adapters.local.keys import LocalKeyFile
from braid.format.ids import BackupRef
from braid.format.layout import wal_key
from braid.format.lock import ObjectLock
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import format_timestamp, utc_now
from braid.format.wal import WalFile
from braid.ops.retention import RetentionPolicy, execute_prune, plan_prune
from braid.ops.wal import archived_files
from braid.ops.wal_pack_process import process_staged_files
from braid.ops.wal_push import push_wal
from braid.ops.wal_retention import execute_wal_prune, plans_for_prune
from braid.ports.pipeline import RecordingPublisher
from support.prune_inline import InlinePruneRuns
from support.s3_lock_semantics import AwsObjectLock

pytestmark = pytest.mark.cloud


@pytest.fixture
def locked(aws_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Locked]:
    """A repository on a bucket with Object Lock (GOVERNANCE, 10 days), and an archive of 1 MiB segments 1..8 on timeline 1,
    archived without retention of their own (by a Braid from before WAL was written locked): what the lock's planning
    keeps, and what one object's own retention keeps, are then told apart (WAL written locked: test_wal_object_lock)."""
    original = S3Store.retention
    monkeypatch.setattr(S3Store, "retention", lambda self, key: {} if key.startswith("wal/") else original(self, key))
    with mock_aws(), AwsObjectLock():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
        keys = LocalKeyFile.create(tmp_path / "master.key")
        store = S3Store(s3, BUCKET, "repo")
        Repository.create(store, RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, utc_now(), object_lock=LOCK))
        repository = Repository.open(S3Store(s3, BUCKET, "repo"))
        source = tmp_path / "wal"
        source.mkdir()
        for n in range(1, 9):
            push_wal(repository, keys, "pg", write_segment(source, seg(1, n)))
        yield Locked(s3, store, keys, repository, tmp_path)


def retain(locked: Locked, key: str, until: datetime) -> None:
    """Put `key` (repository-relative) under its own retention, as a bucket default or an administrator would."""
    locked.s3.put_object_retention(Bucket=BUCKET, Key=f"repo/{key}", Retention={"Mode": "GOVERNANCE", "RetainUntilDate": until})


def archived(locked: Locked) -> list[str]:
    return sorted({file.name for file, _key in archived_files(locked.store, "pg")})


def test_the_wal_a_locked_backup_needs_stays_and_a_locked_object_is_reported_not_deleted(locked: Locked) -> None:
    expired = locked.backup(label_tar(1, 2), NOW - timedelta(days=20), name="pg")
    held = locked.backup(label_tar(1, 4), NOW - timedelta(days=5), name="pg")  # under the lock: kept, whatever the rule says
    newest = locked.backup(label_tar(1, 6), NOW - timedelta(days=1), name="pg")
    own = wal_key("pg", WalFile.parse(seg(1, 2)))
    until = (NOW + timedelta(days=3)).replace(microsecond=0)
    retain(locked, own, until)

    plan = plan_prune(locked.repository, RetentionPolicy.of(keep_last=1), locked.keys, now=NOW)
    assert (plan.keep, [e.ref for e in plan.locked], plan.forget) == ([newest], [held], [expired])
    (wal,) = plans_for_prune(locked.repository, plan)
    # Before the oldest start the kept backups (by rule or lock) need: 1..3; 2 is under its own retention.
    assert wal.files() == [seg(1, 1), seg(1, 3)]
    assert wal.for_lock == [seg(1, 4), seg(1, 5)]  # only the locked backup needs them
    assert [(e.key, e.files, e.until) for e in wal.locked] == [(own, (seg(1, 2),), until)]
    assert wal.to_json() == {
        "name": "pg", "files": [seg(1, 1), seg(1, 3)],
        "kept_from": [{"backup": str(newest), "timeline": 1, "segno": 6}, {"backup": str(held), "timeline": 1, "segno": 4}],
        "kept_for_lock": {"files": [seg(1, 4), seg(1, 5)], "backups": {str(held): format_timestamp(LOCK.until(held))}},
        "locked": [{"key": own, "files": [seg(1, 2)], "until": format_timestamp(until)}],
    }
    assert wal.describe_lock() == [
        f"kept 2 WAL file(s) of pg, {seg(1, 4)} .. {seg(1, 5)}, for backups under Object Lock retention"
        f" ({held} until {format_timestamp(LOCK.until(held))}); a prune after their dates removes them",
        f"kept WAL object {own}: under Object Lock retention until {format_timestamp(until)}; a prune after that date removes it",
    ]
    execute_prune(locked.repository, plan)
    execute_wal_prune(locked.repository, [wal])
    assert archived(locked) == [seg(1, n) for n in (2, *range(4, 9))]
    versions = locked.s3.list_object_versions(Bucket=BUCKET, Prefix=f"repo/{own}")
    assert not versions.get("DeleteMarkers"), "a locked WAL object is not hidden behind a delete marker"

    # After both dates: the locked backup goes, and with it the WAL only it needed; the object's own date has passed too.
    later = max(LOCK.until(held), until) + timedelta(seconds=1)
    plan = plan_prune(locked.repository, RetentionPolicy.of(keep_last=1), locked.keys, now=later)
    assert (plan.forget, plan.locked) == ([held], [])
    (wal,) = plans_for_prune(locked.repository, plan)
    assert (wal.files(), wal.for_lock, wal.locked) == ([seg(1, n) for n in (2, 4, 5)], [], [])


def test_the_scheduled_prune_keeps_and_reports_the_same_under_the_lock(locked: Locked) -> None:
    """PlanPrune plans with the host's function: its state and the run's report carry what the lock kept."""
    held = locked.backup(label_tar(1, 3), NOW - timedelta(days=5), name="pg")
    locked.backup(label_tar(1, 5), NOW - timedelta(days=1), name="pg")
    own = wal_key("pg", WalFile.parse(seg(1, 1)))
    until = (NOW + timedelta(days=1)).replace(microsecond=0)
    retain(locked, own, until)
    runs = InlinePruneRuns(locked.repository, locked.keys, RecordingPublisher(), now=NOW)

    runs.start("prune-wal-lock", {"keep_last": 1})

    (state,) = runs.states
    assert [(w["files"], w["kept_for_lock"], w["locked_objects"]) for w in state["wal"]] == [(1, 2, 1)]
    (report,) = runs.reports
    assert report.ok and report.pruned == [] and [entry["backup"] for entry in report.locked] == [str(held)]
    (wal,) = report.wal
    assert wal["files"] == [seg(1, 2)] and wal["kept_for_lock"]["files"] == [seg(1, 3), seg(1, 4)]
    assert wal["locked"] == [{"key": own, "files": [seg(1, 1)], "until": format_timestamp(until)}]
    assert archived(locked) == [seg(1, n) for n in (1, *range(3, 9))]


def test_a_pack_under_its_own_retention_keeps_every_member(locked: Locked) -> None:
    """The WAL worker's packs (policy wal-pack): a pack goes whole or not at all, and a locked one stays whole."""
    staging = StoreStaging(locked.store)  # type: ignore[arg-type]
    source = locked.tmp_path / "packed"
    source.mkdir()
    process_staged_files(locked.repository, locked.keys, staging, "pg", _stage(locked.repository, staging, source, [seg(1, n) for n in range(9, 13)]), pack_files=4)
    (pack,) = [k for k in staging.puts if "/pack-" in k]
    newest = locked.backup(label_tar(1, 13), NOW - timedelta(hours=1), name="pg")
    retain(locked, pack, NOW + timedelta(days=2))
    plan = plan_prune(locked.repository, RetentionPolicy.of(keep_last=1), locked.keys, now=NOW)
    assert plan.keep == [newest]
    (wal,) = plans_for_prune(locked.repository, plan)
    assert wal.files() == [seg(1, n) for n in range(1, 9)]
    assert [(e.key, e.files) for e in wal.locked] == [(pack, tuple(seg(1, n) for n in range(9, 13)))]
    execute_wal_prune(locked.repository, [wal])
    assert archived(locked) == [seg(1, n) for n in range(9, 13)]
    assert json.loads(json.dumps(wal.to_json()))["locked"][0]["files"] == [seg(1, n) for n in range(9, 13)]


def test_without_a_lock_in_the_repository_no_object_is_headed(aws_env: None, tmp_path: Path) -> None:
    """The HEAD per object to go is the lock's cost only: a repository without Object Lock plans from the listing alone."""
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="braid-plain")
        keys = LocalKeyFile.create(tmp_path / "master.key")
        Repository.create(S3Store(s3, "braid-plain", ""), RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, utc_now()))
        repository = Repository.open(S3Store(s3, "braid-plain", ""))
        source = tmp_path / "wal"
        source.mkdir()
        for n in (1, 2, 3):
            push_wal(repository, keys, "pg", write_segment(source, seg(1, n)))
        locked = Locked(s3, repository.store, keys, repository, tmp_path)  # type: ignore[arg-type]
        locked.backup(label_tar(1, 3), datetime.now(UTC), name="pg")
        heads: list[str] = []
        original = repository.store.head
        repository.store.head = lambda key: heads.append(key) or original(key)  # type: ignore[method-assign]
        plan = plan_prune(repository, RetentionPolicy.of(keep_last=1), keys)
        (wal,) = plans_for_prune(repository, plan)
        assert wal.files() == [seg(1, 1), seg(1, 2)] and not [k for k in heads if k.startswith("wal/")]


def test_the_cli_prune_says_which_wal_the_lock_keeps_dry_run_and_json(server: dict[str, str],  # noqa: F811
    isolated_config: Path, tmp_path: Path) -> None:
    """`braid prune --dry-run` (text and --json) on an s3:// repository under Object Lock: the WAL only a locked backup
    needs and an object under its own retention are named, with their dates; the prune then removes only the rest."""
    repo = f"s3://{BUCKET}/walrepo"
    assert run_braid("init", "--repo", repo, "--engine", "local", "--object-lock", "GOVERNANCE:30", env=server).code == 0
    source = tmp_path / "wal"
    source.mkdir()
    for n in range(1, 7):
        pushed = run_braid("wal-push", "--repo", repo, "--name", "pg", str(write_segment(source, seg(1, n))), env=server)
        assert pushed.code == 0, pushed.stderr
    refs = []
    for start in (2, 4):  # both started now: the older is under the lock when keep-last 1 lets it go
        made = run_braid("backup", "--repo", repo, "--name", "pg", "--quiet", "--json", stdin=label_tar(1, start), env=server)
        assert made.code == 0, made.stderr
        refs.append(json.loads(made.out)["backup"])
    client = boto3.client("s3", endpoint_url=server["AWS_ENDPOINT_URL"], region_name="us-east-1")
    own = wal_key("pg", WalFile.parse(seg(1, 1)))
    until = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    # Shorter than the date its push gave it (30 days): on AWS, as here (support.s3_lock_semantics), only with the bypass.
    client.put_object_retention(Bucket=BUCKET, Key=f"walrepo/{own}", Retention={"Mode": "GOVERNANCE", "RetainUntilDate": until}, BypassGovernanceRetention=True)
    held = format_timestamp(ObjectLock("GOVERNANCE", 30).until(BackupRef.parse(refs[0])))

    dry = run_braid("prune", "--repo", repo, "--keep-last", "1", "--dry-run", env=server)
    assert dry.code == 0, dry.stderr
    assert f"kept 2 WAL file(s) of pg, {seg(1, 2)} .. {seg(1, 3)}, for backups under Object Lock retention ({refs[0]} until {held})" in dry.out
    assert f"kept WAL object {own}: under Object Lock retention until {format_timestamp(until)}; a prune after that date removes it" in dry.out
    assert "would remove" not in dry.out and "kept every WAL file" not in dry.out, dry.out
    doc = json.loads(run_braid("prune", "--repo", repo, "--keep-last", "1", "--dry-run", "--json", env=server).out)
    (wal,) = doc["wal"]
    assert wal["files"] == [] and wal["kept_for_lock"] == {"files": [seg(1, 2), seg(1, 3)], "backups": {refs[0]: held}}
    assert wal["locked"] == [{"key": own, "files": [seg(1, 1)], "until": format_timestamp(until)}]
    done = run_braid("prune", "--repo", repo, "--keep-last", "1", env=server)
    assert done.code == 0, done.stderr
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="walrepo/wal/pg/0000000100000000/")
    assert sorted(o["Key"].rpartition("/")[2] for o in listed["Contents"]) == [seg(1, n) for n in range(1, 7)]
    assert not client.list_object_versions(Bucket=BUCKET, Prefix=f"walrepo/{own}").get("DeleteMarkers")
