"""The catalog in the cloud: Finalize writes its records (a retried Finalize restores them), the scheduled prune rebuilds its snapshot."""

from __future__ import annotations

from pathlib import Path

from test_pipeline_steps import Staged, run_workers, staged  # noqa: F401  (the fixture)
from test_scheduled_maintenance import backup, key_file, maintain

from braid.cli.compose import open_repository
from braid.format.catalog import open_snapshot
from braid.format.ids import BackupRef
from braid.format.layout import CATALOG_INDEX, CATALOG_LOG, manifest_key, parse_log_marker, staging_prefix, summary_key
from braid.format.manifest import open_manifest
from braid.format.repository import Repository
from braid.format.summary import BackupSummary, open_summary
from braid.ops.catalog import read_catalog
from braid.pipeline.finalize import finalize_step
from braid.ports.pipeline import PlainStoreJanitor, RecordingPublisher


def test_finalize_writes_the_summary_and_a_retry_restores_it(staged: Staged) -> None:  # noqa: F811
    run_workers(staged)
    staging = {info.key: staged.store.get(info.key) for info in staged.store.list(staging_prefix(staged.ref))}
    finalize_step(staged.store, staged.keys, PlainStoreJanitor(), RecordingPublisher(), staged.ref)
    manifest_raw = staged.store.get(manifest_key(staged.ref))
    sealed = open_manifest(manifest_raw, "manifest")
    key = staged.keys.unwrap(sealed.manifest.key)
    summary = open_summary(staged.store.get(summary_key(staged.ref)), "summary").authenticate(key)
    assert summary == BackupSummary.of(sealed.manifest) and summary.engine == "stepfunctions"
    markers = [parse_log_marker(info.key) for info in staged.store.list(CATALOG_LOG)]
    assert [(m[1], m[2]) for m in markers if m] == [(staged.ref, "published")]

    # Finalize died after publishing, before removing staging, and the summary is missing (or the
    # manifest was published by a Braid without a catalog): the retried Finalize writes it again.
    for key_name, data in staging.items():
        staged.store.put(key_name, data)
    staged.store.delete([summary_key(staged.ref)])
    finalize_step(staged.store, staged.keys, PlainStoreJanitor(), RecordingPublisher(), staged.ref)
    assert open_summary(staged.store.get(summary_key(staged.ref)), "summary").authenticate(key) == summary
    assert staged.store.get(manifest_key(staged.ref)) == manifest_raw  # the manifest itself is never rewritten
    repository = Repository.open(staged.store)
    assert list(read_catalog(repository).entries) == [summary]


def test_the_scheduled_prune_rebuilds_the_snapshot_at_its_end(repo: Path, tmp_path: Path) -> None:
    old, new = backup(repo, "db", b"a" * 5000), backup(repo, "db", b"b" * 5000)
    repository = open_repository(str(repo))
    read_catalog(repository)  # a snapshot holding both
    stale = BackupRef.parse(backup(repo, "db", b"c" * 5000))
    repository.store.delete([manifest_key(stale)])  # round Braid: no removal marker

    run = maintain(repository, key_file(tmp_path), RecordingPublisher(), {"keep_last": 1})
    assert run.pruned == [old] and run.catalog["snapshot"] is not None

    (newest,) = [info.key for info in repository.store.list(CATALOG_INDEX)][-1:]
    snapshot = open_snapshot(repository.store.get(newest), newest)
    assert [s.backup for s in snapshot.backups] == [new] and old != new
    assert [e.backup for e in read_catalog(repository, write=False).entries if isinstance(e, BackupSummary)] == [new]
