"""Scheduled maintenance (the EventBridge job that starts the prune run) on a real repository.

The prune run's three steps run in-process here (support.prune_inline);
tests/cloud/test_prune_cloud.py runs them as the synthesized state machine.
The planner distrusts what a verify found bad (the record it left beside
the backup, braid.ops.verification).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from braid.adapters.local.keys import LocalKeyFile
from braid.cli.compose import open_repository
from braid.contract import VERIFY_FAILED
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.format.repository import Repository
from braid.ops.retention import RetentionPolicy
from braid.pipeline.maintenance import policy_from_event, run_maintenance
from braid.pipeline.prune_tally import PruneReport
from braid.ports.pipeline import RecordingPublisher
from conftest import run_braid
from support.event_docs import documented_events
from support.prune_inline import InlinePruneRuns


def maintain(
    repository: Repository, keys: LocalKeyFile, events: RecordingPublisher, rules: dict[str, object], now: datetime | None = None
) -> PruneReport:
    """The scheduled job as the schedule runs it: it starts the prune run, which runs to its end."""
    runs = InlinePruneRuns(repository, keys, events, now=now)
    report = run_maintenance(runs, prune_input=rules, now=now)
    assert report.prune_run is not None and report.prune_run.startswith("inline:prune-")
    (pruned,) = runs.reports
    return pruned


def backup(repo: Path, name: str, data: bytes) -> str:
    result = run_braid("backup", "--repo", str(repo), "--name", name, "--chunk-size", "4KiB", stdin=data)
    assert result.code == 0, result.stderr
    return result.out.strip()


def key_file(tmp_path: Path) -> LocalKeyFile:
    (path,) = (tmp_path / "xdg-config" / "braid" / "keys").glob("*.key")
    return LocalKeyFile.open(path)


def corrupt_and_verify(repo: Path, latest: str) -> None:
    """Damage chunk 0, then verify: the verify finds it and records the failure beside the backup."""
    ref = BackupRef.parse(latest)
    chunk = repo / "data" / ref.name / ref.id / "0000000000"
    raw = bytearray(chunk.read_bytes())
    raw[-1] ^= 1
    chunk.write_bytes(bytes(raw))
    assert run_braid("verify", "--repo", str(repo), latest, "--deep").code == 6


def test_applies_retention_and_collects_leftovers(repo: Path, tmp_path: Path) -> None:
    old = backup(repo, "db", b"a" * 9000)
    new = backup(repo, "db", b"b" * 9000)
    logs = backup(repo, "logs", b"l" * 100)
    repository = open_repository(str(repo))
    orphan = BackupRef("db", "20200101T000000.000Z-0badc0de")
    repository.store.put(f"data/db/{orphan.id}/0000000000", b"never finished")
    os.utime(repo / "data" / "db" / orphan.id / "0000000000", (0, datetime(2020, 1, 2, tzinfo=UTC).timestamp()))  # idle since 2020
    events = RecordingPublisher()

    run = maintain(repository, key_file(tmp_path), events, {"keep_last": 1})

    assert run.ok and run.pruned == [old] and run.collected == [str(orphan)] and run.unreadable == []
    assert sorted(str(r) for r in repository.backups()) == sorted([new, logs])
    assert list(repository.store.list(f"data/db/{orphan.id}/")) == []
    assert events.events == []


def test_a_backup_whose_verification_failed_is_distrusted_and_kept(repo: Path, tmp_path: Path) -> None:
    latest = backup(repo, "db", b"rows " * 3000)
    corrupt_and_verify(repo, latest)
    events = RecordingPublisher()

    run = maintain(open_repository(str(repo)), key_file(tmp_path), events, {"keep_days": 30})

    assert not run.ok
    (unreadable,) = run.unreadable
    assert unreadable["backup"] == latest and f"chunk 0 of backup {latest}" in unreadable["error"]
    assert events.events == []  # the verify that found it reported it; the prune does not announce it again
    assert run.pruned == []  # keep_days keeps it: a corrupt backup is reported, not silently dropped


def test_policy_from_the_schedule_event() -> None:
    policy = policy_from_event({"keep_last": 7, "keep_days": 35, "orphan_grace_hours": 12})
    assert policy == RetentionPolicy.of(keep_last=7, keep_days=35.0, orphan_grace_hours=12.0)
    # No rule in the event (the stack's default): the policies stored in the repository, none by default.
    assert policy_from_event({"sample_percent": 10}) == RetentionPolicy.of(stored=True)
    with pytest.raises(UsageError, match="--keep-daily must be at least 1"):
        policy_from_event({"keep_daily": 0})


def test_without_a_configured_policy_no_backup_is_removed(repo: Path, tmp_path: Path) -> None:
    old = backup(repo, "db", b"a" * 100)
    new = backup(repo, "db", b"b" * 100)
    repository = open_repository(str(repo))
    run = maintain(repository, key_file(tmp_path), RecordingPublisher(), {})
    assert run.ok and run.pruned == [] and sorted(str(r) for r in repository.backups()) == sorted([old, new])

    assert run_braid("prune", "--repo", str(repo), "--name", "db", "--keep-last", "1", "--save-policy").code == 0
    run = maintain(repository, key_file(tmp_path), RecordingPublisher(), {})
    assert run.pruned == [old] and [str(r) for r in repository.backups()] == [new]


def test_young_leftovers_are_left_alone(repo: Path, tmp_path: Path) -> None:
    repository = open_repository(str(repo))
    in_flight = BackupRef.new("db")
    repository.store.put(f"staging/db/{in_flight.id}/session.json", b"{}")
    run = maintain(repository, key_file(tmp_path), RecordingPublisher(), {"keep_last": 1}, now=datetime.now(UTC) + timedelta(hours=1))
    assert run.collected == [] and [i.key for i in repository.store.list("staging/")] == [f"staging/db/{in_flight.id}/session.json"]


def test_corrupt_latest_never_pushes_out_the_older_good_one(repo: Path, tmp_path: Path) -> None:
    good = backup(repo, "db", b"good " * 3000)
    latest = backup(repo, "db", b"rows " * 3000)
    corrupt_and_verify(repo, latest)
    events = RecordingPublisher()

    run = maintain(open_repository(str(repo)), key_file(tmp_path), events, {"keep_last": 1})

    assert not run.ok and run.pruned == []  # keep_last=1 counts only the good one: it stays
    (unreadable,) = run.unreadable
    assert unreadable["backup"] == latest and f"backup {latest} failed its deep verification of " in unreadable["error"]
    assert f"chunk 0 of backup {latest}" in unreadable["error"]
    assert sorted(str(r) for r in open_repository(str(repo)).backups()) == sorted([good, latest])
    assert events.events == []  # announced by the verify that found it
    assert run.to_json()["unreadable"] == run.unreadable
    assert run_braid("restore", "--repo", str(repo), good).stdout == b"good " * 3000


def test_unreadable_older_manifest_is_kept_reported_and_announced(repo: Path, tmp_path: Path) -> None:
    oldest = backup(repo, "db", b"0" * 5000)
    broken = backup(repo, "db", b"1" * 5000)
    newest = backup(repo, "db", b"2" * 5000)
    ref = BackupRef.parse(broken)
    manifest = repo / "manifests" / ref.name / f"{ref.id}.json"
    manifest.write_bytes(manifest.read_bytes()[:100])
    events = RecordingPublisher()

    run = maintain(open_repository(str(repo)), key_file(tmp_path), events, {"keep_last": 1})

    assert newest not in [u["backup"] for u in run.unreadable]
    assert run.pruned == [oldest] and [u["backup"] for u in run.unreadable] == [broken] and not run.ok
    assert "corrupt" in run.unreadable[0]["error"]
    assert sorted(str(r) for r in open_repository(str(repo)).backups()) == sorted([broken, newest])
    assert [(kind, body["backup"]) for kind, body in events.events] == [(VERIFY_FAILED, broken)]
    assert set(events.events[0][1]) == documented_events()[VERIFY_FAILED]  # docs/cloud.md's ### Events table


def test_leftovers_age_from_their_last_activity(repo: Path, tmp_path: Path) -> None:
    repository = open_repository(str(repo))
    stalled = BackupRef("db", "20200101T000000.000Z-0badc0de")  # an old id that wrote a chunk recently
    repository.store.put(f"data/db/{stalled.id}/0000000000", b"still going")
    run = maintain(repository, key_file(tmp_path), RecordingPublisher(), {"keep_last": 1})
    assert run.collected == [] and list(repository.store.list(f"data/db/{stalled.id}/")) != []
    later = datetime.now(UTC) + timedelta(hours=49)
    run = maintain(repository, key_file(tmp_path), RecordingPublisher(), {"keep_last": 1}, now=later)
    assert run.collected == [str(stalled)] and list(repository.store.list(f"data/db/{stalled.id}/")) == []


def test_a_bad_policy_stops_maintenance_before_anything_runs(repo: Path, tmp_path: Path) -> None:
    backup(repo, "db", b"a" * 100)
    repository = open_repository(str(repo))
    runs = InlinePruneRuns(repository, key_file(tmp_path), RecordingPublisher())
    with pytest.raises(UsageError, match="--keep-daily must be at least 1"):
        run_maintenance(runs, prune_input={"keep_daily": 0})
    assert runs.reports == []


def test_the_maintenance_measures_the_oldest_staged_backup(repo: Path, tmp_path: Path) -> None:
    """From the staging prefixes alone: the stack alarms when a backup has been staged for more than a day."""
    repository = open_repository(str(repo))
    now = datetime(2026, 11, 23, 12, tzinfo=UTC)
    runs = InlinePruneRuns(repository, key_file(tmp_path), RecordingPublisher(), now=now)
    report = run_maintenance(runs, prune_input={}, store=repository.store, now=now)
    assert (report.oldest_staging, report.oldest_staging_hours) == (None, 0.0)

    stuck = BackupRef("db", "20261122T060000.000Z-0badc0de")  # 30 hours before `now`
    recent = BackupRef("db", "20261123T100000.000Z-1badc0de")
    other = BackupRef("logs", "20261123T110000.000Z-2badc0de")
    for ref in (stuck, recent, other):
        repository.store.put(f"staging/{ref.name}/{ref.id}/session.json", b"{}")

    report = run_maintenance(runs, prune_input={}, store=repository.store, now=now)

    assert report.oldest_staging == str(stuck) and report.oldest_staging_hours == 30.0
    assert report.to_json()["oldest_staging_hours"] == 30.0 and report.prune_run is not None
