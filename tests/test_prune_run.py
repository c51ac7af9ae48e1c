"""The scheduled prune run's steps (PlanPrune, Sweep, TallyPrune) on a real local repository.

Run in one process by support.prune_inline: what they decide and in which
order. tests/cloud/test_prune_cloud.py runs the same steps as the
synthesized state machine on the emulated cloud.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from braid.cli.compose import open_key_service, open_repository
from braid.contract import PRUNE_FAILED, VERIFY_FAILED
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.format.layout import CATALOG_INDEX, CATALOG_LOG, PRUNE, chunk_key, data_prefix, manifest_key, prune_report_key, summary_key
from braid.format.repository import Repository
from braid.format.summary import catalog_stamp
from braid.ops.catalog import read_catalog
from braid.ops.retention import RetentionPolicy, plan_prune
from braid.pipeline.prune_plan import BACKUP, SweepItem, slice_chunks_from_event, slices
from braid.ports.pipeline import RecordingPublisher
from braid.ports.store import ObjectInfo, ObjectStore
from conftest import run_braid
from support.event_docs import documented_events
from support.prune_inline import InlinePruneRuns
from support.synthetic_backup import write_backup
from test_retention_rules import at, backup_at, listed


def backup_with_chunks(repo: Path, name: str, when: datetime, chunks: int) -> BackupRef:
    """A real, complete backup of `chunks` small chunks whose id says it started at `when`."""
    repository = open_repository(str(repo))
    return write_backup(repository, open_key_service(repository, None), name, when, chunks)


class Counting:
    """A repository's store that records every LIST prefix and every GET (the planner must not list chunks)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.listed: list[str] = []
        self.got: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.listed.append(prefix)
        return self.inner.list(prefix)

    def get(self, key: str) -> bytes:
        self.got.append(key)
        return self.inner.get(key)

    def delete(self, keys: Iterable[str]) -> None:
        self.inner.delete(keys)


def runner(repo: Path, events: RecordingPublisher | None = None, *, now: datetime | None = None, counting: bool = False) -> InlinePruneRuns:
    repository = open_repository(str(repo))
    if counting:
        repository = Repository(Counting(repository.store), repository.config)  # type: ignore[arg-type]
    return InlinePruneRuns(repository, open_key_service(repository, None), events or RecordingPublisher(), now=now)


def run_id(n: int = 0) -> str:
    return f"prune-test-{n}"


@pytest.fixture
def calendar(repo: Path) -> dict[str, list[str]]:
    """pg: two backups a day for 10 days in May 2024; logs: three in 2023."""
    pg = [backup_at(repo, "pg", at("2024-05-01T02:00") + timedelta(days=d, hours=h)) for d in range(10) for h in (0, 12)]
    logs = [backup_at(repo, "logs", at(f"2023-0{m}-01T00:00")) for m in (1, 2, 3)]
    return {"pg": pg, "logs": logs}


def test_keeps_exactly_what_the_host_prune_keeps(repo: Path, calendar: dict[str, list[str]]) -> None:
    rules = {"keep_daily": 3, "keep_monthly": 1}
    repository = open_repository(str(repo))
    host = plan_prune(repository, RetentionPolicy.of(**rules), open_key_service(repository, None))  # every manifest read
    runs = runner(repo)

    runs.start(run_id(), rules)

    (report,) = runs.reports
    assert report.ok and report.pruned == [str(r) for r in host.forget]
    assert sorted(set(calendar["pg"]) - set(report.pruned)) == sorted(calendar["pg"][-5::2])  # restic: newest of each of 3 days
    assert listed(repo) == sorted(calendar["pg"][-5::2] + calendar["logs"])
    assert all(not list(repository.store.list(data_prefix(BackupRef.parse(r)))) for r in report.pruned)
    assert run_braid("verify", "--repo", str(repo), "--all", "--deep").code == 0
    # The run's report stays; its working files go.
    assert json.loads(repository.store.get(prune_report_key(run_id())))["pruned"] == report.pruned
    assert [info.key for info in repository.store.list(PRUNE)] == [prune_report_key(run_id())]


def test_reads_only_the_manifests_it_judges_and_lists_no_chunks(repo: Path, calendar: dict[str, list[str]]) -> None:
    assert run_braid("prune", "--repo", str(repo), "--name", "pg", "--keep-last", "2", "--save-policy").code == 0
    read_catalog(open_repository(str(repo)))  # a snapshot, as the previous run leaves one
    runs = runner(repo, counting=True)
    store = runs.repository.store
    assert isinstance(store, Counting)

    planned: dict[str, list[str]] = {}
    runs.before_sweep = lambda: planned.update(got=list(store.got), listed=list(store.listed))

    runs.start(run_id(), {})  # no rule: stored policies; logs has none and is left alone

    (report,) = runs.reports
    assert sorted(report.pruned) == sorted(calendar["pg"][:-2])
    # PlanPrune authenticated every pg backup (each kept or removed) and not one of logs, which it leaves alone.
    manifests = {k for k in planned["got"] if k.startswith("manifests/")}
    assert manifests == {manifest_key(BackupRef.parse(r)) for r in calendar["pg"]}
    # Leftovers were looked for by prefixes: data/ and staging/ themselves were never listed, nor any kept backup's chunks.
    assert not {"data/", "staging/", "data/pg/", "data/logs/"} & set(planned["listed"])
    assert not [p for p in planned["listed"] if p.startswith("data/")]


