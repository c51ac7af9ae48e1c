"""Archived WAL under the repository's S3 Object Lock: each file, pack and history file is PUT with retention.

The date is the write plus the lock's days (braid.format.lock.retention_until),
so the WAL a locked backup needs (written after the backup started) stays at
least as long as the backup. moto (with support.s3_lock_semantics: a date in
the past refused, as on AWS) stores the mode and date a PUT carries and
refuses a PUT with retention without Content-MD5 or an SDK checksum.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from moto import mock_aws
from tests.wal_segments import write_segment

from braid.adapters.aws.s3 import S3Store
from braid.adapters.aws.wal_staging import S3WalStaging
from braid.adapters.local.keys import LocalKeyFile
from braid.errors import StorageError
from braid.format.layout import archive_info_key, wal_key
from braid.format.lock import MIN_REMAINING, ObjectLock, locked_wal, retention_until, rewrite_until
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import format_timestamp, utc_now
from braid.format.wal import WalFile
from braid.ops.rekey import rekey_repository
from braid.ops.wal_fetch import fetch_wal_bytes
from braid.ops.wal_push import push_wal
from support.s3_lock_semantics import AwsObjectLock

pytestmark = pytest.mark.cloud

BUCKET = "braid-locked-wal"
SEGMENT = "000000010000000000000003"
HISTORY = "00000002.history"
PACK = "wal/pg/0000000100000000/pack-00000004-00000005"


def test_the_wal_keys_a_lock_retains_and_the_ones_it_leaves_deletable() -> None:
    for key in (
        f"wal/pg/0000000100000000/{SEGMENT}", "wal/pg/0000000100000000/000000010000000000000006.partial",
        "wal/pg/0000000100000000/000000010000000000000002.00000028.backup", f"wal/pg/history/{HISTORY}", PACK,
    ):
        assert locked_wal(key), key
    for key in (
        "wal/pg/archive.json", f"wal-staging/pg/{SEGMENT}", f"wal/pg/history/{SEGMENT}", f"wal/pg/0000000200000000/{SEGMENT}",
        "wal/pg/0000000100000000/pack-00000005-00000004", "wal/bad name/0000000100000000/" + SEGMENT, "wal/pg", "config.json",
    ):
        assert not locked_wal(key), key
    lock, now = ObjectLock("COMPLIANCE", 7), datetime(2026, 11, 29, 1, 2, 3, 456789, tzinfo=UTC)
    assert retention_until(lock, PACK, now) == datetime(2026, 12, 6, 1, 2, 3, tzinfo=UTC)
    assert retention_until(lock, "wal/pg/archive.json", now) is None
    # A rewrite keeps the original's date, or a day ahead when that has passed (S3 refuses a date in the past).
    original = datetime(2026, 12, 1, tzinfo=UTC)
    assert rewrite_until(lock, PACK, original, now) == original
    assert rewrite_until(lock, PACK, now - timedelta(days=3), now) == (now + MIN_REMAINING).replace(microsecond=0)
    assert rewrite_until(lock, PACK, now + timedelta(seconds=5), now) == (now + MIN_REMAINING).replace(microsecond=0)
    assert rewrite_until(lock, PACK, None, now) == retention_until(lock, PACK, now)


class Locked:
    def __init__(self, s3: Any, tmp_path: Path, lock: ObjectLock) -> None:
        self.s3, self.tmp_path, self.lock = s3, tmp_path, lock
        self.keys = LocalKeyFile.create(tmp_path / "master.key")
        config = RepositoryConfig.new({"type": "local", "key_id": self.keys.key_id}, utc_now(), object_lock=lock)
        Repository.create(S3Store(s3, BUCKET, "repo"), config)
        self.repository = Repository.open(S3Store(s3, BUCKET, "repo"))

    def head(self, key: str) -> dict[str, Any]:
        return dict(self.s3.head_object(Bucket=BUCKET, Key=f"repo/{key}"))

    def versions(self, key: str) -> list[str]:
        listing = self.s3.list_object_versions(Bucket=BUCKET, Prefix=f"repo/{key}")
        return [v["VersionId"] for v in listing.get("Versions", []) if v["Key"] == f"repo/{key}"]

    def retained(self, key: str, before: datetime, after: datetime) -> datetime:
        """The key's retain-until date, checked to be the lock's mode and its days from a write between `before` and `after`."""
        head = self.head(key)
        until = head.get("ObjectLockRetainUntilDate")
        assert head.get("ObjectLockMode") == self.lock.mode and until is not None, (key, head)
        assert self.lock.wal_until(before) <= until <= self.lock.wal_until(after), (key, until)
        return until


@pytest.fixture(params=["GOVERNANCE", "COMPLIANCE"])
def locked(request: pytest.FixtureRequest, aws_env: None, tmp_path: Path) -> Iterator[Locked]:
    with mock_aws(), AwsObjectLock():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
        yield Locked(s3, tmp_path, ObjectLock(request.param, 10))


def test_a_host_pushes_a_segment_and_a_history_file_locked_days_from_their_write(locked: Locked) -> None:
    history = locked.tmp_path / HISTORY
    history.write_bytes(b"1\t0/3000000\tno recovery target specified\n")
    before = datetime.now(UTC)
    for path in (write_segment(locked.tmp_path, SEGMENT), history):
        push_wal(locked.repository, locked.keys, "pg", path)
    after = datetime.now(UTC)
    for name in (SEGMENT, HISTORY):
        locked.retained(wal_key("pg", WalFile.parse(name)), before, after)
    assert "ObjectLockMode" not in locked.head(archive_info_key("pg"))  # the archive's record stays deletable
    (version,) = locked.versions(wal_key("pg", WalFile.parse(SEGMENT)))
    with pytest.raises(ClientError, match="AccessDenied"):  # a locked version cannot be deleted
        locked.s3.delete_object(Bucket=BUCKET, Key=f"repo/{wal_key('pg', WalFile.parse(SEGMENT))}", VersionId=version)


def test_the_wal_workers_pack_and_file_are_stored_locked(locked: Locked) -> None:
    """What the WAL worker writes through S3WalStaging.put_archived (a pack, a file alone), with its SHA-256 checksum."""
    staging = S3WalStaging(locked.repository.store)  # type: ignore[arg-type]
    single = wal_key("pg", WalFile.parse("000000010000000000000002.00000028.backup"))
    before = datetime.now(UTC)
    for key, blob in ((PACK, b"pack bytes" * 100), (single, b"label")):
        staging.put_archived(key, blob, hashlib.sha256(blob).hexdigest())
    after = datetime.now(UTC)
    for key in (PACK, single):
        locked.retained(key, before, after)
        assert staging.archived_sha256(key)


def test_rekey_replaces_a_locked_wal_object_with_a_version_of_the_same_date(locked: Locked) -> None:
    path = write_segment(locked.tmp_path, SEGMENT)
    before = datetime.now(UTC)
    push_wal(locked.repository, locked.keys, "pg", path)
    key = wal_key("pg", WalFile.parse(SEGMENT))
    locked.retained(key, before, datetime.now(UTC))
    (old_version,) = locked.versions(key)
    # A date of the original's own (extended a day, as S3 allows): the new version must carry it, not one of the rekey's.
    until = locked.head(key)["ObjectLockRetainUntilDate"] + timedelta(days=1)
    locked.s3.put_object_retention(Bucket=BUCKET, Key=f"repo/{key}", VersionId=old_version, Retention={"Mode": locked.lock.mode, "RetainUntilDate": until})
    new = LocalKeyFile.create(locked.tmp_path / "new.key")

    report = rekey_repository(locked.repository, locked.keys, new, locked.keys.rewrapper(new), {"type": "local", "key_id": new.key_id})

    assert (report.wal.rewrapped, report.wal.failed) == (1, [])
    versions = locked.versions(key)
    assert len(versions) == 2 and old_version in versions
    head = locked.head(key)
    assert (head["ObjectLockMode"], head["ObjectLockRetainUntilDate"]) == (locked.lock.mode, until)  # the write's date, not the rekey's
    reopened = Repository.open(S3Store(locked.s3, BUCKET, "repo"))
    assert bytes(fetch_wal_bytes(reopened, new, "pg", SEGMENT)) == path.read_bytes()


def test_a_put_refused_for_want_of_put_object_retention_names_the_permission() -> None:
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    store = S3Store(client, BUCKET, "repo", object_lock=ObjectLock("GOVERNANCE", 3))
    key = wal_key("pg", WalFile.parse(SEGMENT))
    with Stubber(client) as stub:
        stub.add_client_error("put_object", "AccessDenied", "Access Denied", 403)
        with pytest.raises(StorageError) as refused:
            store.put(key, b"blob", create_only=True)
        stub.add_client_error("put_object", "AccessDenied", "Access Denied", 403)
        with pytest.raises(StorageError) as refused_worker:
            S3WalStaging(store).put_archived(key, b"blob", hashlib.sha256(b"blob").hexdigest())
    assert refused.value.exit_code == 7
    message = str(refused.value)
    assert message == f"access denied while writing s3://{BUCKET}/repo/{key}: the role needs s3:PutObject and s3:PutObjectRetention on it (Access Denied)"
    assert "the role needs s3:PutObject and s3:PutObjectRetention on wal/*" in str(refused_worker.value), str(refused_worker.value)
    assert refused_worker.value.exit_code == 7
    unlocked = S3Store(client, BUCKET, "repo")
    with Stubber(client) as stub:
        stub.add_client_error("put_object", "AccessDenied", "Access Denied", 403)
        with pytest.raises(StorageError) as plain:
            unlocked.put(key, b"blob", create_only=True)
    assert "PutObjectRetention" not in str(plain.value)


def test_prune_reports_wal_locked_by_its_write_deletes_none_and_takes_it_after_the_date(locked: Locked) -> None:
    """The WAL prune skips an object under its own retention (braid.ops.wal_retention): WAL written locked is
    reported with its write's date while that lasts, and removed by a prune after it."""
    from tests.cloud.test_object_lock import Locked as Backups
    from tests.test_wal_retention import label_tar, seg

    from braid.ops.retention import RetentionPolicy, execute_prune, plan_prune
    from braid.ops.wal_retention import execute_wal_prune, plans_for_prune

    source = locked.tmp_path / "wal"
    source.mkdir()
    before = datetime.now(UTC)
    for n in range(1, 5):
        push_wal(locked.repository, locked.keys, "pg", write_segment(source, seg(1, n)))
    after = datetime.now(UTC)
    backups = Backups(locked.s3, locked.repository.store, locked.keys, locked.repository, locked.tmp_path)  # type: ignore[arg-type]
    old = backups.backup(label_tar(1, 2), before - timedelta(days=30), name="pg")  # long out of its retention
    newest = backups.backup(label_tar(1, 3), before - timedelta(hours=1), name="pg")
    plan = plan_prune(locked.repository, RetentionPolicy.of(keep_last=1), locked.keys)
    assert (plan.forget, plan.keep) == ([old], [newest])
    (wal,) = plans_for_prune(locked.repository, plan)
    assert wal.files() == []
    assert [e.files for e in wal.locked] == [(seg(1, 1),), (seg(1, 2),)]
    for entry in wal.locked:
        assert locked.lock.wal_until(before) <= entry.until <= locked.lock.wal_until(after)
    assert wal.describe_lock()[0].startswith(f"kept WAL object {wal_key('pg', WalFile.parse(seg(1, 1)))}: under Object Lock retention until")
    many = replace(wal, locked=[*wal.locked, *wal.locked])  # past LOCKED_LINES objects: one line for them all
    first, last = min(e.until for e in wal.locked), max(e.until for e in wal.locked)
    assert many.describe_lock() == [
        f"kept 4 WAL object(s) of pg holding {seg(1, 1)} .. {seg(1, 2)}: under Object Lock retention until {format_timestamp(first)}"
        f" .. {format_timestamp(last)}; a prune after those dates removes them (--json lists each)"
    ]
    execute_prune(locked.repository, plan)
    execute_wal_prune(locked.repository, [wal])
    assert [info.key.rpartition("/")[2] for info in locked.repository.store.list("wal/pg/0000000100000000/")] == [seg(1, n) for n in range(1, 5)]

    later = locked.lock.wal_until(after) + timedelta(seconds=1)
    plan = plan_prune(locked.repository, RetentionPolicy.of(keep_last=1), locked.keys, now=later)
    (wal,) = plans_for_prune(locked.repository, plan)
    assert (wal.files(), wal.locked) == ([seg(1, 1), seg(1, 2)], [])
