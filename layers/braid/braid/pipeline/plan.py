"""Planning: from completed staging segments to Distributed Map items.

The planner runs in a loop while the agent uploads. Each call watches
staging for a while (braid.pipeline.pacing), reading only what is new (the
next segment record of each input, the stream-end record: the cursor of
braid.pipeline.plan_cursor says where), and once a round is due takes every
segment the agent has completed since the last round, assigns those
segments' chunks the next global chunk indexes, and writes them as one
*round* (braid.format.staging: `plans/round-NNNNN.json`, a JSON array of
map items, which is also what the Distributed Map's ItemReader reads).
Requests per call grow with what is new, never with the backup.

Round files are the ledger. They are written create-only and numbered, so
index assignment is persisted and deterministic: a retried or racing planner
that finds round N already written adopts it instead of renumbering, and the
next round starts where the last one ended. Global indexes are therefore
contiguous from 0 (the manifest requires that) but not ordered across inputs,
which the format allows: an input's chunks are ordered by offset.

A map item is a run of consecutive parts of one segment ("a few chunks",
see braid.pipeline.item_sizing for why), never spanning two segments.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from braid import contract
from braid.contract import PlanKey, PlanState
from braid.errors import BackupError, IntegrityError
from braid.format.ids import BackupRef
from braid.format.lease import heartbeat_seconds
from braid.format.staging import MapItem, SegmentRecord, SessionRecord, StagingArea, StreamEnd, rounds_prefix
from braid.format.staging.wake import ONLY_AT_END
from braid.pipeline.failure import describe_error
from braid.pipeline.item_sizing import MAX_ITEMS_PER_ROUND, chunks_per_item, inline_chunks_per_item
from braid.pipeline.pacing import POLL_INTERVAL_SECONDS, round_due, sleep_plan
from braid.pipeline.plan_cursor import PlanCursor, check_continues, fresh_cursor, lease_digest, recover_cursor, stream_complete
from braid.pipeline.policies import ALL_ON, Policies
from braid.pipeline.replan import check_last_map, check_of, hold_after_failure, watch_hold
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
    cursor: PlanCursor | None = field(default=None, compare=False)
    # A final round to run as an inline Map (the round file's items, in the state): see _plan_round.
    inline_items: tuple[MapItem, ...] = ()
    final: bool = False  # a round planned after stream end (the state machine warms Finalize's container for it)
    # "sleeping": what the agent wakes the pipeline for (braid.format.staging.wake); wait_seconds is the sleep's timeout.
    wake_chunks: int = ONLY_AT_END
    wake_after_seconds: int = 0

    def to_json(self) -> dict[str, Any]:
        """The state's `$.plan` (braid.contract.PlanKey names every key)."""
        return {
            PlanKey.STATUS: self.status,
            PlanKey.ROUND: self.round,
            PlanKey.ITEMS_KEY: self.items_key,
            PlanKey.ITEMS: self.items,
            PlanKey.CHUNKS: self.chunks,
            PlanKey.PLANNED_CHUNKS: self.planned_chunks,
            PlanKey.IDLE_SECONDS: self.idle_seconds,
            PlanKey.WAIT_SECONDS: self.wait_seconds,
            PlanKey.INLINE: bool(self.inline_items),
            PlanKey.FINAL: self.final,
            PlanKey.INLINE_ITEMS: [item.to_json() for item in self.inline_items],
            PlanKey.WAKE_CHUNKS: self.wake_chunks,
            PlanKey.WAKE_AFTER_SECONDS: self.wake_after_seconds,
            **({PlanKey.CURSOR: self.cursor.to_json()} if self.cursor is not None else {}),
        }


class StagingStalledError(IntegrityError):
    """The agent stopped completing segments before the stream ended."""


class StreamAbandonedError(BackupError):
    """The agent gave the stream up (its producer failed, the stream was empty): fail now, publish nothing.

    Its name is what the execution reports; Cleanup removes the staging.
    """


def check_not_abandoned(ref: BackupRef, end: StreamEnd | None) -> None:
    """Raise StreamAbandonedError, with the agent's reason, if the agent gave the stream up."""
    if end is not None and end.abandoned is not None:
        raise StreamAbandonedError(f"the agent abandoned backup {ref}: {end.abandoned}")


