"""Several backups at once in one account: their workers together against the stack's budget and the account's pool.

Each backup runs through the scale simulation (bench_lib.scale_sim: the real
planner and Finalize) with `budget`, so every Plan call takes its share
through the real braid.pipeline.account_budget with the other backups
registered beside it, and its maps run that many items at once. The backups
start together and stream at the same rate; their sizes are spread over one
round period (scale_sim.end_phase_sizes), so they end within a round of each
other: their final rounds, the widest, overlap, the case review 3 (H3) found
throttling into holds. Their items' runs, on the one virtual clock, give the
account's worker concurrency at every moment.

An invoke is throttled only when the account's concurrency would pass
ACCOUNT_CONCURRENCY (or the reservation, when the stack reserves the budget);
a backup is held only when an item stays throttled past the worker's throttle
retry, then fails its two re-plans. So a peak within the budget means no
throttled invoke and no hold. Without the budget (each map at its --fan-out)
the same backups are simulated for comparison, and the seconds their sum
spends above the pool are reported: what the throttle retry would have to ride out.
"""

from __future__ import annotations

from typing import Any

from bench_lib import scale_sim
from braid import contract

# AWS Lambda's default concurrency quota per account and region: "Concurrent executions: 1,000" (Lambda Developer
# Guide, Lambda quotas); new accounts may start lower, which is why the stack reserves nothing by default.
ACCOUNT_CONCURRENCY = 1000


# What the worker's throttle retry rides out before the item fails (braid_infra.steps.WORKER_THROTTLE_RETRY: backoffs of
# at most 2 + 4 + 8 + 16 + 16 + 16 s; tests/cloud checks the figure against the stack).
THROTTLE_RIDE_OUT_SECONDS = 62


def over_account(runs: list[list[tuple[float, float]]], limit: int = ACCOUNT_CONCURRENCY) -> dict[str, Any]:
    """The account's concurrent worker invokes over the backups' item runs (`runs`, one list per backup): its peak,
    the seconds it spent at or above `limit`, the item starts that met it there (throttled), and the backups whose
    throttled starts fell in a stretch at the limit longer than the throttle retry rides out (they would be held)."""
    events = sorted((t, step, b) for b, spans in enumerate(runs) for start, end in spans for t, step in ((start, 1), (end, -1)))
    running, peak, stretches, began = 0, 0, [], None
    throttled: list[tuple[float, int]] = []
    for when, step, backup in events:
        if step > 0 and running >= limit:
            throttled.append((when, backup))
        running += step
        peak = max(peak, running)
        if running >= limit and began is None:
            began = when
        elif running < limit and began is not None:
            stretches.append((began, when))
            began = None
    long_ones = [(a, b) for a, b in stretches if b - a > THROTTLE_RIDE_OUT_SECONDS]
    held = {backup for when, backup in throttled if any(a <= when <= b for a, b in long_ones)}
    return {
        "peak": peak, "seconds_at_limit": round(sum(b - a for a, b in stretches), 1), "throttled": len(throttled), "held": len(held),
    }


def concurrent_backups(
    backups: int = 3, tib: float = 1, stream_mb_s: float = 300, fan_out: int = 500, budget: int = contract.DEFAULT_WORKER_CONCURRENCY,
    **options: Any,
) -> dict[str, Any]:
    """`backups` backups of `tib` TiB at `stream_mb_s`, each asking for `fan_out`, sharing `budget`: the model's row, and
    its simulations (`simulations`). Throttling is judged at the budget as if the stack reserved it for the worker (a
    reservation is the most the worker runs): the stricter of that and the account's pool (ACCOUNT_CONCURRENCY)."""
    sizes = scale_sim.end_phase_sizes(tib, stream_mb_s, backups, options.get("chunk_size", 64 * 2**20))
    shared = [scale_sim.simulate(size, stream_mb_s, fan_out, budget=budget, others=backups - 1, **options) for size in sizes]
    alone = [scale_sim.simulate(size, stream_mb_s, fan_out, **options) for size in sizes]
    limit = min(ACCOUNT_CONCURRENCY, budget)
    with_budget = over_account([sim.item_spans for sim in shared], limit)
    without = over_account([sim.item_spans for sim in alone], limit)
    return {
        "backups": backups,
        "tib": tib,
        "stream_mb_s": stream_mb_s,
        "fan_out": fan_out,
        "budget": budget,
        "throttle_limit": limit,  # the budget as a reservation, or the account's pool if smaller
        "share": budget // backups,
        "peak_workers": with_budget["peak"],  # the account's concurrent worker invokes, all backups together
        "throttled_invokes": with_budget["throttled"],
        "held": with_budget["held"],
        "seconds_after_stream_end": round(max(sim.seconds_after_stream_end for sim in shared), 1),
        "peak_workers_without_budget": without["peak"],
        "throttled_invokes_without_budget": without["throttled"],
        "seconds_at_limit_without_budget": without["seconds_at_limit"],
        "held_without_budget": without["held"],
        "seconds_after_stream_end_without_budget": round(max(sim.seconds_after_stream_end for sim in alone), 1),
        "simulations": shared,
    }
