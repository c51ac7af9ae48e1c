"""Many scale simulations at once, in worker processes, into scale_sim's memo (scripts/bench cloud-model).

cloud-model's tables need ~90 simulations of 1 to 10 TiB (5-100 s each on
a loaded 2-core machine), each one Python process's work. `prefetch` runs the
distinct ones among `requests` (scale_sim.simulation_key) in a process pool,
longest first, and stores each result in the open scale_sim.memoized() memo,
so the tables, built after it one by one, find every simulation done. A
request the tables do not make costs only its run; a simulation the tables
make that no request named simply runs when asked. The results are those of
running them in turn: a simulation's figures depend only on its inputs
(scale_sim.simulation_key), not on which process ran it.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from bench_lib import scale_sim


@dataclass(frozen=True)
class Request:
    """One scale_sim.simulate call, at `network` MB/s per function (scale_sim.network)."""

    tib: float
    stream_mb_s: float
    workers: int
    network: float
    options: dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple[Any, ...]:
        with scale_sim.network(self.network):
            return scale_sim.simulation_key(self.tib, self.stream_mb_s, self.workers, **self.options)


def _run(request: Request) -> scale_sim.Simulation:
    with scale_sim.network(request.network):
        return scale_sim.simulate(request.tib, request.stream_mb_s, request.workers, **request.options)


def processes() -> int:
    """The pool's size: the CPUs this process may use."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def prefetch(requests: list[Request], workers: int | None = None, log: Any = None) -> int:
    """Run the distinct simulations of `requests` not yet in the open memo (scale_sim.memoized()), `workers` at a time,
    into it; returns how many ran. One worker (or one simulation): they run here, in turn."""
    memo = scale_sim._MEMO
    if memo is None:
        raise RuntimeError("sim_pool.prefetch needs an open scale_sim.memoized()")
    todo: dict[tuple[Any, ...], Request] = {}
    for request in requests:
        key = request.key()
        if key not in memo:
            todo.setdefault(key, request)
    # Longest first (a simulation's work grows with the backup's size), so the last to finish is a short one.
    order = sorted(todo.items(), key=lambda kv: -kv[1].tib)
    workers = min(workers or processes(), len(order))
    if log:
        log(f"cloud-model: {len(order)} distinct simulations ({len(requests)} asked for), {max(workers, 1)} at a time ...")
    if workers <= 1:
        for key, request in order:
            memo[key] = _run(request)
        return len(order)
    # fork: the children start with this process's imports and calibrations, and run nothing but _run.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {pool.submit(_run, request): key for key, request in order}
        for done, future in enumerate(as_completed(futures), start=1):
            memo[futures[future]] = future.result()
            if log and done % 10 == 0:
                log(f"cloud-model: {done} of {len(order)} simulations done")
    return len(order)
