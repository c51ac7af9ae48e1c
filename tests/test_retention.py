"""Retention: keep rules per name, manifest first, orphans only after a grace period."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from braid.adapters.local.store import LocalStore
from braid.cli.compose import open_key_service, open_repository
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.ops.retention import RetentionPolicy, execute_prune, plan_prune
from conftest import run_braid


def backup(repo: Path, name: str, data: bytes) -> str:
    result = run_braid("backup", "--repo", str(repo), "--name", name, "--chunk-size", "4KiB", stdin=data)
    assert result.code == 0, result.stderr
    return result.out.strip()


def test_keep_last_per_name_and_data_removed(repo: Path) -> None:
    db = [backup(repo, "db", b"%d" % i * 9000) for i in range(3)]
    logs = backup(repo, "logs", b"l" * 10)
    result = run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--json")
    assert result.code == 0, result.stderr
    report = json.loads(result.out)
    assert sorted(report["forget"]) == sorted(db[:2]) and sorted(report["keep"]) == sorted([db[2], logs])
    listing = [row["backup"] for row in json.loads(run_braid("list", "--repo", str(repo), "--json").out)]
    assert sorted(listing) == sorted([db[2], logs])
    for gone in db[:2]:
        ref = BackupRef.parse(gone)
        assert not (repo / "data" / ref.name / ref.id).exists()
    assert run_braid("verify", "--repo", str(repo), "--all", "--deep").code == 0


def test_dry_run_removes_nothing(repo: Path) -> None:
    first = backup(repo, "db", b"a")
    backup(repo, "db", b"b")
    result = run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--dry-run")
    assert result.code == 0 and f"would remove {first}" in result.out
    assert len(json.loads(run_braid("list", "--repo", str(repo), "--json").out)) == 2


def test_keep_days_keeps_recent_and_orphans_wait_for_grace(repo: Path) -> None:
    older = backup(repo, "db", b"a" * 5000)
    kept = backup(repo, "db", b"b" * 5000)
    repository = open_repository(str(repo))
    keys = open_key_service(repository, None, unwrap_only=True)
    store = repository.store
    assert isinstance(store, LocalStore)
    old_orphan = BackupRef("db", "20200101T000000.000Z-0badc0de")
    young_orphan = BackupRef.new("db")
    for ref in (old_orphan, young_orphan):
        store.put(f"data/{ref.name}/{ref.id}/0000000000", b"partial")
    # Leftovers age from their last activity (here: when the file was last written), not from the id.
    os.utime(repo / "data" / "db" / old_orphan.id / "0000000000", (0, datetime(2020, 1, 2, tzinfo=UTC).timestamp()))
    plan = plan_prune(repository, RetentionPolicy.of(keep_days=7), keys)
    assert [str(r) for r in plan.keep] == sorted([older, kept])
    assert plan.forget == [] and plan.orphans == [old_orphan]
    execute_prune(repository, plan)
    assert [i.key for i in store.list("data/")] == sorted(
        [i.key for ref in (older, kept) for i in store.list(f"data/db/{BackupRef.parse(ref).id}/")] + [f"data/db/{young_orphan.id}/0000000000"]
    )
    later = plan_prune(repository, RetentionPolicy.of(keep_days=7), keys, now=datetime.now(UTC) + timedelta(days=30))
    # Past keep_days both would go, but a policy never removes the newest good backup of a name.
    assert [str(r) for r in later.forget] == [older] and [str(r) for r in later.keep] == [kept]
    assert later.orphans == [young_orphan]


def test_policy_needs_a_rule() -> None:
    with pytest.raises(UsageError, match="needs --keep-last"):
        RetentionPolicy.of()
    with pytest.raises(UsageError, match="not both"):
        RetentionPolicy.of(keep_last=1, stored=True)
    # On the command line no --keep-* rule means each name's stored policy (tests/test_retention_rules.py).
