"""The scheduled prune's WAL retention, its steps in one process (support.prune_inline): the planner removes, after the
manifests, exactly the WAL the host's `braid prune` would; the plan, the state and the run's report say what went; a
deletion that fails is reported (Prune Failed) and left for the next run. The host's prune says the same failure in one
line (exit 7). The state machine itself: tests/cloud/test_wal_prune_cloud.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from braid.cli.compose import open_key_service, open_repository
from braid.contract import PRUNE_FAILED
from braid.format.layout import prune_report_key, wal_key
from braid.format.repository import Repository
from braid.format.wal import WalFile
from braid.ops.retention import RetentionPolicy, plan_prune
from braid.ops.wal_retention import plans_for_prune
from braid.ports.pipeline import RecordingPublisher
from conftest import ROOT, run_braid
from support.event_docs import documented_events
from support.faulty_store import FaultRule, FaultyStore
from support.prune_inline import InlinePruneRuns
from test_wal_retention import base_backup, push, seg


def archive_with_backups(repo: Path, tmp_path: Path) -> tuple[str, str]:
    """Segments 1..6 of timeline 1, the history file of timeline 2, and two backups starting in segments 2 and 4."""
    push(repo, tmp_path, *(seg(1, n) for n in range(1, 7)))
    push(repo, tmp_path, "00000002.history", data=b"1\t0/700000\tno recovery target specified\n")
    return base_backup(repo, 1, 2), base_backup(repo, 1, 4)


def archived(repo: Path) -> list[str]:
    return sorted(p.name for p in (repo / "wal" / "pg").rglob("0*") if p.is_file())


def test_the_scheduled_prune_removes_the_wal_the_hosts_prune_would_and_reports_it(repo: Path, tmp_path: Path) -> None:
    old, new = archive_with_backups(repo, tmp_path)
    repository = open_repository(str(repo))
    keys = open_key_service(repository, None)
    host = plans_for_prune(repository, plan_prune(repository, RetentionPolicy.of(keep_last=1), keys))
    assert [p.files() for p in host] == [[seg(1, n) for n in (1, 2, 3)]]
    events = RecordingPublisher()
    runs = InlinePruneRuns(repository, keys, events)

    runs.start("prune-wal-0", {"keep_last": 1})

    (state,) = runs.states
    assert state["pruned"] == 1 and state["wal"] == [
        {"name": "pg", "files": 3, "first": seg(1, 1), "last": seg(1, 3), "kept_for_lock": 0, "locked_objects": 0, "reason": None, "error": None}
    ]
    (report,) = runs.reports
    assert report.ok and report.pruned == [old] and events.events == []
    assert report.wal == [host[0].to_json()] == [{"name": "pg", "files": [seg(1, n) for n in (1, 2, 3)],
                                                  "kept_from": [{"backup": new, "timeline": 1, "segno": 4}]}]
    assert json.loads(repository.store.get(prune_report_key("prune-wal-0")))["wal"] == report.wal
    assert archived(repo) == sorted(["00000002.history", *(seg(1, n) for n in (4, 5, 6))])  # a history file is never removed
    again = run_braid("verify", "--repo", str(repo), "--wal", "--name", "pg")
    assert again.code == 0 and "continuous" in again.out, again.out


def test_a_failed_wal_deletion_is_reported_as_a_failed_prune_and_left_for_the_next_run(repo: Path, tmp_path: Path) -> None:
    old, _new = archive_with_backups(repo, tmp_path)
    opened = open_repository(str(repo))
    faulty = Repository(FaultyStore(opened.store, [FaultRule("delete", 1.0, "fail", "wal/")]), opened.config)  # type: ignore[arg-type]
    events = RecordingPublisher()
    runs = InlinePruneRuns(faulty, open_key_service(opened, None), events)

    runs.start("prune-wal-1", {"keep_last": 1})

    (report,) = runs.reports
    assert not report.ok and report.pruned == [old] and report.failed_items == 0  # the backup itself went, manifest and chunks
    ((failed,),) = [[a for a in report.wal if a.get("error")]]
    assert failed["files"] == [seg(1, n) for n in (1, 2, 3)] and "injected fault: delete of wal/pg/" in failed["error"]
    assert runs.states[0]["wal"][0]["error"] == failed["error"]
    ((kind, detail),) = events.events
    assert kind == PRUNE_FAILED and set(detail) == documented_events()[PRUNE_FAILED]
    assert detail["failures"] == [f"WAL of pg: not removed ({failed['error']}); the next prune tries again"]
    assert archived(repo) == sorted(["00000002.history", *(seg(1, n) for n in range(1, 7))])

    later = InlinePruneRuns(opened, open_key_service(opened, None), RecordingPublisher())
    later.start("prune-wal-2", {"keep_last": 1})
    assert later.reports[0].ok and later.reports[0].wal[0]["files"] == [seg(1, n) for n in (1, 2, 3)]
    assert archived(repo) == sorted(["00000002.history", *(seg(1, n) for n in (4, 5, 6))])


def test_the_hosts_prune_says_a_failed_wal_deletion_in_one_line_and_exits_7(repo: Path, tmp_path: Path) -> None:
    old, _new = archive_with_backups(repo, tmp_path)
    command = [sys.executable, str(ROOT / "tests" / "support" / "faulty_store.py"), "--fault", "delete=1:fail:wal/", "--",
               "prune", "--repo", str(repo), "--keep-last", "1"]
    done = subprocess.run(command, capture_output=True, timeout=120)
    stderr = done.stderr.decode()
    assert done.returncode == 7, stderr
    first = wal_key("pg", WalFile.parse(seg(1, 1)))
    (error,) = [line for line in stderr.splitlines() if line.startswith("braid: error:")]
    assert error == (
        f"braid: error: the WAL of 1 name(s) could not be removed; first: pg: injected fault: delete of {first} in {repo} failed"
        " (the backups' prune is done; the next prune removes that WAL)"
    )
    assert f"FAILED to remove 3 WAL file(s) of pg, {seg(1, 1)} .. {seg(1, 3)}" in done.stdout.decode()
    assert old not in run_braid("list", "--repo", str(repo)).out and len(archived(repo)) == 7
    retried = run_braid("prune", "--repo", str(repo), "--keep-last", "1")
    assert retried.code == 0 and f"removed 3 WAL file(s) of pg, {seg(1, 1)} .. {seg(1, 3)}" in retried.out, retried.out
