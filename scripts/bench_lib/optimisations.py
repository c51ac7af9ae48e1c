"""The optimisation table of scripts/bench cloud-model: what each pipeline policy is worth at the published network rate.

Each policy of braid.pipeline.policies is switched off alone and the real
planner and Finalize run (bench_lib.scale_sim) at 1 TiB x 500 workers x
50/300/1,000 MB/s, at the worker's published network rate
(scale_sim.lambda_network_mb_s), against the same runs with every policy on.
Its worth at each stream rate is what switching it off costs: $/TiB of the
exact 1 TiB run, and seconds after stream end, the worst of `PHASES` stream
ends spread over one round period (scale_sim.end_phase_sizes). The rule (issue
22): an optimisation stays only if it saves >= KEEP_USD_PER_TIB or
>= KEEP_SECONDS at some stream rate.

PHASES stays 3 although each phase is a 1 TiB simulation (5-15 s) per policy
and rate: cut items pay only when the stream ends while a round is in
flight, so at the exact size alone (one phase) they showed 0 s saved and
"kept: False" (a run on 2026-11-28 evening). The "all on" runs are the main
table's (the same sizes, phases 0, 2, 4 of its 6). A policy the rule
removed (head pack, the taper, ...) is no longer a policy, so it has no row:
its last figures are in docs/design/2026-11-28-optimisations.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bench_lib import scale_sim
from braid.pipeline.policies import ALL_ON, Policies

KEEP_USD_PER_TIB = 0.01
KEEP_SECONDS = 2.0
RATES = (50, 300, 1000)
WORKERS = 500
PHASES = 3


def measured(policies: Policies, rate: float, options: dict[str, Any], price: Callable[[scale_sim.Simulation], float]) -> tuple[float, float]:
    """($/TiB of the 1 TiB run, worst seconds after stream end over the end phases) with `policies`."""
    sims = scale_sim.simulate_end_phases(1, rate, WORKERS, PHASES, policies=policies, **options)
    return price(sims[0]) / sims[0].tib, max(s.seconds_after_stream_end for s in sims)


def variants() -> list[Policies]:
    """The runs' policies: every one on, then each off alone (rows)."""
    return [ALL_ON, *(replace(ALL_ON, **{name: False}) for name in Policies.names())]


def rows(options: dict[str, Any], price: Callable[[scale_sim.Simulation], float], log: Any = None) -> list[dict[str, Any]]:
    """One row per policy: its saving at each stream rate and the best of them, and whether the rule keeps it; then
    the runs with every policy on ("all on": $/TiB and seconds after stream end themselves, not savings)."""
    base = {rate: measured(ALL_ON, rate, options, price) for rate in RATES}
    found = []
    for name in Policies.names():
        if log:
            log(f"cloud-model: {name} off, 1 TiB x {WORKERS} workers at {', '.join(map(str, RATES))} MB/s ...")
        off = {rate: measured(replace(ALL_ON, **{name: False}), rate, options, price) for rate in RATES}
        usd = {rate: off[rate][0] - base[rate][0] for rate in RATES}
        seconds = {rate: off[rate][1] - base[rate][1] for rate in RATES}
        best_usd, best_seconds = max(usd.values()), max(seconds.values())
        found.append({
            "optimisation": name,
            "saves_usd_per_tib": round(best_usd, 4),
            "saves_seconds_after_stream_end": round(best_seconds, 1),
            **{f"saves_usd_per_tib_at_{rate}": round(usd[rate], 4) for rate in RATES},
            **{f"saves_seconds_at_{rate}": round(seconds[rate], 1) for rate in RATES},
            "kept": best_usd >= KEEP_USD_PER_TIB or best_seconds >= KEEP_SECONDS,
        })
    found.append({
        "optimisation": "all on", "saves_usd_per_tib": None, "saves_seconds_after_stream_end": None,
        **{f"saves_usd_per_tib_at_{rate}": round(base[rate][0], 4) for rate in RATES},
        **{f"saves_seconds_at_{rate}": round(base[rate][1], 1) for rate in RATES},
        "kept": None,
    })
    return found
