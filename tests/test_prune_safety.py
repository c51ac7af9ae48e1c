"""Retention never loses a good backup: unreadable manifests, races with running
backups and restores, leftover grace, temporary files, and `braid forget`.

The real CLI where a user would act; the ops functions directly where a race
needs the other party to act at an exact moment (a real LocalStore wrapped
so a hook runs at that moment).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

from braid.adapters.aws.clients import s3_client
from braid.adapters.aws.s3 import S3Store
from braid.adapters.local.keys import LocalKeyFile
from braid.cli.compose import open_key_service, open_repository
from braid.engine.chunk_worker import ChunkTask, store_chunk
from braid.engine.finalize import InputRecord, finalize_backup
from braid.engine.lease import BackupLease
from braid.errors import IntegrityError, NotFoundError, UsageError
from braid.format.chunk import ChunkCodec
from braid.format.ids import BackupRef
from braid.format.keys import DataKey, encryption_context
from braid.format.layout import chunk_key, lease_key, manifest_key
from braid.format.lease import LeaseRecord
from braid.format.repository import Repository, RepositoryConfig
from braid.format.staging import session_key
from braid.format.staging.keys import agent_lease_key
from braid.format.timestamps import format_timestamp, utc_now
from braid.ops.forget import execute_forget, plan_forget
from braid.ops.leftovers import MIN_ORPHAN_GRACE_HOURS
from braid.ops.open import open_backup
from braid.ops.restore import OutputTarget, restore_backup
from braid.ops.retention import RetentionPolicy, execute_prune, plan_prune
from braid.pipeline.maintenance import policy_from_event
from conftest import BRAID, run_braid

LONG_AGO = datetime(2020, 1, 2, tzinfo=UTC)


def backup(repo: Path, name: str, data: bytes) -> str:
    result = run_braid("backup", "--repo", str(repo), "--name", name, "--chunk-size", "4KiB", stdin=data)
    assert result.code == 0, result.stderr
    return result.out.strip()


def listed(repo: Path) -> list[str]:
    return sorted(row["backup"] for row in json.loads(run_braid("list", "--repo", str(repo), "--json").out))


def manifest_path(repo: Path, backup_ref: str) -> Path:
    ref = BackupRef.parse(backup_ref)
    return repo / "manifests" / ref.name / f"{ref.id}.json"


def data_dir(repo: Path, backup_ref: str | BackupRef) -> Path:
    ref = backup_ref if isinstance(backup_ref, BackupRef) else BackupRef.parse(backup_ref)
    return repo / "data" / ref.name / ref.id


def age(path: Path, when: datetime = LONG_AGO) -> None:
    """Make a file (or every file under a directory) look last written at `when`."""
    for item in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
        os.utime(item, (when.timestamp(), when.timestamp()))


def restores(repo: Path, backup_ref: str, expected: bytes) -> bool:
    result = run_braid("restore", "--repo", str(repo), backup_ref)
    return result.code == 0 and result.stdout == expected


class HookedStore:
    """A real LocalStore with hooks: the other party of a race, acting at the exact moment."""

    def __init__(
        self,
        inner: Any,
        *,
        after_put: Callable[[str], None] | None = None,
        before_delete: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.inner = inner
        self.after_put = after_put
        self.before_delete = before_delete
        self.deleted: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put(self, key: str, data: Any, **options: Any) -> None:
        self.inner.put(key, data, **options)
        if self.after_put:
            self.after_put(key)

    def delete(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        if self.before_delete and batch:
            self.before_delete(batch)
        self.deleted.extend(batch)
        self.inner.delete(batch)


# --- unreadable manifests never count and are never removed -----------------


def test_truncated_newest_manifest_does_not_push_out_the_good_one(repo: Path) -> None:
    a = backup(repo, "c", b"first " * 2000)
    b = backup(repo, "c", b"second " * 2000)
    with open(manifest_path(repo, b), "r+b") as handle:
        handle.truncate(100)

    result = run_braid("prune", "--repo", str(repo), "--keep-last", "1")

    assert result.code == 6
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("braid: error: 1 backup(s) could not be read and were neither counted nor removed; first: backup " + b)
    assert f"braid forget {b}" in error
    assert f"UNREADABLE {b}" in result.out and f"removed {a}" not in result.out
    assert manifest_path(repo, a).exists() and manifest_path(repo, b).exists()
    assert data_dir(repo, b).exists()  # an unreadable backup's chunks stay too
    assert restores(repo, a, b"first " * 2000)


def test_safe_part_is_done_and_json_reports_the_unreadable(repo: Path) -> None:
    oldest = backup(repo, "db", b"0" * 5000)
    good = backup(repo, "db", b"1" * 5000)
    broken = backup(repo, "db", b"2" * 5000)
    other = backup(repo, "logs", b"l" * 100)
    raw = bytearray(manifest_path(repo, broken).read_bytes())
    raw[len(raw) // 2] ^= 1  # a bit flip
    manifest_path(repo, broken).write_bytes(bytes(raw))

    dry = run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--dry-run", "--json")
    assert dry.code == 6 and f"first: backup {broken}: manifest checksum mismatch" in dry.stderr
    assert json.loads(dry.out)["forget"] == [oldest] and len(listed(repo)) == 4

    result = run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--json")

    assert result.code == 6 and f"first: backup {broken}: manifest checksum mismatch (corrupt)" in result.stderr
    report = json.loads(result.out)
    assert report["forget"] == [oldest] and sorted(report["keep"]) == sorted([good, other])
    assert [u["backup"] for u in report["unreadable"]] == [broken]
    assert listed(repo) == sorted([good, broken, other])
    assert not data_dir(repo, oldest).exists()
    assert restores(repo, good, b"1" * 5000)


def test_manifest_resealed_under_another_data_key_does_not_count(repo: Path) -> None:
    a = backup(repo, "db", b"a" * 5000)
    b = backup(repo, "db", b"b" * 5000)
    manifest = open_repository(str(repo)).load(BackupRef.parse(b)).manifest
    manifest_path(repo, b).write_bytes(manifest.seal(DataKey(os.urandom(32))))  # body unchanged, its checksum right
    assert listed(repo) == sorted([a, b])

    result = run_braid("prune", "--repo", str(repo), "--keep-last", "1")

    assert result.code == 6 and f"first: {b}: manifest of {b} failed authentication" in result.stderr
    assert listed(repo) == sorted([a, b]) and restores(repo, a, b"a" * 5000)


def test_manifest_sealed_under_another_master_key_does_not_count(repo: Path, tmp_path: Path) -> None:
    a = backup(repo, "db", b"a" * 5000)
    b = backup(repo, "db", b"b" * 5000)
    stranger = LocalKeyFile.create(tmp_path / "stranger.key")
    repository = open_repository(str(repo))
    data_key, wrapped = stranger.generate_data_key(encryption_context(repository.config.id, b))
    manifest = dataclasses.replace(repository.load(BackupRef.parse(b)).manifest, key=wrapped)
    manifest_path(repo, b).write_bytes(manifest.seal(data_key))

    result = run_braid("prune", "--repo", str(repo), "--keep-last", "1")

    # Every unreadable one failed for want of the key: a key error (4), naming the backup.
    assert result.code == 4 and f"first: {b}" in result.stderr and "wrong key file" in result.stderr
    assert listed(repo) == sorted([a, b])


def test_prune_needs_the_key(repo: Path, tmp_path: Path) -> None:
    backup(repo, "db", b"a")
    result = run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--key-file", str(tmp_path / "missing.key"))
    assert result.code == 4 and "missing.key" in result.stderr


def test_policy_never_empties_a_name(repo: Path) -> None:
    only = backup(repo, "db", b"x" * 100)
    repository = open_repository(str(repo))
    keys = open_key_service(repository, None, unwrap_only=True)
    plan = plan_prune(repository, RetentionPolicy.of(keep_days=1), keys, now=datetime.now(UTC) + timedelta(days=365))
    assert [str(r) for r in plan.keep] == [only] and plan.forget == []


# --- leftovers: grace from last activity, and the race with publishing --------


# A real backup's id says it started now: leftovers are judged as if two hours had passed.
LATER = datetime.now(UTC) + timedelta(hours=2)


def _abandoned_backup(repo: Path, data: bytes) -> tuple[str, bytes]:
    """A real backup turned into leftovers idle since 2020: its manifest removed (and returned)."""
    ref = backup(repo, "db", data)
    raw = manifest_path(repo, ref).read_bytes()
    manifest_path(repo, ref).unlink()
    age(data_dir(repo, ref))
    return ref, raw


def test_backup_publishing_between_plan_and_delete_survives(repo: Path) -> None:
    ref, raw = _abandoned_backup(repo, b"late " * 3000)
    repository = open_repository(str(repo))
    keys = open_key_service(repository, None, unwrap_only=True)
    plan = plan_prune(repository, RetentionPolicy.of(keep_last=1, orphan_grace_hours=1), keys, now=LATER)
    assert [str(r) for r in plan.orphans] == [ref]

    manifest_path(repo, ref).write_bytes(raw)  # it publishes now, after the listing
    execute_prune(repository, plan)

    assert plan.orphans == [] and [str(r) for r in plan.spared] == [ref]
    assert run_braid("verify", "--repo", str(repo), ref, "--deep").code == 0
    assert restores(repo, ref, b"late " * 3000)


def test_publish_during_the_deletion_itself_is_reported(repo: Path) -> None:
    ref, raw = _abandoned_backup(repo, b"late " * 3000)
    repository = open_repository(str(repo))
    keys = open_key_service(repository, None, unwrap_only=True)
    plan = plan_prune(repository, RetentionPolicy.of(keep_last=1, orphan_grace_hours=1), keys, now=LATER)
    hooked = HookedStore(repository.store, before_delete=lambda keys: manifest_path(repo, ref).write_bytes(raw))

    with pytest.raises(IntegrityError, match=f"backup {ref} was published while prune was collecting its data") as caught:
        execute_prune(Repository(hooked, repository.config), plan)  # type: ignore[arg-type]
    assert f"braid forget {ref}" in str(caught.value)


def test_activity_after_the_plan_spares_a_leftover(repo: Path) -> None:
    ref, _ = _abandoned_backup(repo, b"z" * 9000)
    repository = open_repository(str(repo))
    keys = open_key_service(repository, None, unwrap_only=True)
    plan = plan_prune(repository, RetentionPolicy.of(keep_last=1, orphan_grace_hours=1), keys, now=LATER)
    assert [str(r) for r in plan.orphans] == [ref]
    age(data_dir(repo, ref) / "0000000000", LATER + timedelta(seconds=1))  # the backup wrote again since

    execute_prune(repository, plan)

    assert [str(r) for r in plan.spared] == [ref] and (data_dir(repo, ref) / "0000000000").exists()


def test_old_id_with_a_fresh_lease_is_not_collected(repo: Path) -> None:
    repository = open_repository(str(repo))
    keys = open_key_service(repository, None, unwrap_only=True)
    store = repository.store
    running = BackupRef("db", "20200101T000000.000Z-0badc0de")  # started long ago, still running
    store.put(chunk_key(running, 0), b"chunk")
    age(data_dir(repo, running))
    policy = RetentionPolicy.of(keep_last=1, orphan_grace_hours=1)
    assert [str(r) for r in plan_prune(repository, policy, keys).orphans] == [str(running)]

    BackupLease(store, running).refresh()
    plan = plan_prune(repository, policy, keys)
    assert plan.orphans == []

    # The lease's own time counts even where the store's time says otherwise (a store without times, a restored copy).
    age(data_dir(repo, running))
    assert plan_prune(repository, policy, keys).orphans == []

    # A lease naming another backup proves nothing about this one.
    impostor = LeaseRecord(backup="db@20990101T000000.000Z-00000000", refreshed=utc_now(), host="h", pid=1)
    store.put(lease_key(running), impostor.to_bytes())
    age(data_dir(repo, running))
    plan = plan_prune(repository, policy, keys)
    assert [str(r) for r in plan.orphans] == [str(running)]
    execute_prune(repository, plan)
    assert not data_dir(repo, running).exists()


def test_lease_is_refreshed_while_held_and_removed_after(repo: Path) -> None:
    store = open_repository(str(repo)).store
    ref = BackupRef.new("db")
    with BackupLease(store, ref, interval=0.05) as lease:
        first = LeaseRecord.from_bytes(store.get(lease_key(ref)))
        time.sleep(0.4)
        later = LeaseRecord.from_bytes(store.get(lease_key(ref)))
        assert lease.refreshes >= 3 and later.refreshed > first.refreshed
        assert later.backup == str(ref) and later.pid == os.getpid()
    assert store.head(lease_key(ref)) is None


def test_a_running_backup_holds_a_lease_and_survives_a_concurrent_prune(repo: Path) -> None:
    proc = subprocess.Popen(
        [str(BRAID), "backup", "--repo", str(repo), "--name", "db", "--chunk-size", "4KiB"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(b"r" * 20_000)
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while not list((repo / "data" / "db").glob("*/lease")) and time.monotonic() < deadline:
            time.sleep(0.05)
        (lease_path,) = (repo / "data" / "db").glob("*/lease")
        record = LeaseRecord.from_bytes(lease_path.read_bytes())
        assert record.backup == f"db@{lease_path.parent.name}" and record.pid == proc.pid

        pruned = run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--orphan-grace-hours", "1", "--json")
        assert pruned.code == 0, pruned.stderr
        assert json.loads(pruned.out)["orphans"] == [] and lease_path.exists()
    finally:
        out, err = proc.communicate(b"s" * 20_000, timeout=60)
    assert proc.returncode == 0, err
    name_at_id = out.decode().strip()
    assert name_at_id == record.backup and not lease_path.exists()
    assert run_braid("verify", "--repo", str(repo), name_at_id, "--deep").code == 0


def _s3_repository_with_a_session(tmp_path: Path) -> tuple[S3Store, LocalKeyFile, Repository, BackupRef]:
    """A repository on (moto) S3 holding one old backup id's staging session and nothing else."""
    client = s3_client(region="us-east-1")
    client.create_bucket(Bucket="braid-prune")
    store = S3Store(client, "braid-prune", "repo")
    keys = LocalKeyFile.create(tmp_path / "cloud.key")
    repository = Repository.create(store, RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, utc_now()))
    uploading = BackupRef("db", "20200101T000000.000Z-0badc0de")
    store.put(session_key(uploading), b"{}")
    return store, keys, repository, uploading


