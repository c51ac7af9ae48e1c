"""Pacing: how often the backup execution plans a round, and how long one Plan call watches.

AWS fails an execution whose history reaches 25,000 events, and each turn
of the Plan loop adds a fixed number (9 for a wait, 13 for a map), so the
loop's turns, not the backup's size, are bounded (the reasoning and
figures: docs/design/2026-11-cloud-figures.md):

- a Plan call watches for up to `WATCH_SECONDS`, polling what is new every
  `POLL_INTERVAL_SECONDS`;
- rounds are `round_interval` apart at least (`MIN_ROUND_SECONDS`, and at
  most `ROUND_SPREAD` rounds per doubling of the execution's age), and a
  streaming round waits for `ROUND_TARGET_CHUNKS` ready chunks or
  `ROUND_MAX_SECONDS` (`round_due`); after stream end nothing waits;
- a call whose next round is over `SLEEP_BREAK_EVEN_SECONDS` away sleeps
  instead (`sleep_plan`): the state machine waits in SleepUntilWoken for
  the agent's wake (braid.format.staging.wake) or the sleep's timeout, at
  most `SLEEP_MAX_SECONDS` and a quarter of the stall window.

tests/cloud/test_scale_simulation.py counts the largest backup's events.
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
