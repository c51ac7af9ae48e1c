"""Planning: from completed staging segments to Distributed Map items.

Each Plan call watches staging for a while (braid.pipeline.pacing), reading
only what is new beyond its cursor (braid.pipeline.plan_cursor), and when a
round is due writes the segments completed since the last round as one
*round* (`plans/round-NNNNN.json`, the map's items: braid.format.staging),
their chunks numbered by the next global chunk indexes. Round files are the
ledger: created once and numbered, so a retried or racing planner adopts
round N rather than renumbering; indexes are contiguous from 0, in offset
order within an input. An item is a run of consecutive parts of one
segment (braid.pipeline.item_sizing). braid.pipeline.decide decides,
without I/O; this module reads staging for it and acts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from braid.contract import PlanKey, PlanState
from braid.errors import BackupError
from braid.format.ids import BackupRef
from braid.format.staging import MapItem, SegmentRecord, SessionRecord, StagingArea, StreamEnd
from braid.format.staging.wake import ONLY_AT_END
from braid.pipeline.decide import Action, Observation, PlanRound, Poll, Rules, Step, Wait, adopt, decide
from braid.pipeline.failure import describe_error
from braid.pipeline.item_sizing import MAX_ITEMS_PER_ROUND
from braid.pipeline.pacing import Sleep
from braid.pipeline.plan_cursor import PlanCursor, check_continues, lease_digest, recover_cursor
from braid.pipeline.policies import ALL_ON, Policies
from braid.pipeline.replan import check_last_map, hold_after_failure, watch_hold
from braid.ports.store import ObjectStore


@dataclass(frozen=True)
class PlanStatus:
    """What the planner tells the state machine: map a round, wait, or finish."""

    status: PlanState
    round: int = 0
    items_key: str = ""  # repository-relative key of the round file
    items: int = 0
    chunks: int = 0
    planned_chunks: int = 0  # over all rounds so far
    idle_seconds: int = 0  # waited since the last progress (stall detection)
    wait_seconds: int = 0
    # "sleeping": what the agent wakes the pipeline for (braid.format.staging.wake); wait_seconds is the sleep's timeout.
    wake_chunks: int = ONLY_AT_END
    wake_after_seconds: int = 0
    cursor: PlanCursor | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The state's `$.plan` (braid.contract.PlanKey names every key)."""
        doc: dict[str, Any] = {PlanKey(f.name): getattr(self, f.name) for f in fields(self) if f.name != PlanKey.CURSOR}
        return {**doc, PlanKey.CURSOR: self.cursor.to_json()} if self.cursor is not None else doc


class StreamAbandonedError(BackupError):
    """The agent gave the stream up (its producer failed, the stream was empty): fail now, publish nothing.

    Its name is what the execution reports; Cleanup removes the staging.
    """


def check_not_abandoned(ref: BackupRef, end: StreamEnd | None) -> None:
    """Raise StreamAbandonedError, with the agent's reason, if the agent gave the stream up."""
    if end is not None and end.abandoned is not None:
        raise StreamAbandonedError(f"the agent abandoned backup {ref}: {end.abandoned}")


def idle_since_progress(previous: Mapping[str, Any] | None) -> int:
    """Seconds the planner has waited without progress, carried in its previous result (the state's `plan`)."""
    if not previous or previous.get(PlanKey.STATUS) != PlanState.WAITING:
        return 0
    return int(previous.get(PlanKey.IDLE_SECONDS, 0))