def test_an_unreadable_newest_backup_is_reported_never_counted_never_removed(repo: Path) -> None:
    good = backup_at(repo, "db", at("2024-05-01T02:00"))
    broken = backup_at(repo, "db", at("2024-05-02T02:00"))
    path = repo / "manifests" / "db" / f"{BackupRef.parse(broken).id}.json"
    path.write_bytes(path.read_bytes()[:120])
    events = RecordingPublisher()
    runs = runner(repo, events)

    runs.start(run_id(), {"keep_last": 1})

    (report,) = runs.reports
    assert report.pruned == [] and [u["backup"] for u in report.unreadable] == [broken] and not report.ok
    assert (repo / "manifests" / "db" / f"{BackupRef.parse(good).id}.json").exists() and path.exists()
    assert [(kind, body["backup"]) for kind, body in events.events] == [(VERIFY_FAILED, broken)]


def test_a_distrusted_backup_counts_towards_no_rule(repo: Path) -> None:
    good = backup_at(repo, "db", at("2024-05-01T02:00"))
    bad = backup_at(repo, "db", at("2024-05-02T02:00"))
    events = RecordingPublisher()
    runs = runner(repo, events)
    runs.start(run_id(), {"keep_last": 1, "distrusted": {bad: f"backup {bad} failed verification: chunk 0 corrupt"}})
    (report,) = runs.reports
    assert report.pruned == [] and report.unreadable == [{"backup": bad, "error": f"backup {bad} failed verification: chunk 0 corrupt"}]
    assert sorted(listed(repo)) == sorted([good, bad])
    assert events.events == []  # whoever verified it announced it


def test_a_big_backup_is_split_and_its_manifest_goes_before_any_chunk(repo: Path) -> None:
    big = backup_with_chunks(repo, "db", at("2024-05-01T02:00"), 10)
    keep = backup_with_chunks(repo, "db", at("2024-05-02T02:00"), 1)
    runs = runner(repo)
    seen: dict[str, Any] = {}

    def between_plan_and_sweep() -> None:
        store = runs.repository.store
        seen["manifest"] = store.head(manifest_key(big))
        seen["summary"] = store.head(summary_key(big))
        seen["chunks"] = len(list(store.list(data_prefix(big))))
        seen["listed"] = listed(repo)

    runs.before_sweep = between_plan_and_sweep
    runs.start(run_id(), {"keep_last": 1, "slice_chunks": 3})

    assert seen == {"manifest": None, "summary": None, "chunks": 10, "listed": [str(keep)]}
    items = [r for r in runs.results if r.kind == BACKUP]
    assert [(r.backup, r.outcome, r.objects) for r in items] == [(str(big), "deleted", n) for n in (3, 3, 3, 1)]
    assert list(runs.repository.store.list(data_prefix(big))) == []
    assert runs.reports[0].ok and runs.reports[0].objects_deleted == 10


def test_slices_cover_every_key_once() -> None:
    ref = BackupRef.new("db")
    assert slices(ref, 0, 3) == [("", "")]
    assert slices(ref, 3, 3) == [("", "")]
    assert slices(ref, 7, 3) == [("", chunk_key(ref, 2)), (chunk_key(ref, 2), chunk_key(ref, 5)), (chunk_key(ref, 5), "")]
    assert len(slices(ref, 163_840, 16_384)) == 10  # 10 TiB at 64 MiB chunks: ten items
    for bad in (0, -1, 16_385, "3", 2.5):
        with pytest.raises(UsageError, match="slice_chunks"):
            slice_chunks_from_event({"slice_chunks": bad})
    with pytest.raises(UsageError, match="unknown kind"):
        SweepItem.from_json({"n": 0, "kind": "everything", "backup": str(ref)})


def test_a_failed_item_leaves_manifestless_data_to_the_next_run_and_says_so(repo: Path) -> None:
    big = backup_with_chunks(repo, "db", at("2024-05-01T02:00"), 5)
    backup_with_chunks(repo, "db", at("2024-05-02T02:00"), 1)
    events = RecordingPublisher()
    runs = runner(repo, events)
    runs.fail = lambda item: item.n == 1  # the second slice's child fails after its retries: no result record

    runs.start(run_id(), {"keep_last": 1, "slice_chunks": 2})

    (report,) = runs.reports
    assert not report.ok and report.pruned == [str(big)] and report.incomplete == [str(big)] and report.failed_items == 1
    left = [info.key for info in runs.repository.store.list(data_prefix(big))]
    assert left == [chunk_key(big, 2), chunk_key(big, 3)]
    assert runs.repository.store.head(manifest_key(big)) is None and str(big) not in listed(repo)
    ((kind, detail),) = events.events
    assert kind == PRUNE_FAILED and detail["run"] == run_id() and detail["failed_items"] == 1
    assert f"{big}: its data could not be deleted" in detail["failures"][0]
    assert set(detail) == documented_events()[PRUNE_FAILED]  # docs/cloud.md's ### Events table

    # The next run finds the rest as a leftover (no manifest), and collects it once idle past the grace.
    later = runner(repo, now=datetime.now(UTC) + timedelta(hours=49))
    later.start(run_id(1), {"keep_last": 1})
    assert later.reports[0].collected == [str(big)] and list(later.repository.store.list(data_prefix(big))) == []