def test_cloud_leftovers_age_from_their_objects_times(aws_env: None, tmp_path: Path) -> None:
    """On S3 the activity is the objects' LastModified: an old id still uploading is not collected."""
    with mock_aws():
        store, keys, repository, uploading = _s3_repository_with_a_session(tmp_path)
        (info,) = store.list("staging/")
        assert info.modified is not None and abs(datetime.now(UTC) - info.modified) < timedelta(minutes=5)
        policy = RetentionPolicy.of(keep_last=1, orphan_grace_hours=1)

        assert plan_prune(repository, policy, keys).orphans == []
        plan = plan_prune(repository, policy, keys, now=datetime.now(UTC) + timedelta(hours=2))
        assert plan.orphans == [uploading]
        execute_prune(repository, plan)
        assert list(store.list("staging/")) == [] and plan.orphans == [uploading]


def test_a_cloud_agents_staging_lease_keeps_a_slow_upload_alive(aws_env: None, tmp_path: Path) -> None:
    """Between completed segments S3 lists nothing for the parts in progress: the agent's lease is the sign of life."""
    with mock_aws():
        store, keys, repository, uploading = _s3_repository_with_a_session(tmp_path)
        policy = RetentionPolicy.of(keep_last=1, orphan_grace_hours=1)
        later = datetime.now(UTC) + timedelta(hours=2)
        assert plan_prune(repository, policy, keys, now=later).orphans == [uploading]  # no lease: idle for 2 h

        lease = BackupLease(store, uploading, key=agent_lease_key(uploading), remove_on_exit=False)
        record = LeaseRecord(str(uploading), format_timestamp(later - timedelta(minutes=10)), "db-host", 4242)
        store.put(lease.key, record.to_bytes())  # as the agent's refresh thread writes it, 10 min before "now"
        assert plan_prune(repository, policy, keys, now=later).orphans == []
        with lease:  # the agent leaves its lease for the pipeline's cleanup of staging
            pass
        assert store.head(agent_lease_key(uploading)) is not None and lease.refreshes == 1


