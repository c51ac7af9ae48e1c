"""Concurrent backups share one worker budget (braid.pipeline.account_budget): each map runs its backup's share."""

from __future__ import annotations

from pathlib import Path

from braid.adapters.local.store import LocalStore
from braid.format.ids import BackupRef
from braid.format.staging.keys import RUNNING, parse_running_key, running_key, running_prefix
from braid.pipeline.account_budget import REFRESH_SECONDS, REGISTRATION_SECONDS, release, share

NOW = 1_800_000_000.0


def _keys(store: LocalStore) -> list[str]:
    return sorted(info.key for info in store.list(RUNNING))


def test_three_backups_planning_together_each_run_a_third_of_the_budget_and_one_done_returns_its_share(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a, b, c = (BackupRef.new(name) for name in ("alpha", "beta", "gamma"))
    assert share(store, a, budget=500, requested=500, now=NOW) == 500  # alone: the whole budget
    assert share(store, b, budget=500, requested=500, now=NOW + 1) == 250
    assert share(store, c, budget=500, requested=500, now=NOW + 2) == 166
    assert share(store, a, budget=500, requested=500, now=NOW + 3) == 166  # a's next round sees the other two
    assert share(store, a, budget=500, requested=100, now=NOW + 4) == 100  # never more than its --fan-out
    release(store, c)
    assert not list(store.list(running_prefix(c)))
    assert share(store, a, budget=500, requested=500, now=NOW + 5) == 250
    assert share(store, a, budget=1, requested=500, now=NOW + 6) == 1  # at least one worker each


def test_a_registration_is_renewed_once_a_minute_and_one_not_renewed_stops_counting_and_is_removed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a, gone = BackupRef.new("alpha"), BackupRef.new("gone")
    share(store, gone, budget=500, requested=500, now=NOW)
    share(store, a, budget=500, requested=500, now=NOW)
    share(store, a, budget=500, requested=500, now=NOW + REFRESH_SECONDS - 1)  # fresh enough: no new PUT
    assert _keys(store) == sorted([running_key(a, int(NOW)), running_key(gone, int(NOW))])
    assert share(store, a, budget=500, requested=500, now=NOW + REFRESH_SECONDS) == 250
    assert _keys(store) == sorted([running_key(a, int(NOW) + REFRESH_SECONDS), running_key(gone, int(NOW))])  # renewed, old one gone
    later = NOW + REGISTRATION_SECONDS
    assert share(store, a, budget=500, requested=500, now=later) == 500  # `gone` failed without releasing: no longer counted
    assert _keys(store) == [running_key(a, int(later))]  # and removed


def test_registrations_live_beside_every_backups_staging_and_parse_back() -> None:
    ref = BackupRef.parse("db1@20261128T120000.000Z-1a2b3c4d")
    key = running_key(ref, 1_800_000_123)
    assert key == "staging/_running/db1/20261128T120000.000Z-1a2b3c4d/001800000123"
    assert parse_running_key(key) == ("db1@20261128T120000.000Z-1a2b3c4d", 1_800_000_123)
    assert parse_running_key("staging/db1/20261128T120000.000Z-1a2b3c4d/session.json") is None
    assert parse_running_key(f"{RUNNING}db1/x/notastamp") is None