def carried_cursor(previous: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The cursor the previous Plan call left in the state (`$.plan.cursor`), if any."""
    cursor = previous.get(PlanKey.CURSOR) if previous else None
    return cursor if isinstance(cursor, Mapping) else None


def plan_next_round(
    store: ObjectStore, ref: BackupRef, *, max_concurrency: int, max_chunks_per_item: int, poll_seconds: int, stall_seconds: int,
    idle_seconds: int = 0, max_items: int = MAX_ITEMS_PER_ROUND, cursor: Mapping[str, Any] | None = None, watch_seconds: float = 0.0,
    min_round_seconds: float = 0.0, clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
    may_sleep: bool = False, purge: Callable[[str], object] | None = None, policies: Policies = ALL_ON,
) -> PlanStatus:
    """One Plan call: watch staging for up to `watch_seconds`, return a round as soon as one is due.

    The I/O shell around braid.pipeline.decide.decide: it reads staging, decides, acts.
    `cursor`: what the previous call returned (None: rebuilt from the round
    files, once). `min_round_seconds`: pacing (0 plans whatever is ready at
    once, as a direct call expects). `clock`/`sleep`: epoch seconds and the
    pause between polls (the scale simulation runs them on a virtual clock).
    `may_sleep`: return "sleeping" rather than watch when the next round is far
    off (pacing.sleep_plan), for a state machine that waits for the agent's wake.
    `purge(key)`: removes every version of one staged segment (StagingArea.remove_segments).
    `policies`: the optimisations the execution input chose (braid.pipeline.policies).
    """
    area = StagingArea(store, ref)
    session = area.read_session()
    now = clock()
    state = recover_cursor(area, session, now, idle_seconds) if cursor is None else PlanCursor.from_json(cursor, len(session.inputs))
    rules = Rules(
        ref, session, max_concurrency, max_chunks_per_item, poll_seconds, stall_seconds, deadline=now + max(0.0, watch_seconds),
        watching=watch_seconds > 0, max_items=max_items, min_round_seconds=min_round_seconds,
        may_sleep=may_sleep and policies.sleep_until_woken, policies=policies,
    )
    # Fold only while the stream arrives: after its end the next step is the final round or Finalize, which
    # reads those few records faster itself (one vCPU against the planner's 256 MB share of one).
    fold = policies.results_index and state.check is not None and area.read_stream_end() is None
    checked = check_last_map(area, state, now, fold=fold, purge=purge)
    state = checked.state
    if checked.again:
        return _map_again(state, checked.again)
    seen = Observation(carry=checked.remainders)
    while True:
        now = clock()
        state, seen, again = _observe(area, session, state, seen, now)
        if again:
            return _map_again(state, again)
        state, action = decide(state, seen, now, rules)
        if action is Step.READ_LEASE:
            seen = replace(seen, lease=lease_digest(area.read_agent_lease()), lease_read_at=now)
            state, action = decide(state, seen, now, rules)
        if not isinstance(action, Poll):
            return _act(area, state, action, now, rules)
        sleep(action.seconds)


def _observe(
    area: StagingArea, session: SessionRecord, state: PlanCursor, seen: Observation, now: float,
) -> tuple[PlanCursor, Observation, list[MapItem] | None]:
    """Watch the hold (a resume releases it, maybe with items to map again), or read what is new; refuse an abandoned stream."""
    if state.held is not None:
        state, again = watch_hold(area, state, now)
        if state.held is not None:
            check_not_abandoned(area.ref, area.read_stream_end())  # an explicit abandon ends the hold
        if again or state.held is not None:
            return state, seen, again
    ready = _read_new_records(area, session, state, seen.ready)
    seen = replace(seen, ready=ready, found_new=len(ready) > len(seen.ready), end=area.read_stream_end())
    check_not_abandoned(area.ref, seen.end)  # before planning more work for a stream that will never end
    return state, seen, None


def _act(area: StagingArea, state: PlanCursor, action: Action, now: float, rules: Rules) -> PlanStatus:
    """Carry out what `decide` returned (all but polling): the status the state machine reads."""
    if isinstance(action, PlanRound):
        found = area.write_round(state.rounds + 1, list(action.items))
        after = adopt(state, found, now, rules.ref)
        return PlanStatus(
            PlanState.READY, round=found.number, items_key=found.key, items=len(found.items), chunks=found.chunk_count, planned_chunks=after.chunks,
            cursor=after,
        )
    if isinstance(action, Sleep):
        return _status(
            state, PlanState.SLEEPING, idle_seconds=int(now - state.progress), wait_seconds=action.timeout_seconds,
            wake_chunks=action.wake_chunks, wake_after_seconds=action.wake_after_seconds,
        )
    if isinstance(action, Wait):
        return _status(state, PlanState.WAITING, idle_seconds=action.idle_seconds, wait_seconds=action.seconds)
    assert action in (Step.HOLD, Step.DONE), action
    return _status(state, PlanState.HELD, wait_seconds=1) if action is Step.HOLD else _status(state, PlanState.DONE)


def _status(state: PlanCursor, status: PlanState, **given: Any) -> PlanStatus:
    return PlanStatus(status, round=state.rounds, planned_chunks=state.chunks, cursor=state, **given)


def hold_step_failure(
    store: ObjectStore, ref: BackupRef, step: str, error: Mapping[str, Any] | None, previous: Mapping[str, Any] | None, clock: Callable[[], float] = time.time,
) -> PlanStatus:
    """The Hold state: a step after Prepare failed; hold the backup (braid.pipeline.replan.hold_after_failure).

    `previous`: the state's `$.plan` (its cursor continues after the resume);
    returns the "held" status the planner's loop then watches."""
    area = StagingArea(store, ref)
    session = area.read_session()
    now = clock()
    carried = carried_cursor(previous)
    state = PlanCursor.from_json(carried, len(session.inputs)) if carried is not None else recover_cursor(area, session, now)
    name, message = describe_error(error)
    return _status(hold_after_failure(area, state, now, step, name, message), PlanState.HELD, wait_seconds=1)


def _map_again(state: PlanCursor, items: list[MapItem]) -> PlanStatus:
    """Map the unfinished items of an earlier round again (braid.pipeline.replan)."""
    assert state.check is not None
    return PlanStatus(
        PlanState.READY, round=int(state.check["round"]), items_key=str(state.check["key"]), items=len(items), chunks=sum(i.count for i in items),
        planned_chunks=state.chunks, cursor=state,
    )


def _read_new_records(area: StagingArea, session: SessionRecord, state: PlanCursor, ready: tuple[SegmentRecord, ...]) -> tuple[SegmentRecord, ...]:
    """`ready` and each input's next records beyond the cursor and it, each checked to continue the one before."""
    found = list(ready)
    for index in range(len(session.inputs)):
        after = state
        for earlier in (r for r in ready if r.input_index == index):
            after = after.past(earlier)
        while (record := area.read_segment_record(session, index, after.segments[index])) is not None:
            check_continues(area.ref, after, record, session)
            found.append(record)
            after = after.past(record)
    return tuple(sorted(found, key=lambda r: (r.input_index, r.segment)))
