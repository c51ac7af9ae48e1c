"""Pacing: how often the backup execution plans a round, and how long one Plan call watches.

The backup runs as one Standard execution (NAME@ID), and AWS fails an
execution whose history reaches 25,000 events. Each turn of the
Plan → SegmentsReady? → WaitForSegments|ProcessChunks loop adds a fixed
number of events (9 for a wait, 13 for a map: scripts/bench_lib/scale_sim.py), so
the loop's turns, not the backup's size, are what must be bounded:

- **A Plan call watches for up to `WATCH_SECONDS`** (polling every
  `POLL_INTERVAL_SECONDS` a few small objects: the next segment record of
  each input, the stream-end record, now and then the agent's lease), so an
  idle turn happens at most every ~7 minutes, however slow the stream, and
  the end of the stream is noticed within seconds, not after a Wait.
- **Rounds are spaced by `round_interval`**: at least `MIN_ROUND_SECONDS`
  apart, and never more than `ROUND_SPREAD` rounds per doubling of the
  execution's age, so a long execution plans proportionally bigger rounds.
  Over an execution of T seconds that is about
  ROUND_SPREAD × (1 + ln(T / (ROUND_SPREAD × MIN_ROUND_SECONDS))) rounds.
  After stream end nothing waits: what is ready is planned at once.
- **And a round waits for `ROUND_TARGET_CHUNKS`** ready chunks (or
  `ROUND_MAX_SECONDS` since the last round, so a slow stream is still
  processed as it arrives; `round_due`). Every round costs the same
  whatever it carries, so rounds of a fixed volume bound a TiB's rounds
  at any stream rate (the figures: docs/design/2026-11-cloud-figures.md).

- **A Plan call that would watch long sleeps instead** (`sleep_plan`):
  when the next round is more than `SLEEP_BREAK_EVEN_SECONDS` away (at the
  stream's average rate so far), it returns "sleeping" and the state
  machine waits in SleepUntilWoken for the agent to send back the task
  token it leaves in staging (braid.format.staging.wake): once the round's
  chunks are recorded, or the stream ends, or at the sleep's timeout (the
  time-based due, at most `SLEEP_MAX_SECONDS` and a quarter of the stall
  window, so a dead agent is still noticed; each timeout is another ~13
  history events, so the cap is as long as stall detection allows).
  `SLEEP_BREAK_EVEN_SECONDS` is how long a Plan call may watch for what
  a sleep costs.

The largest backup stays under half the history quota:
tests/cloud/test_scale_simulation.py counts it by running the planner, and
`scripts/bench cloud-model` prints it (dated figures:
docs/design/2026-11-cloud-figures.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from braid import contract
from braid.format.staging.wake import ONLY_AT_END

POLL_INTERVAL_SECONDS = 2.0
# Stop watching this long before the function's own deadline.
DEADLINE_MARGIN_SECONDS = 30.0
# Under half the Plan function's timeout (900 s): a 2x margin.
WATCH_SECONDS = contract.PLAN_TIMEOUT_SECONDS / 2 - DEADLINE_MARGIN_SECONDS
MIN_ROUND_SECONDS = 10.0
ROUND_SPREAD = 100.0
ROUND_TARGET_CHUNKS = 128  # 8 GiB at 64 MiB chunks
ROUND_MAX_SECONDS = 300.0


def round_interval(age_seconds: float, min_round_seconds: float = MIN_ROUND_SECONDS) -> float:
    """Least time between two rounds while the stream still arrives (see the module docstring)."""
    return max(min_round_seconds, max(0.0, age_seconds) / ROUND_SPREAD)


SLEEP_BREAK_EVEN_SECONDS = 20.0
SLEEP_MAX_SECONDS = 900.0  # a quarter of the default stall window: a dead agent is noticed within 1.25 windows


@dataclass(frozen=True)
class Sleep:
    """What a sleeping planner asks the agent for (braid.format.staging.wake.WakeRecord) and how long it sleeps at most."""

    wake_chunks: int  # the agent wakes it once it has recorded this many chunks (ONLY_AT_END: only at the end)
    wake_after_seconds: int  # and not sooner than this after it first read the token
    timeout_seconds: int  # the state's TimeoutSeconds: then the planner looks again itself


def sleep_plan(
    *, planned_chunks: int, ready_chunks: int, since_last_seconds: float | None, age_seconds: float, stall_seconds: float,
    min_round_seconds: float = MIN_ROUND_SECONDS,
) -> Sleep | None:
    """Sleep (until the agent wakes the pipeline) rather than watch, when the next round is far off; None: watch.

    `since_last_seconds`: since the last round (None before the first). The wait is estimated from the stream's
    average rate so far; the wake itself does not depend on the estimate, only the choice to sleep does.
    """
    longest = max(1, int(min(SLEEP_MAX_SECONDS, stall_seconds / 4)))
    if since_last_seconds is None:  # before the first round: it is due with the first recorded chunk
        return Sleep(planned_chunks + 1, 0, longest) if ready_chunks == 0 else None
    interval_left = max(0.0, round_interval(age_seconds, min_round_seconds) - since_last_seconds)
    by_time = max(0.0, ROUND_MAX_SECONDS - since_last_seconds)
    if ready_chunks >= ROUND_TARGET_CHUNKS:
        if interval_left <= SLEEP_BREAK_EVEN_SECONDS:
            return None
        return Sleep(ONLY_AT_END, 0, max(1, min(longest, math.ceil(interval_left))))
    recorded = planned_chunks + ready_chunks
    rate = recorded / age_seconds if age_seconds > 0 and recorded > 0 else 0.0
    by_volume = (ROUND_TARGET_CHUNKS - ready_chunks) / rate if rate > 0 else math.inf
    if max(interval_left, min(by_volume, by_time)) <= SLEEP_BREAK_EVEN_SECONDS:
        return None
    timeout = max(1, min(longest, math.ceil(max(interval_left, by_time))))
    return Sleep(planned_chunks + ROUND_TARGET_CHUNKS, math.ceil(interval_left), timeout)


def round_due(since_last_seconds: float, age_seconds: float, ready_chunks: int, min_round_seconds: float = MIN_ROUND_SECONDS) -> bool:
    """Whether a streaming round is due: `round_interval` has passed and enough is ready, or it has waited long enough.

    `min_round_seconds` 0 (a direct call's, unpaced) leaves the volume out: the interval alone decides.
    """
    if since_last_seconds < round_interval(age_seconds, min_round_seconds):
        return False
    if min_round_seconds <= 0:
        return True
    return ready_chunks >= ROUND_TARGET_CHUNKS or since_last_seconds >= ROUND_MAX_SECONDS


def watch_seconds(remaining_seconds: float | None, limit: float = WATCH_SECONDS) -> float:
    """How long one Plan call may watch: `limit`, less when the function's deadline is nearer."""
    if remaining_seconds is None:
        return limit
    return max(0.0, min(limit, remaining_seconds - DEADLINE_MARGIN_SECONDS))
