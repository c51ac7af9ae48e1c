"""The agent wakes its sleeping pipeline once what the planner waits for has arrived.

While the stream arrives slowly the planner sleeps rather than watch
(braid.pipeline.pacing.sleep_plan): the state machine leaves a task token
in the backup's staging (the wake record, braid.format.staging.wake) and
waits for it. The agent is the one party that knows at once when a segment
is recorded or the stream has ended, so after each segment record, at the
stream's end (or its abandon) and while it waits for the pipeline, it reads
the record and sends the token back (SendTaskSuccess) when due.

A wake is an optimisation of latency and cost, never of correctness: the
planner decides everything from staging when it runs, and the sleep's
timeout runs it anyway. So nothing here raises: a failed read or send is
tried again at the next poke, or left to the timeout. A token is sent at
most once (the first poke that finds it due); a token the execution no
longer waits for (woken already, timed out) is dropped.

The race it must not lose: the planner looks at staging, finds nothing due
and returns "sleeping"; the state machine writes the record a moment later.
A segment record or the stream's end written in between is not seen by that
look, and the agent's poke right after writing it found the old token. So
after the stream's end the agent keeps poking (`linger`) while it waits for
the pipeline, or for LINGER_SECONDS with --no-wait, which covers that moment
(unless a wake it sent after the end already runs the planner).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from braid.errors import BackupError
from braid.format.staging import StagingArea
from braid.ports.executions import Executions

log = logging.getLogger(__name__)

# After the stream's end, with --no-wait: a planner's last look, its "sleeping" and the state's PUT of the record take
# well under a second; the agent looks three times.
LINGER_SECONDS = 3.0
POKE_INTERVAL_SECONDS = 1.0


class PipelineWaker:
    def __init__(
        self,
        area: StagingArea,
        executions: Executions,
        recorded: Callable[[], int],
        ended: Callable[[], bool],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`recorded`: the chunks the agent has recorded in segment records so far (every input, a resumed upload's too);
        `ended`: whether the stream-end (or abandon) record is written, which makes any sleep due."""
        self._area, self._executions, self._recorded, self._ended, self._clock = area, executions, recorded, ended, clock
        self._lock = threading.Lock()
        self._first_seen: dict[str, float] = {}
        self._sent: set[str] = set()
        self.wakes = 0  # tokens sent back (tests, progress)
        self.woken_after_end = False  # a wake sent once the end record was written: the planner's next look sees it

    def poke(self) -> bool:
        """Read the wake record and send its token if what it waits for has arrived; True if this call woke the pipeline."""
        try:
            record = self._area.read_wake()
        except BackupError as exc:
            log.debug("reading the wake record of %s failed: %s", self._area.ref, exc)
            return False
        if record is None:
            return False
        with self._lock:
            if record.token in self._sent:
                return False
            first = self._first_seen.setdefault(record.token, self._clock())
            ended = self._ended()
            if not record.due(self._recorded(), self._clock() - first, ended):
                return False
            self._sent.add(record.token)  # before sending: concurrent pokes send it once
        try:
            woke = self._executions.wake(record.token)
        except BackupError as exc:
            log.debug("waking the pipeline of %s failed: %s", self._area.ref, exc)
            with self._lock:
                self._sent.discard(record.token)  # the next poke tries again; else the sleep's timeout wakes it
            return False
        if woke:
            with self._lock:
                self.wakes += 1
                self.woken_after_end = self.woken_after_end or ended
        return woke

    def linger(self, seconds: float = LINGER_SECONDS, *, sleep: Callable[[float], None] = time.sleep) -> None:
        """Poke every POKE_INTERVAL_SECONDS for `seconds` (after the stream's end, when nothing else waits for the pipeline)."""
        deadline = self._clock() + seconds
        while self._clock() < deadline and not self.woken_after_end:
            self.poke()
            sleep(POKE_INTERVAL_SECONDS)