def test_a_backup_publishing_during_the_prune_is_never_touched(repo: Path) -> None:
    backup_at(repo, "db", at("2024-05-01T02:00"))
    repository = open_repository(str(repo))
    running = BackupRef.new("db")  # started now: writing chunks, no manifest yet
    repository.store.put(chunk_key(running, 0), b"in flight")
    stalled = BackupRef("db", "20200101T000000.000Z-0badc0de")  # idle since 2020, as far as the plan can tell
    repository.store.put(chunk_key(stalled, 0), b"old")
    old = datetime(2020, 1, 2, tzinfo=UTC).timestamp()
    os.utime(repo / "data" / "db" / stalled.id / "0000000000", (old, old))
    runs = runner(repo)
    runs.before_sweep = lambda: repository.store.put(manifest_key(stalled), b"{}")  # it publishes after the plan

    runs.start(run_id(), {"keep_last": 1})

    (report,) = runs.reports
    assert report.spared == [str(stalled)] and report.collected == []  # looked at again just before deletion
    assert [i.key for i in repository.store.list(data_prefix(stalled))] == [chunk_key(stalled, 0)]
    assert [i.key for i in repository.store.list(data_prefix(running))] == [chunk_key(running, 0)]  # never a candidate


def test_catalog_leftovers_are_collected_and_list_stays_right(repo: Path) -> None:
    refs = [backup_at(repo, "db", at("2024-05-01T02:00") + timedelta(days=d)) for d in range(3)]
    repository = open_repository(str(repo))
    store = repository.store
    for _ in range(4):
        read_catalog(repository, rebuild=True)  # four snapshots, as four daily runs wrote them
    for days in (40, 10, 3):  # log days a snapshot has long folded in
        stamp = catalog_stamp(datetime.now(UTC) - timedelta(days=days))
        store.put(f"{CATALOG_LOG}{stamp[:8]}/{stamp}~{refs[0]}~published", b"")
    before = listed(repo)

    runs = runner(repo)
    runs.start(run_id(), {"keep_last": 10})

    snapshots = [info.key for info in store.list(CATALOG_INDEX)]
    assert len(snapshots) == 2  # the newest, and the one a concurrent reader may still be reading
    days = sorted({info.key.split("/")[2] for info in store.list(CATALOG_LOG)})
    cutoff = catalog_stamp(datetime.now(UTC) - timedelta(days=2))[:8]
    assert days and all(day >= cutoff for day in days)
    assert len(runs.reports[0].catalog["log_days"]) == 3 and runs.reports[0].catalog["snapshot"] in snapshots
    assert listed(repo) == before == sorted(refs)
    assert sorted(e.backup for e in read_catalog(repository, write=False).entries) == sorted(refs)  # type: ignore[union-attr]


def test_the_hosts_prune_collects_catalog_leftovers_too(repo: Path) -> None:
    refs = [backup_at(repo, "db", at("2024-05-01T02:00") + timedelta(days=d)) for d in range(2)]
    repository = open_repository(str(repo))
    for _ in range(3):
        read_catalog(repository, rebuild=True)
    stamp = catalog_stamp(datetime.now(UTC) - timedelta(days=20))
    old_day = f"{CATALOG_LOG}{stamp[:8]}/"
    repository.store.put(f"{old_day}{stamp}~{refs[0]}~published", b"")

    named = run_braid("prune", "--repo", str(repo), "--name", "db", "--keep-last", "5", "--json")  # one name's prune leaves the catalog alone
    assert named.code == 0, named.stderr
    assert json.loads(named.out)["catalog"] == {"snapshots": [], "log_days": []} and list(repository.store.list(old_day))
    dry = run_braid("prune", "--repo", str(repo), "--keep-last", "5", "--dry-run", "--json")
    assert dry.code == 0 and json.loads(dry.out)["catalog"]["log_days"] == [old_day] and list(repository.store.list(old_day))

    done = run_braid("prune", "--repo", str(repo), "--keep-last", "5", "--json")

    assert done.code == 0, done.stderr
    assert json.loads(done.out)["catalog"]["log_days"] == [old_day] and list(repository.store.list(old_day)) == []
    assert len(list(repository.store.list(CATALOG_INDEX))) <= 2
    assert listed(repo) == sorted(refs)
