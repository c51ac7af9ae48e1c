"""Three concurrent 1 TiB backups share the stack's worker budget in the scale simulation, and none is held.

scripts/bench_lib/account_model.py runs each backup through the real planner (its share taken by the real
braid.pipeline.account_budget, the other backups registered beside it) and adds their items' runs up on one clock."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from bench_lib import account_model  # noqa: E402
from bench_lib.account_model import THROTTLE_RIDE_OUT_SECONDS, over_account  # noqa: E402
from braid import contract  # noqa: E402

pytestmark = pytest.mark.long  # six simulated 1 TiB backups: after the main suite (scripts/test-long)


def test_three_one_tib_backups_finishing_together_stay_within_the_budget_and_none_is_held() -> None:
    budget = contract.DEFAULT_WORKER_CONCURRENCY
    row = account_model.concurrent_backups(3, 1, 1000, 500, budget)  # rounds back to back: the widest final rounds
    shared = row.pop("simulations")
    assert row["share"] == budget // 3 and all(sim.by_function("finalize") for sim in shared)
    for sim in shared:  # each map ran at most its share, though each backup asked for 500
        assert 0 < over_account([sim.item_spans])["peak"] <= budget // 3
    assert row["peak_workers"] <= budget and row["throttled_invokes"] == 0 and row["held"] == 0, row
    # The same backups each at their --fan-out: together they pass the budget, and would be throttled.
    assert row["peak_workers_without_budget"] > budget and row["throttled_invokes_without_budget"] > 0, row
    assert row["seconds_after_stream_end"] <= 1.5 * row["seconds_after_stream_end_without_budget"], row


def test_items_throttled_longer_than_the_throttle_retry_rides_out_hold_their_backup() -> None:
    limit = 4
    busy = [(0.0, 100.0)] * limit  # one backup fills the limit for 100 s
    brief = [(0.0, THROTTLE_RIDE_OUT_SECONDS / 2)] * limit
    assert over_account([busy, [(10.0, 20.0)]], limit) == {"peak": limit + 1, "seconds_at_limit": 100.0, "throttled": 1, "held": 1}
    assert over_account([brief, [(10.0, 20.0)]], limit)["held"] == 0  # ridden out
    assert over_account([busy[:-1], [(10.0, 20.0)]], limit)["throttled"] == 0

