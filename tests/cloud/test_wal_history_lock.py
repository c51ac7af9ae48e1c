"""Under Object Lock, publishing a backup on a timeline after the first keeps that timeline's `.history` file at least
as long as the backup (braid.ops.wal_history_lock, through braid.engine.finalize).

A history file is archived locked for the days from its write, at the timeline switch; a backup that starts more
than the days later outlives it unless its publication lengthens the file's date. moto in-process (and as a server
for the CLI) with AWS's lock semantics (support.s3_lock_semantics: PutObjectRetention refuses a past or shorter
date, as AWS does); the clock of a history file's write is moved back by giving its PUT the date a write then
would have carried, and a backup's start by its id, as tests/cloud/test_object_lock.py does.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.s3.exceptions import S3AccessDeniedError
from moto.s3.responses import S3Response
from tests.cloud.test_object_lock import BUCKET as LOCKED_BUCKET
from tests.cloud.test_object_lock import server  # noqa: F401  (the moto server fixture)
from tests.conftest import run_braid
from tests.test_wal_retention import label_tar, seg
from tests.wal_segments import write_segment

import braid.adapters.aws.s3 as s3_adapter
from braid.adapters.aws.s3 import S3Store
from braid.adapters.local.keys import LocalKeyFile
from braid.engine.local import LocalEngine
from braid.engine.port import BackupRequest
from braid.engine.stream import sources_from_args
from braid.format.ids import BackupRef
from braid.format.layout import manifest_key, summary_key, wal_key
from braid.format.lock import ObjectLock, history_until, retention_until
from braid.format.manifest import Manifest
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import format_timestamp, utc_now
from braid.format.wal import WalFile
from braid.ops.wal_history_lock import STAT, HistoryRetentionError, retain_history
from braid.ops.wal_push import push_wal
from support.s3_lock_semantics import AwsObjectLock

pytestmark = pytest.mark.cloud

BUCKET, PLAIN = "braid-history-lock", "braid-history-plain"
DAYS = 10
NOW = datetime.now(UTC)
HISTORY = "00000002.history"
HISTORY_KEY = wal_key("pg", WalFile.parse(HISTORY))


class Host:
    """A repository on S3 (this host's engine and key file), its client's calls counted by operation and key."""

    def __init__(self, s3: Any, bucket: str, tmp_path: Path, lock: ObjectLock | None) -> None:
        self.s3, self.bucket, self.tmp_path, self.lock = s3, bucket, tmp_path, lock
        self.keys = LocalKeyFile.create(tmp_path / f"{bucket}.key")
        Repository.create(S3Store(s3, bucket, "repo"), RepositoryConfig.new({"type": "local", "key_id": self.keys.key_id}, utc_now(), object_lock=lock))
        self.repository = Repository.open(S3Store(s3, bucket, "repo"))
        self.calls: Counter[tuple[str, str]] = Counter()
        s3.meta.events.register("before-parameter-build.s3", self._count)

    def _count(self, model: Any, params: dict[str, Any], **kwargs: Any) -> None:
        self.calls[(model.name, str(params.get("Key", "")).removeprefix("repo/"))] += 1

    def push_history(self, monkeypatch: pytest.MonkeyPatch, written: datetime, name: str = HISTORY) -> str:
        """Archive the history file `name` as a push at `written` would have: locked until `written` plus the days."""
        path = self.tmp_path / name
        path.write_bytes(b"1\t0/3000000\tno recovery target specified\n")
        with monkeypatch.context() as patched:
            patched.setattr(s3_adapter, "retention_until", partial(_retention_at, written))
            push_wal(self.repository, self.keys, "pg", path)
        self.calls.clear()  # what the backups ask from here
        return wal_key("pg", WalFile.parse(name))

    def backup(self, data: bytes, started: datetime) -> Manifest:
        source = self.tmp_path / f"input-{os.urandom(4).hex()}"
        source.write_bytes(data)
        request = BackupRequest(BackupRef.new("pg", now=started), sources_from_args([str(source)]), 4096, 3, 2)
        return LocalEngine(self.repository, self.keys).run(request, lambda event: None)

    def retention(self, key: str) -> tuple[Any, Any]:
        head = self.s3.head_object(Bucket=self.bucket, Key=f"repo/{key}")
        return head.get("ObjectLockMode"), head.get("ObjectLockRetainUntilDate")

    def versions(self, key: str) -> int:
        return len(self.s3.list_object_versions(Bucket=self.bucket, Prefix=f"repo/{key}").get("Versions", []))


def _retention_at(written: datetime, lock: ObjectLock, key: str, now: datetime | None = None) -> datetime | None:
    return retention_until(lock, key, written)


@pytest.fixture(params=["GOVERNANCE", "COMPLIANCE"])
def locked(request: pytest.FixtureRequest, aws_env: None, tmp_path: Path) -> Iterator[Host]:
    with mock_aws(), AwsObjectLock():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
        yield Host(s3, BUCKET, tmp_path, ObjectLock(request.param, DAYS))


def test_a_backup_started_long_after_its_timelines_switch_lengthens_the_history_files_date(locked: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    assert locked.lock is not None
    written = NOW - timedelta(days=8)  # the switch, 8 of the 10 days ago: the file is kept 2 more days
    locked.push_history(monkeypatch, written)
    assert locked.retention(HISTORY_KEY) == (locked.lock.mode, locked.lock.wal_until(written))

    manifest = locked.backup(label_tar(2, 3), NOW - timedelta(hours=1))

    ref = BackupRef.parse(manifest.backup)
    assert manifest.wal is not None and manifest.wal.timeline == 2
    assert manifest.stats[STAT] == "extended"
    assert locked.retention(HISTORY_KEY) == (locked.lock.mode, locked.lock.until(ref))  # the backup's own date, its own mode
    assert locked.retention(manifest_key(ref)) == (locked.lock.mode, locked.lock.until(ref))
    assert locked.versions(HISTORY_KEY) == 1  # lengthened in place: no new version
    assert locked.calls[("PutObjectRetention", HISTORY_KEY)] == 1

    # A later backup on the timeline lengthens it again; one that started earlier asks for nothing (never a shorter date).
    later = BackupRef.parse(locked.backup(label_tar(2, 5), NOW).backup)
    assert locked.retention(HISTORY_KEY)[1] == locked.lock.until(later)
    earlier = locked.backup(label_tar(2, 4), NOW - timedelta(hours=2))
    assert earlier.stats[STAT] == "held"
    assert locked.retention(HISTORY_KEY)[1] == locked.lock.until(later)
    assert locked.calls[("PutObjectRetention", HISTORY_KEY)] == 2


def test_a_history_file_already_kept_long_enough_is_read_and_left_alone(locked: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    assert locked.lock is not None
    locked.push_history(monkeypatch, NOW)  # written after the backup below started: kept longer already
    manifest = locked.backup(label_tar(2, 3), NOW - timedelta(days=1))
    assert manifest.stats[STAT] == "held"
    assert {call: n for call, n in locked.calls.items() if call[1] == HISTORY_KEY} == {("HeadObject", HISTORY_KEY): 1}
    assert locked.retention(HISTORY_KEY) == (locked.lock.mode, locked.lock.wal_until(NOW))


def test_timeline_1_and_a_stream_that_is_no_base_backup_ask_nothing_of_the_archive(locked: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    locked.push_history(monkeypatch, NOW - timedelta(days=8))
    for data in (label_tar(1, 3), b"not a tar " * 1000):
        manifest = locked.backup(data, NOW)
        assert STAT not in manifest.stats
    assert not [call for call in locked.calls if call[1].startswith("wal/")]


def test_an_absent_history_file_is_recorded_and_the_backup_published(locked: Host) -> None:
    """No archive under the name, or the history file still staged (the WAL worker then writes it with a later date)."""
    manifest = locked.backup(label_tar(3, 3), NOW)
    assert manifest.stats[STAT] == "absent"
    assert locked.repository.load(BackupRef.parse(manifest.backup)).manifest.stats[STAT] == "absent"  # sealed into the manifest
    assert locked.calls[("PutObjectRetention", wal_key("pg", WalFile.parse("00000003.history")))] == 0


def test_without_a_lock_nothing_is_asked(aws_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with mock_aws(), AwsObjectLock():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=PLAIN)
        plain = Host(s3, PLAIN, tmp_path, None)
        plain.push_history(monkeypatch, NOW - timedelta(days=8))
        manifest = plain.backup(label_tar(2, 3), NOW)
        assert STAT not in manifest.stats
        assert not [call for call in plain.calls if call[1].startswith("wal/")]
        assert plain.retention(HISTORY_KEY) == (None, None)
        assert retain_history(plain.repository.store, BackupRef.parse(manifest.backup), manifest.wal) is None


def test_the_date_is_the_manifests_own_even_for_a_backup_that_ran_almost_the_days() -> None:
    lock, ref = ObjectLock("COMPLIANCE", 2), BackupRef.new("pg", now=NOW - timedelta(days=2))
    assert history_until(lock, ref, NOW) >= lock.retain_until(ref, NOW + timedelta(seconds=59))  # the manifest's, PUT moments later
    fresh = BackupRef.new("pg", now=NOW)
    assert history_until(lock, fresh, NOW) == lock.until(fresh)


def test_as_on_aws_a_shorter_date_is_refused_so_a_writer_that_shortened_one_would_fail_here(locked: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    assert locked.lock is not None
    locked.push_history(monkeypatch, NOW)
    full, held = f"repo/{HISTORY_KEY}", locked.lock.wal_until(NOW)
    sooner = {"Mode": locked.lock.mode, "RetainUntilDate": held - timedelta(days=1)}
    with pytest.raises(ClientError, match="AccessDenied"):
        locked.s3.put_object_retention(Bucket=BUCKET, Key=full, Retention=sooner)
    with pytest.raises(ClientError, match="InvalidArgument"):  # nor a date in the past
        locked.s3.put_object_retention(Bucket=BUCKET, Key=full, Retention={**sooner, "RetainUntilDate": NOW - timedelta(days=1)})
    assert locked.retention(HISTORY_KEY)[1] == held
    if locked.lock.mode == "GOVERNANCE":  # only with the bypass, which Braid never sends
        locked.s3.put_object_retention(Bucket=BUCKET, Key=full, Retention=sooner, BypassGovernanceRetention=True)
        assert locked.retention(HISTORY_KEY)[1] == sooner["RetainUntilDate"]
    # The port itself asks nothing for a date the object already reaches.
    locked.calls.clear()
    retained = locked.repository.store.extend_retention(HISTORY_KEY, NOW + timedelta(hours=1))  # type: ignore[attr-defined]
    assert retained is not None and not retained.extended and locked.calls[("PutObjectRetention", HISTORY_KEY)] == 0
    assert locked.repository.store.extend_retention("wal/pg/history/00000009.history", NOW) is None  # type: ignore[attr-defined]


def test_a_refused_extension_fails_the_backup_before_anything_is_published(locked: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    locked.push_history(monkeypatch, NOW - timedelta(days=8))
    monkeypatch.setattr(S3Response, "put_object_retention", _denied)
    ref = BackupRef.new("pg", now=NOW)
    source = locked.tmp_path / "input"
    source.write_bytes(label_tar(2, 3))
    request = BackupRequest(ref, sources_from_args([str(source)]), 4096, 3, 2)
    with pytest.raises(HistoryRetentionError) as raised:
        LocalEngine(locked.repository, locked.keys).run(request, lambda event: None)
    assert raised.value.exit_code == 7
    assert str(raised.value).startswith(f"could not keep {HISTORY_KEY} (timeline 2's history, which a recovery of {ref} follows) until ")
    assert "s3:PutObjectRetention" in str(raised.value) and str(raised.value).endswith("; nothing was published")
    store = locked.repository.store
    assert store.head(manifest_key(ref)) is None and store.head(summary_key(ref)) is None


def _denied(self: Any) -> Any:
    raise S3AccessDeniedError


# --- the CLI, against a moto server ------------------------------------------------


def test_the_cli_publishes_only_once_the_history_is_kept_and_exits_7_when_it_cannot_be(
    server: dict[str, str], isolated_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    repo = f"s3://{LOCKED_BUCKET}/histdb"  # the fixture's bucket with Object Lock; a prefix no other test uses (moto's state is the process's)
    assert run_braid("init", "--repo", repo, "--engine", "local", "--object-lock", "GOVERNANCE:10", env=server).code == 0
    history = tmp_path / HISTORY
    history.write_bytes(b"1\t0/3000000\tno recovery target specified\n")
    for path in (history, write_segment(tmp_path, seg(2, 3))):
        pushed = run_braid("wal-push", "--repo", repo, "--name", "pg", str(path), env=server)
        assert pushed.code == 0, pushed.stderr
    client = boto3.client("s3", endpoint_url=server["AWS_ENDPOINT_URL"], region_name="us-east-1")
    key = f"histdb/{HISTORY_KEY}"
    # As if it were pushed 9 of the 10 days ago (an administrator's bypass of GOVERNANCE, in the test only).
    client.put_object_retention(Bucket=LOCKED_BUCKET, Key=key, Retention={"Mode": "GOVERNANCE", "RetainUntilDate": NOW + timedelta(days=1)},
                                BypassGovernanceRetention=True)

    with monkeypatch.context() as denied:
        denied.setattr(S3Response, "put_object_retention", _denied)  # the server is this process's: the role lacks the grant
        refused = run_braid("backup", "--repo", repo, "--name", "pg", "--quiet", stdin=label_tar(2, 3), env=server)
    assert refused.code == 7, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"braid: error: could not keep {HISTORY_KEY} (timeline 2's history, which a recovery of pg@")
    assert "the role needs s3:PutObjectRetention on it" in line and line.endswith("; nothing was published")
    assert json.loads(run_braid("list", "--repo", repo, "--json", env=server).out) == []

    done = run_braid("backup", "--repo", repo, "--name", "pg", stdin=label_tar(2, 3), env=server)
    assert done.code == 0, done.stderr
    ref = BackupRef.parse(done.out.strip())
    until = client.head_object(Bucket=LOCKED_BUCKET, Key=key)["ObjectLockRetainUntilDate"]
    assert until == ObjectLock("GOVERNANCE", 10).until(ref)
    shown = json.loads(run_braid("show", "--repo", repo, str(ref), "--json", env=server).out)
    assert shown["stats"][STAT] == "extended" and shown["object_lock"]["until"] == format_timestamp(until)