@pytest.mark.parametrize("hours", ["0", "0.5"])
def test_grace_below_the_minimum_is_refused(repo: Path, hours: str) -> None:
    result = run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--orphan-grace-hours", hours)
    assert result.code == 2
    assert f"--orphan-grace-hours must be at least {MIN_ORPHAN_GRACE_HOURS:g}" in result.stderr and "running backup" in result.stderr


@pytest.mark.parametrize("hours", ["-1", "nan", "inf", "-inf"])
def test_grace_that_is_no_duration_is_refused(repo: Path, hours: str) -> None:
    result = run_braid("prune", "--repo", str(repo), "--keep-last", "1", f"--orphan-grace-hours={hours}")
    assert result.code == 2 and "--orphan-grace-hours" in result.stderr and hours in result.stderr


@pytest.mark.parametrize("hours", [-1.0, 0.0, 0.99, float("nan"), float("inf")])
def test_policy_refuses_unsafe_grace(hours: float) -> None:
    with pytest.raises(UsageError, match="must be at least 1"):
        RetentionPolicy.of(keep_last=1, orphan_grace_hours=hours)
    with pytest.raises(UsageError, match="must be at least 1"):
        policy_from_event({"keep_last": 1, "orphan_grace_hours": hours})


def test_policy_from_event_with_a_non_number() -> None:
    with pytest.raises(UsageError, match="not numbers"):
        policy_from_event({"keep_last": "seven"})


