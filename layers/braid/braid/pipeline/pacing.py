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

For 10 TiB at 50 MB/s (61 hours) that is ~630 map turns and ~520 idle
turns, ~11,000 events: under half the quota (tests/cloud/test_scale_simulation.py
counts it by running the planner; `scripts/bench cloud-model` prints it).
The watch costs a 256 MB Lambda for the stream's duration (~$0.01 per hour)
and a few GETs every 2 s; the Plan function's timeout is twice the watch.
"""

from __future__ import annotations

from braid import contract

POLL_INTERVAL_SECONDS = 2.0
# Stop watching this long before the function's own deadline.
DEADLINE_MARGIN_SECONDS = 30.0
# Under half the Plan function's timeout (900 s): a 2x margin.
WATCH_SECONDS = contract.PLAN_TIMEOUT_SECONDS / 2 - DEADLINE_MARGIN_SECONDS
MIN_ROUND_SECONDS = 10.0
ROUND_SPREAD = 100.0


def round_interval(age_seconds: float, min_round_seconds: float = MIN_ROUND_SECONDS) -> float:
    """Least time between two rounds while the stream still arrives (see the module docstring)."""
    return max(min_round_seconds, max(0.0, age_seconds) / ROUND_SPREAD)


def watch_seconds(remaining_seconds: float | None, limit: float = WATCH_SECONDS) -> float:
    """How long one Plan call may watch: `limit`, less when the function's deadline is nearer."""
    if remaining_seconds is None:
        return limit
    return max(0.0, min(limit, remaining_seconds - DEADLINE_MARGIN_SECONDS))
