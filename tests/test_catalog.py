"""The catalog: `list` from a snapshot and the log since, never every manifest; summaries
sealed like manifests; every way a summary or snapshot can be wrong falls back to the
manifest; prune and forget take backups out of it; the repair path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from moto import mock_aws

from braid.adapters.aws.clients import s3_client
from braid.adapters.aws.s3 import S3Store
from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.engine.finalize import InputRecord, finalize_backup
from braid.errors import IntegrityError, StorageError
from braid.format.catalog import open_snapshot
from braid.format.ids import BackupRef
from braid.format.keys import DataKey, encryption_context
from braid.format.layout import CATALOG_INDEX, CATALOG_LOG, SUMMARIES, manifest_key, parse_log_marker, summary_key
from braid.format.manifest import Manifest
from braid.format.repository import Repository, RepositoryConfig
from braid.format.summary import BackupSummary, open_summary
from braid.format.timestamps import utc_now
from braid.ops import catalog as catalog_ops
from braid.ops.catalog import Unreadable, read_catalog, write_summary
from braid.ports.store import ObjectStore
from conftest import run_braid
from support.faulty_store import FaultRule, FaultyStore


class Repo:
    def __init__(self, store: ObjectStore, keys: LocalKeyFile) -> None:
        self.store = store
        self.keys = keys
        self.repository = Repository.create(store, RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, utc_now()))

    def publish(self, name: str = "db", inputs: int = 1, store: ObjectStore | None = None) -> Manifest:
        """A real backup through the real finalizer (empty inputs: no chunks to write)."""
        ref = BackupRef.new(name)
        key, wrapped = self.keys.generate_data_key(encryption_context(self.repository.config.id, str(ref)))
        return finalize_backup(
            store or self.store,
            ref=ref,
            repository_id=self.repository.config.id,
            key=key,
            wrapped=wrapped,
            chunk_size=4096,
            inputs=[InputRecord(i, f"/p{i}", 0) for i in range(inputs)],
            entries=[],
            level=3,
            created=utc_now(),
            timings={},
            engine="local",
        )

    def key_of(self, manifest: Manifest) -> DataKey:
        return self.keys.unwrap(manifest.key)

    def keys_under(self, prefix: str) -> list[str]:
        return [info.key for info in self.store.list(prefix)]


@pytest.fixture(params=["local", "s3"])
def repo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Repo]:
    keys = LocalKeyFile.create(tmp_path / "master.key")
    if request.param == "local":
        yield Repo(LocalStore(tmp_path / "repo"), keys)
        return
    request.getfixturevalue("aws_env")
    with mock_aws():
        client = s3_client(region="us-east-1")
        client.create_bucket(Bucket="braid-catalog")
        yield Repo(S3Store(client, "braid-catalog", "repo"), keys)


def names(entries: list[BackupSummary | Unreadable]) -> list[str]:
    return sorted(e.backup if isinstance(e, BackupSummary) else f"UNREADABLE {e.ref}" for e in entries)


def no_manifest_reads(store: ObjectStore) -> FaultyStore:
    """The store, failing any GET of a manifest: a list that reads one shows it unreadable."""
    return FaultyStore(store, [FaultRule("get", 1.0, "fail", "manifests/")])


def test_finalize_writes_a_summary_sealed_like_the_manifest(repo: Repo) -> None:
    manifest = repo.publish(inputs=2)
    ref = BackupRef.parse(manifest.backup)
    sealed = open_summary(repo.store.get(summary_key(ref)), "summary")
    assert sealed.authenticate(repo.key_of(manifest)) == BackupSummary.of(manifest)
    assert sealed.summary.inputs == 2 and sealed.summary.backup == manifest.backup
    other = repo.publish()
    with pytest.raises(IntegrityError, match="failed authentication"):
        sealed.authenticate(repo.key_of(other))
    with pytest.raises(IntegrityError, match="failed authentication"):  # a summary MAC is not a manifest MAC
        sealed.authenticate(DataKey(b"\x01" * 32))
    raw = bytearray(repo.store.get(summary_key(ref)))
    raw[len(raw) // 2] ^= 0x01
    with pytest.raises(IntegrityError, match="corrupt"):
        open_summary(bytes(raw), "summary")
    markers = [parse_log_marker(k) for k in repo.keys_under(CATALOG_LOG)]
    assert sorted((str(m[1]), m[2]) for m in markers if m) == sorted([(manifest.backup, "published"), (other.backup, "published")])


def test_list_reads_the_snapshot_and_the_log_never_a_manifest(repo: Repo) -> None:
    first = [repo.publish("db"), repo.publish("logs")]
    cold = read_catalog(repo.repository)
    assert cold.source == "rebuilt" and cold.snapshot_written is not None
    assert names(cold.entries) == sorted(m.backup for m in first)
    later = [repo.publish("db"), repo.publish("db")]
    guarded = no_manifest_reads(repo.store)
    warm = read_catalog(Repository(guarded, repo.repository.config))
    assert warm.source == "snapshot" and warm.markers_read >= 2
    assert names(warm.entries) == sorted(m.backup for m in first + later)
    assert guarded.calls["get"] >= 1 and guarded.total_injected == 0  # no manifest was read


def test_the_cli_lists_from_the_catalog_with_the_same_rows(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    assert run_braid("init", "--repo", str(repo)).code == 0
    made = [run_braid("backup", "--repo", str(repo), "--name", "db", stdin=b"x" * n).out.strip() for n in (10, 5000)]
    rows = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert [r["backup"] for r in rows] == made
    assert [r["plaintext_bytes"] for r in rows] == [10, 5000] and rows[0]["inputs"] == 1 and rows[0]["engine"] == "local"
    assert list((repo / "catalog" / "index").iterdir())  # the first list wrote a snapshot
    shown = json.loads(run_braid("show", "--repo", str(repo), made[1], "--json").out)
    assert {k: shown[k] for k in rows[1]} == rows[1]  # list (summary) and show (manifest) agree
    again = run_braid("list", "--repo", str(repo), "--name", "db", "--rebuild-catalog", "--json")
    assert again.code == 0 and json.loads(again.out) == rows
    assert run_braid("list", "--repo", str(repo), "--name", "../x").code == 2


def test_a_missing_corrupt_or_misplaced_summary_falls_back_to_the_manifest(repo: Repo) -> None:
    read_catalog(repo.repository)  # a snapshot, so what follows comes from the log
    missing, corrupt, misplaced = repo.publish(inputs=1), repo.publish(inputs=2), repo.publish(inputs=3)
    repo.store.delete([summary_key(BackupRef.parse(missing.backup))])
    raw = bytearray(repo.store.get(summary_key(BackupRef.parse(corrupt.backup))))
    raw[-70] ^= 0x01
    repo.store.put(summary_key(BackupRef.parse(corrupt.backup)), bytes(raw))
    other = repo.publish("other")
    repo.store.put(summary_key(BackupRef.parse(misplaced.backup)), repo.store.get(summary_key(BackupRef.parse(other.backup))))
    entries = {e.backup: e for e in read_catalog(repo.repository).entries if isinstance(e, BackupSummary)}
    for manifest in (missing, corrupt, misplaced):
        assert entries[manifest.backup] == BackupSummary.of(manifest)


def test_a_publish_that_never_completed_is_not_listed_and_withdraws_its_records(repo: Repo) -> None:
    read_catalog(repo.repository)
    refused = FaultyStore(repo.store, [FaultRule("put", 1.0, "after", "manifests/")])
    with pytest.raises(StorageError):
        repo.publish("db", store=refused)
    assert refused.total_injected == 1
    assert repo.keys_under(SUMMARIES) == [] and repo.keys_under(CATALOG_LOG) == [] and repo.keys_under("manifests/") == []
    # A crash between the records and the manifest: the marker names no manifest.
    kept = repo.publish("db")
    ghost = replace(kept, backup=str(BackupRef.new("db")))
    write_summary(repo.store, ghost, DataKey(b"\x02" * 32))
    assert names(read_catalog(repo.repository).entries) == [kept.backup]


def test_prune_and_forget_take_backups_out_of_the_catalog_first(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    assert run_braid("init", "--repo", str(repo)).code == 0
    made = [run_braid("backup", "--repo", str(repo), "--name", "db", stdin=b"%d" % n * 100).out.strip() for n in range(4)]
    assert len(json.loads(run_braid("list", "--repo", str(repo), "--json").out)) == 4  # snapshot now holds all four
    assert run_braid("forget", "--repo", str(repo), made[0]).code == 0
    assert run_braid("prune", "--repo", str(repo), "--keep-last", "2").code == 0
    rows = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert [r["backup"] for r in rows] == made[2:]
    summaries = sorted(p.relative_to(repo / "catalog" / "summaries").as_posix() for p in (repo / "catalog" / "summaries").rglob("*.json"))
    assert summaries == sorted(f"{r.name}/{r.id}.json" for r in map(BackupRef.parse, made[2:]))
    events = sorted((str(m[1]), m[2]) for m in (parse_log_marker(p.relative_to(repo).as_posix()) for p in (repo / "catalog" / "log").rglob("*~*")) if m)
    assert [e for e in events if e[1] == "removed"] == sorted((b, "removed") for b in made[:2])


def test_a_stale_snapshot_is_repaired_by_rebuild(repo: Repo) -> None:
    kept, gone = repo.publish(), repo.publish()
    read_catalog(repo.repository)
    repo.store.delete([manifest_key(BackupRef.parse(gone.backup))])  # round Braid: no removal marker
    assert names(read_catalog(repo.repository).entries) == sorted([kept.backup, gone.backup])  # the snapshot is a cache
    rebuilt = read_catalog(repo.repository, rebuild=True)
    assert rebuilt.source == "rebuilt" and names(rebuilt.entries) == [kept.backup]
    assert names(read_catalog(repo.repository).entries) == [kept.backup]


def test_an_unreadable_manifest_stays_listed_as_unreadable(repo: Repo) -> None:
    good, bad = repo.publish(), repo.publish()
    ref = BackupRef.parse(bad.backup)
    repo.store.delete([summary_key(ref)])
    repo.store.put(manifest_key(ref), repo.store.get(manifest_key(ref))[:-5])
    for _ in range(2):  # rebuilt, then from the snapshot (which records it as unreadable, to retry)
        entries = read_catalog(repo.repository).entries
        assert names(entries) == sorted([good.backup, f"UNREADABLE {bad.backup}"])
        unreadable = [e for e in entries if isinstance(e, Unreadable)]
        assert isinstance(unreadable[0].error, IntegrityError)


def test_a_corrupt_manifest_with_an_intact_summary_is_unreadable_after_a_rebuild_and_stays_so(repo: Repo) -> None:
    good, bad = repo.publish(), repo.publish()
    read_catalog(repo.repository)  # a snapshot that lists both as healthy
    ref = BackupRef.parse(bad.backup)
    repo.store.put(manifest_key(ref), repo.store.get(manifest_key(ref))[:100])  # its summary is untouched
    rebuilt = read_catalog(repo.repository, rebuild=True)
    assert names(rebuilt.entries) == sorted([good.backup, f"UNREADABLE {bad.backup}"])
    (unreadable,) = [e for e in rebuilt.entries if isinstance(e, Unreadable)]
    assert isinstance(unreadable.error, IntegrityError)
    warm = read_catalog(repo.repository)  # from the new snapshot: retried with its manifest, still unreadable
    assert warm.source == "snapshot" and names(warm.entries) == sorted([good.backup, f"UNREADABLE {bad.backup}"])


def test_the_cli_lists_a_corrupt_manifest_as_unreadable_after_rebuild_catalog(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    assert run_braid("init", "--repo", str(repo)).code == 0
    first = run_braid("backup", "--repo", str(repo), "--name", "c", stdin=b"a" * 5000).out.strip()
    second = run_braid("backup", "--repo", str(repo), "--name", "c", stdin=b"b" * 5000).out.strip()
    path = repo / manifest_key(BackupRef.parse(second))
    path.write_bytes(path.read_bytes()[:100])
    listed = run_braid("list", "--repo", str(repo), "--name", "c", "--rebuild-catalog")
    assert listed.code == 0, listed.stderr
    (row,) = [line for line in listed.out.splitlines() if second.split("@")[1] in line]
    assert "UNREADABLE" in row.upper()
    assert "UNREADABLE" not in next(line for line in listed.out.splitlines() if first.split("@")[1] in line).upper()


def test_a_corrupt_snapshot_is_skipped(repo: Repo) -> None:
    made = [repo.publish(), repo.publish()]
    written = read_catalog(repo.repository).snapshot_written
    assert written is not None
    raw = bytearray(repo.store.get(written))
    raw[40] ^= 0x01
    repo.store.put(written, bytes(raw))
    with pytest.raises(IntegrityError):
        open_snapshot(bytes(raw), written)
    again = read_catalog(repo.repository)
    assert again.source == "rebuilt" and names(again.entries) == sorted(m.backup for m in made)


def test_the_log_is_folded_into_a_new_snapshot_and_old_ones_go(repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog_ops, "COMPACT_AFTER", 3)
    read_catalog(repo.repository)
    made = [repo.publish() for _ in range(3)]
    later = datetime.now(UTC) + catalog_ops.PENDING + timedelta(minutes=1)
    for step in range(3):
        made.append(repo.publish())
        result = read_catalog(repo.repository, now=later + timedelta(seconds=step))
        assert names(result.entries) == sorted(m.backup for m in made)
        assert result.snapshot_written is not None
    snapshots = repo.keys_under(CATALOG_INDEX)
    assert len(snapshots) == catalog_ops.KEEP_SNAPSHOTS
    newest = open_snapshot(repo.store.get(snapshots[-1]), snapshots[-1])
    assert sorted(s.backup for s in newest.backups) == sorted(m.backup for m in made)
    # Within PENDING of now nothing is folded: a marker whose manifest is not there yet stays in the log.
    assert read_catalog(repo.repository).snapshot_written is None


def test_a_snapshot_older_than_the_log_window_is_not_caught_up_on(repo: Repo) -> None:
    made = repo.publish()
    read_catalog(repo.repository)
    far = datetime.now(UTC) + timedelta(days=catalog_ops.MAX_LOG_DAYS + 1)
    result = read_catalog(repo.repository, now=far)
    assert result.source == "rebuilt" and names(result.entries) == [made.backup]