def test_stale_temporary_files_are_collected(repo: Path) -> None:
    kept = backup(repo, "db", b"k" * 5000)
    stale_chunk = data_dir(repo, kept) / ".tmp-deadbeef"
    stale_manifest = repo / "manifests" / "db" / ".tmp-cafef00d"
    fresh = data_dir(repo, kept) / ".tmp-0123abcd"
    for path in (stale_chunk, stale_manifest, fresh):
        path.write_bytes(b"half a write")
    age(stale_chunk)
    age(stale_manifest)

    dry = run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--dry-run")
    assert dry.code == 0 and f"would remove temporary file data/db/{BackupRef.parse(kept).id}/.tmp-deadbeef" in dry.out
    assert stale_chunk.exists()

    result = run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--json")

    assert result.code == 0, result.stderr
    assert sorted(json.loads(result.out)["temporary"]) == sorted(
        [f"data/db/{BackupRef.parse(kept).id}/.tmp-deadbeef", "manifests/db/.tmp-cafef00d"]
    )
    assert not stale_chunk.exists() and not stale_manifest.exists() and fresh.exists()
    assert restores(repo, kept, b"k" * 5000)


# --- finalize notices chunks removed while it publishes ----------------------


def test_finalize_withdraws_a_backup_whose_chunks_vanish_while_publishing(repo: Path) -> None:
    repository = open_repository(str(repo))
    keys = open_key_service(repository, None)
    ref = BackupRef.new("db")
    key, wrapped = keys.generate_data_key(encryption_context(repository.config.id, str(ref)))
    store = repository.store
    codec = ChunkCodec(key, 3)
    entries = [store_chunk(codec, store, ref, ChunkTask(i, 0, i * 4096), b"p" * 4096) for i in range(3)]
    # A prune that judged this data abandoned deletes a chunk just after the manifest is written.
    hooked = HookedStore(store, after_put=lambda k: store.delete([chunk_key(ref, 1)]) if k == manifest_key(ref) else None)

    with pytest.raises(IntegrityError, match=f"chunk 1 of backup {ref} disappeared while the backup was being published"):
        finalize_backup(
            hooked,  # type: ignore[arg-type]
            ref=ref, repository_id=repository.config.id, key=key, wrapped=wrapped, chunk_size=4096,
            inputs=[InputRecord(0, "stdin", 3 * 4096)], entries=entries, level=3, created=utc_now(),
            timings={}, engine="local",
        )
    assert store.head(manifest_key(ref)) is None and repository.backups() == []