def items_for_segments(
    records: list[SegmentRecord], chunk_size: int, first_index: int, per_item: int, *, cut: bool = False, policies: Policies = ALL_ON,
) -> list[MapItem]:
    """Cut segments into items of `per_item` consecutive parts; indexes follow record order.

    Takes records StagingArea.read_segment_records checked (one part checksum per part).
    `cut`: the items may stop at a pack boundary once the stream has ended (MapItem.cut): a streaming round's.
    `policies`: decide each item's packs (Policies.packs), written into the item.
    """
    items = []
    index = first_index
    for record in records:
        part = 1
        while part <= record.chunks:
            count = min(per_item, record.chunks - part + 1)
            checksums = tuple(record.chunk_checksums[part - 1 : part - 1 + count])
            items.append(
                MapItem(
                    record.key, record.input_index, record.segment, record.offset, record.length, chunk_size, part, count, index, checksums,
                    cut=cut, packs=policies.packs(count),
                )
            )
            part += count
            index += count
    return items


def select_ready(ready: list[SegmentRecord], per_item: int, max_items: int) -> list[SegmentRecord]:
    """Whole segments, in order, while the round stays within `max_items` (at least one)."""
    chosen: list[SegmentRecord] = []
    items = 0
    for record in ready:
        needed = -(-record.chunks // per_item)
        if chosen and items + needed > max_items:
            break
        chosen.append(record)
        items += needed
    return chosen


def idle_since_progress(previous: Mapping[str, Any] | None) -> int:
    """Seconds the planner has waited without progress, carried in its previous result (the state's `plan`)."""
    if not previous or previous.get(PlanKey.STATUS) != PlanState.WAITING:
        return 0
    return int(previous.get(PlanKey.IDLE_SECONDS, 0))


def next_wait(idle_seconds: int, poll_seconds: int) -> int:
    """Poll quickly right after progress, then back off to `poll_seconds` (state transitions cost)."""
    return max(1, min(poll_seconds, 1 + idle_seconds))


def carried_cursor(previous: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The cursor the previous Plan call left in the state (`$.plan.cursor`), if any."""
    if not previous:
        return None
    cursor = previous.get(PlanKey.CURSOR)
    return cursor if isinstance(cursor, Mapping) else None


def plan_next_round(
    store: ObjectStore,
    ref: BackupRef,
    *,
    max_concurrency: int,
    max_chunks_per_item: int,
    poll_seconds: int,
    stall_seconds: int,
    idle_seconds: int = 0,
    max_items: int = MAX_ITEMS_PER_ROUND,
    cursor: Mapping[str, Any] | None = None,
    watch_seconds: float = 0.0,
    min_round_seconds: float = 0.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    may_sleep: bool = False,
    purge: Callable[[str], object] | None = None,
    index_results: bool = True,
    policies: Policies = ALL_ON,
) -> PlanStatus:
    """One Plan call: watch staging for up to `watch_seconds`, return a round as soon as one is due.

    `cursor`: what the previous call returned (None: rebuilt from the round
    files, once). `min_round_seconds`: pacing (0 plans whatever is ready at
    once, as a direct call expects). `clock`/`sleep`: epoch seconds and the
    pause between polls (the scale simulation runs them on a virtual clock).
    `may_sleep`: return "sleeping" rather than watch when the next round is far
    off (pacing.sleep_plan), for a state machine that waits for the agent's wake.
    `purge(key)`: removes every version of one staged segment (StagingArea.remove_segments).
    `index_results`: merge each map's finished results into the results index (braid.pipeline.replan); off, Finalize
    reads every item's record.
    `policies`: the optimisations the execution input chose (braid.pipeline.policies).
    """
    may_sleep = may_sleep and policies.sleep_until_woken
    area = StagingArea(store, ref)
    session = area.read_session()
    now = clock()
    if cursor is None:
        state = recover_cursor(area, session, now, idle_seconds) if store_has_rounds(area) else replace(fresh_cursor(session, now), progress=now - idle_seconds)
    else:
        state = PlanCursor.from_json(cursor, len(session.inputs))
    deadline = now + max(0.0, watch_seconds)
    # Fold only while the stream arrives: after its end the next step is the final round or Finalize, which
    # reads those few records faster itself (one vCPU against the planner's 256 MB share of one).
    fold = index_results and state.check is not None and area.read_stream_end() is None
    checked = check_last_map(area, state, now, fold=fold, purge=purge)
    state, carry = checked.state, list(checked.remainders)
    if checked.again:
        return _map_again(state, checked.again)
    ready: list[SegmentRecord] = []
    lease_read_at = float("-inf")
    while True:
        now = clock()
        if state.held is not None:
            state, again = watch_hold(area, state, now)
            if again:
                return _map_again(state, again)
            if state.held is None:
                continue  # released: plan on from the cursor
            check_not_abandoned(ref, area.read_stream_end())  # an explicit abandon ends the hold
            if now + POLL_INTERVAL_SECONDS > deadline:
                return PlanStatus(PlanState.HELD, round=state.rounds, planned_chunks=state.chunks, wait_seconds=1, cursor=state)
            sleep(POLL_INTERVAL_SECONDS)
            continue
        found_new = _read_new_records(area, session, state, ready)
        if found_new:
            state = replace(state, progress=now)
        end = area.read_stream_end()
        check_not_abandoned(ref, end)  # before planning more work for a stream that will never end
        ready, state = _skip_empty(ready, state)
        due = (
            end is not None or state.last_round is None
            or round_due(now - state.last_round, now - state.started, sum(r.chunks for r in ready), min_round_seconds)
        )
        if (ready and due) or carry:  # what cut items left (only once the stream has ended) is planned at once
            return _plan_round(area, session, state, ready, end, now, max_concurrency, max_chunks_per_item, max_items, carry, policies)
        if end is not None and not ready and stream_complete(ref, state, end, session):
            return PlanStatus(PlanState.DONE, round=state.rounds, planned_chunks=state.chunks, cursor=state)
        if now - lease_read_at >= heartbeat_seconds(stall_seconds):
            lease_read_at = now
            digest = lease_digest(area.read_agent_lease())
            if digest and digest != state.lease:
                state = replace(state, lease=digest, progress=now)
        idle = now - state.progress
        if idle >= stall_seconds:
            raise StagingStalledError(
                f"backup {ref}: no new staged segment and no lease renewal from the agent for {idle:.0f} s and the stream"
                " has not ended; the agent stopped uploading. Run the backup again (or resume it sooner with --resume)"
            )
        if may_sleep and end is None:
            asleep = sleep_plan(
                planned_chunks=state.chunks, ready_chunks=sum(r.chunks for r in ready),
                since_last_seconds=None if state.last_round is None else now - state.last_round, age_seconds=now - state.started,
                stall_seconds=stall_seconds, min_round_seconds=min_round_seconds,
            )
            if asleep is not None:
                return PlanStatus(
                    PlanState.SLEEPING, round=state.rounds, planned_chunks=state.chunks, idle_seconds=int(idle), wait_seconds=asleep.timeout_seconds,
                    cursor=state, wake_chunks=asleep.wake_chunks, wake_after_seconds=asleep.wake_after_seconds,
                )
        pause = min(POLL_INTERVAL_SECONDS, float(poll_seconds))
        if now + pause > deadline:
            wait = next_wait(int(idle), poll_seconds) if watch_seconds <= 0 else 1
            return PlanStatus(
                PlanState.WAITING, round=state.rounds, planned_chunks=state.chunks, idle_seconds=int(idle) + wait, wait_seconds=wait,
                cursor=state,
            )
        sleep(pause)


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
    state = hold_after_failure(area, state, now, step, name, message)
    return PlanStatus(PlanState.HELD, round=state.rounds, planned_chunks=state.chunks, wait_seconds=1, cursor=state)


def _map_again(state: PlanCursor, items: list[MapItem]) -> PlanStatus:
    """Map the unfinished items of an earlier round again (braid.pipeline.replan)."""
    assert state.check is not None
    return PlanStatus(
        PlanState.READY, round=int(state.check["round"]), items_key=str(state.check["key"]), items=len(items), chunks=sum(i.count for i in items),
        planned_chunks=state.chunks, cursor=state,
    )


def store_has_rounds(area: StagingArea) -> bool:
    return next(iter(area.store.list(rounds_prefix(area.ref))), None) is not None


def _read_new_records(area: StagingArea, session: SessionRecord, state: PlanCursor, ready: list[SegmentRecord]) -> bool:
    """Append to `ready` each input's next records beyond the cursor and what is already in `ready`; True if any."""
    found = False
    for index in range(len(session.inputs)):
        following = state.segments[index] + sum(1 for r in ready if r.input_index == index)
        while (record := area.read_segment_record(session, index, following)) is not None:
            check_continues(area.ref, _advanced(state, ready, index), record, session)
            ready.append(record)
            following += 1
            found = True
    ready.sort(key=lambda r: (r.input_index, r.segment))
    return found


def _advanced(state: PlanCursor, ready: list[SegmentRecord], index: int) -> PlanCursor:
    """The cursor as if every ready record of input `index` were planned (to check the next one continues them)."""
    mine = [r for r in ready if r.input_index == index]
    if not mine:
        return state
    segments, offsets = list(state.segments), list(state.offsets)
    segments[index] = mine[-1].segment + 1
    offsets[index] = mine[-1].offset + mine[-1].length
    return replace(state, segments=tuple(segments), offsets=tuple(offsets))


def _skip_empty(ready: list[SegmentRecord], state: PlanCursor) -> tuple[list[SegmentRecord], PlanCursor]:
    """Records without parts (an empty input) need no item: move the cursor past them now."""
    while True:
        empty = [r for r in ready if r.chunks == 0 and r.segment == state.segments[r.input_index]]
        if not empty:
            return ready, state
        for record in empty:
            state = state.with_empty(record)
            ready = [r for r in ready if r is not record]


def _finishing(carry: list[MapItem], per_item: int) -> list[MapItem]:
    """What cut items left, as items of whole packs of about `per_item` chunks (MapItem.split)."""
    return [piece for item in carry for piece in item.split(per_item)]


def _plan_round(
    area: StagingArea,
    session: SessionRecord,
    state: PlanCursor,
    ready: list[SegmentRecord],
    end: StreamEnd | None,
    now: float,
    max_concurrency: int,
    max_chunks_per_item: int,
    max_items: int,
    carry: list[MapItem] | None = None,
    policies: Policies = ALL_ON,
) -> PlanStatus:
    """The next round: `carry` (what cut items left, split into items of whole packs) and the ready segments' items.

    A streaming round's items are cut items (MapItem.cut); a round after stream end is sized to spread over
    every worker, and runs inline when small enough."""
    carry = carry or []
    ready_chunks = sum(r.chunks for r in ready) + sum(item.count for item in carry)
    per_item = chunks_per_item(ready_chunks, max_concurrency, max_chunks_per_item, streaming=end is None)
    # After stream end, a round small enough runs as an inline Map: its items start at once, with no
    # Distributed Map run to start first (~2 s of the time after stream end; item_sizing).
    inline_per_item = inline_chunks_per_item(ready_chunks, max_concurrency, max_chunks_per_item) if end is not None and policies.inline_final_round else None
    items = []
    if inline_per_item is not None:
        items = _finishing(carry, inline_per_item) + items_for_segments(ready, session.chunk_size, state.chunks, inline_per_item, policies=policies)
    inline = 0 < len(items) <= min(contract.INLINE_MAP_MAX_ITEMS, max_concurrency)
    if not inline:
        chosen = select_ready(ready, per_item, max_items)  # each input's chosen records continue its cursor
        cut = end is None and policies.cut_items
        items = _finishing(carry, per_item) + items_for_segments(chosen, session.chunk_size, state.chunks, per_item, cut=cut, policies=policies)
    found = area.write_round(state.rounds + 1, items)
    inline = inline and len(found.items) <= min(contract.INLINE_MAP_MAX_ITEMS, max_concurrency)  # an adopted round as well
    planned = [item for item in found.items if not item.finishes_cut]
    if planned and planned[0].first_index != state.chunks:
        raise IntegrityError(f"plan round {found.key} of {area.ref} starts chunk indexes at {planned[0].first_index}, expected {state.chunks}")
    after = replace(state.with_round(found, now), check=check_of(found.key, found.number))
    return PlanStatus(
        PlanState.READY, round=found.number, items_key=found.key, items=len(found.items), chunks=found.chunk_count, planned_chunks=after.chunks, cursor=after,
        inline_items=found.items if inline else (), final=end is not None and policies.warm_finalize,
    )