# --- forget -------------------------------------------------------------------


def test_forget_dry_run_then_forget(repo: Path) -> None:
    a = backup(repo, "db", b"a" * 9000)
    b = backup(repo, "db", b"b" * 9000)
    chunks = len(list(data_dir(repo, a).iterdir()))

    dry = run_braid("forget", "--repo", str(repo), a, "--dry-run")
    assert dry.code == 0 and dry.out.strip() == f"would remove {a} (manifest manifests/db/{BackupRef.parse(a).id}.json and {chunks} data object(s))"
    assert listed(repo) == sorted([a, b]) and data_dir(repo, a).exists()

    result = run_braid("forget", "--repo", str(repo), a, "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.out) == {"schema_version": 1, "dry_run": False, "backup": a, "manifest": f"manifests/db/{BackupRef.parse(a).id}.json", "objects": chunks}
    assert listed(repo) == [b] and not data_dir(repo, a).exists()
    assert restores(repo, b, b"b" * 9000)


def test_forget_removes_the_manifest_before_any_chunk(repo: Path) -> None:
    a = backup(repo, "db", b"a" * 9000)
    repository = open_repository(str(repo))
    hooked = HookedStore(repository.store)
    hooked_repository = Repository(hooked, repository.config)  # type: ignore[arg-type]
    execute_forget(hooked_repository, plan_forget(hooked_repository, BackupRef.parse(a)))
    # Out of the catalog first (its summary; a `removed` marker was written before), then the manifest, then chunks.
    ref = BackupRef.parse(a)
    assert hooked.deleted[:2] == [f"catalog/summaries/{ref.name}/{ref.id}.json", str(manifest_path(repo, a).relative_to(repo))]
    assert hooked.deleted[2] == f"rekey/{ref.name}/{ref.id}.json"  # any copy an interrupted rekey left goes with the manifest
    assert len(hooked.deleted) == 3 + 3 and not data_dir(repo, a).exists()


def test_forget_an_unreadable_backup(repo: Path) -> None:
    good = backup(repo, "db", b"g" * 5000)
    bad = backup(repo, "db", b"b" * 5000)
    manifest_path(repo, bad).write_bytes(b"{not a manifest")
    assert run_braid("prune", "--repo", str(repo), "--keep-last", "1").code == 6

    result = run_braid("forget", "--repo", str(repo), bad)

    assert result.code == 0, result.stderr
    assert not manifest_path(repo, bad).exists() and not data_dir(repo, bad).exists()
    assert run_braid("prune", "--repo", str(repo), "--keep-last", "1").code == 0
    assert listed(repo) == [good]


def test_forget_missing_backup(repo: Path) -> None:
    backup(repo, "db", b"a")
    missing = "db@20200101T000000.000Z-0badc0de"
    result = run_braid("forget", "--repo", str(repo), missing)
    assert result.code == 8 and f"backup {missing} not found in {repo}" in result.stderr

    leftover = BackupRef.parse(missing)
    open_repository(str(repo)).store.put(chunk_key(leftover, 0), b"partial")
    result = run_braid("forget", "--repo", str(repo), missing)
    assert result.code == 8 and "no manifest (an incomplete backup): 'braid prune' collects it" in result.stderr
    assert data_dir(repo, leftover).exists()


def test_forget_refuses_latest(repo: Path) -> None:
    only = backup(repo, "db", b"a")
    result = run_braid("forget", "--repo", str(repo), "db@latest")
    assert result.code == 2 and "forget needs an exact NAME@ID, not db@latest" in result.stderr and "braid list --name db" in result.stderr
    assert listed(repo) == [only]


# --- restore racing a prune ---------------------------------------------------


def test_restore_of_a_backup_removed_mid_read_says_so(repo: Path, tmp_path: Path) -> None:
    ref = backup(repo, "db", b"q" * 20_000)
    repository = open_repository(str(repo))
    opened = open_backup(repository, BackupRef.parse(ref), open_key_service(repository, None, unwrap_only=True))
    # A prune between the restore's open and its reads: manifest first, then chunks.
    repository.store.delete([manifest_key(BackupRef.parse(ref)), chunk_key(BackupRef.parse(ref), 2)])
    out = tmp_path / "out"

    with pytest.raises(NotFoundError, match=f"backup {ref} was removed \\(pruned or forgotten\\) while it was being read: chunk 2"):
        restore_backup(repository.store, opened.manifest, opened.key, [OutputTarget(str(out), str(out))], workers=2)


def test_missing_chunk_of_a_listed_backup_is_still_corruption(repo: Path, tmp_path: Path) -> None:
    ref = backup(repo, "db", b"q" * 20_000)
    (data_dir(repo, ref) / "0000000002").unlink()
    result = run_braid("restore", "--repo", str(repo), ref, "--output", str(tmp_path / "out"))
    assert result.code == 6 and f"chunk 2 of backup {ref} is missing from the repository" in result.stderr


def test_real_forget_during_a_slow_restore_exits_8(repo: Path) -> None:
    data = os.urandom(4096) * 600
    ref = backup(repo, "db", data)
    restore = subprocess.Popen(
        [str(BRAID), "restore", "--repo", str(repo), ref, "--workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert restore.stdout is not None
    try:
        assert restore.stdout.read(4096) == data[:4096]  # it has opened the backup and is writing; the pipe holds it back
        forgot = run_braid("forget", "--repo", str(repo), ref)
        assert forgot.code == 0, forgot.stderr
    finally:
        rest, err = restore.communicate(timeout=60)
    assert restore.returncode == 8, err
    assert f"backup {ref} was removed (pruned or forgotten) while it was being read" in err.decode()
    assert len(rest) < len(data) - 4096
