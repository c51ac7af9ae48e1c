"""The planner's decisions, without I/O or a clock: `decide(cursor, observation, now, rules) -> (cursor, action)`.

braid.pipeline.plan is the shell around it: it reads staging (the segment
records beyond the cursor, the stream end, the agent's lease when asked),
calls `decide`, and acts: writes a round, polls again, or returns a status
to the state machine. tests/cloud/test_decide.py drives `decide` directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from braid.errors import IntegrityError
from braid.format.ids import BackupRef
from braid.format.lease import heartbeat_seconds
from braid.format.staging import MapItem, Round, SegmentRecord, SessionRecord, StreamEnd
from braid.pipeline.item_sizing import MAX_ITEMS_PER_ROUND, chunks_per_item
from braid.pipeline.pacing import POLL_INTERVAL_SECONDS, Sleep, round_due, sleep_plan
from braid.pipeline.plan_cursor import PlanCursor, stream_complete
from braid.pipeline.policies import ALL_ON, Policies
from braid.pipeline.replan import check_of


class StagingStalledError(IntegrityError):
    """The agent stopped completing segments before the stream ended."""


@dataclass(frozen=True)
class Rules:
    """What one Plan call was given, constant over the call."""

    ref: BackupRef
    session: SessionRecord
    max_concurrency: int
    max_chunks_per_item: int
    poll_seconds: int
    stall_seconds: int
    deadline: float  # epoch seconds: the call returns by then
    watching: bool = False  # the call watches (a state machine's): its waits are 1 s, not backed off
    max_items: int = MAX_ITEMS_PER_ROUND
    min_round_seconds: float = 0.0
    may_sleep: bool = False  # and policies.sleep_until_woken
    policies: Policies = ALL_ON


@dataclass(frozen=True)
class Observation:
    """What the shell has read in this call."""

    ready: tuple[SegmentRecord, ...] = ()  # the records beyond the cursor, each continuing its input, in (input, segment) order
    found_new: bool = False  # this turn's reads found a record
    end: StreamEnd | None = None
    lease: str = ""  # the digest of the agent's lease as last read, at `lease_read_at` ("" before the first read)
    lease_read_at: float = -math.inf
    carry: tuple[MapItem, ...] = ()  # what the last map's cut items left (braid.pipeline.replan.MapChecked.remainders)


@dataclass(frozen=True)
class PlanRound:  # write these items as the next round (it may turn out adopted: `adopt`)
    items: tuple[MapItem, ...]


@dataclass(frozen=True)
class Poll:  # look again after `seconds`, within this call
    seconds: float


class Step(Enum):
    """The actions without fields."""

    READ_LEASE = "read the agent's lease, then decide again with it (the same `now`)"
    HOLD = 'return "held": the backup waits for `braid backup --resume` (the shell watches the hold)'
    DONE = "every segment the stream-end record announces is planned: Finalize"


@dataclass(frozen=True)
class Wait:  # return "waiting": the state machine waits `seconds`, `idle_seconds` since the last progress by then
    seconds: int
    idle_seconds: int


Action = PlanRound | Poll | Wait | Sleep | Step  # Sleep: return "sleeping" (braid.pipeline.pacing)


def decide(cursor: PlanCursor, seen: Observation, now: float, rules: Rules) -> tuple[PlanCursor, Action]:
    """The next step of a Plan call; raises StagingStalledError (the agent stopped) or IntegrityError (staging disagrees)."""
    if cursor.held is not None:
        return cursor, Step.HOLD if now + POLL_INTERVAL_SECONDS > rules.deadline else Poll(POLL_INTERVAL_SECONDS)
    cursor, ready = _absorb(cursor, seen, now)
    ready_chunks, end = sum(r.chunks for r in ready), seen.end
    due = end is not None or cursor.last_round is None or round_due(now - cursor.last_round, now - cursor.started, ready_chunks, rules.min_round_seconds)
    if (ready and due) or seen.carry:  # what cut items left (only once the stream has ended) is planned at once
        return cursor, plan_round(cursor, ready, list(seen.carry), end is not None, rules)
    if end is not None and not ready and stream_complete(rules.ref, cursor, end, rules.session):
        return cursor, Step.DONE
    if now - seen.lease_read_at >= heartbeat_seconds(rules.stall_seconds):
        return cursor, Step.READ_LEASE
    if seen.lease and seen.lease != cursor.lease:
        cursor = replace(cursor, lease=seen.lease, progress=now)
    return cursor, _idle(cursor, ready_chunks, end is None, now, rules)


def _absorb(cursor: PlanCursor, seen: Observation, now: float) -> tuple[PlanCursor, list[SegmentRecord]]:
    """The cursor past what was seen (progress, empty inputs' records) and the records still to plan."""
    cursor = replace(cursor, progress=now) if seen.found_new else cursor
    for record in seen.ready:  # an empty input's record: nothing to plan, but it counts
        if record.chunks == 0 and record.segment == cursor.segments[record.input_index]:
            cursor = cursor.past(record)
    return cursor, [r for r in seen.ready if r.segment >= cursor.segments[r.input_index]]


def _idle(cursor: PlanCursor, ready_chunks: int, streaming: bool, now: float, rules: Rules) -> Action:
    """Nothing to plan: raise if the agent stalled, else sleep, wait or poll."""
    idle = now - cursor.progress
    if idle >= rules.stall_seconds:
        raise StagingStalledError(
            f"backup {rules.ref}: no new staged segment and no lease renewal from the agent for {idle:.0f} s and the stream"
            " has not ended; the agent stopped uploading. Run the backup again (or resume it sooner with --resume)"
        )
    since_last = None if cursor.last_round is None else now - cursor.last_round
    asleep = sleep_plan(
        planned_chunks=cursor.chunks, ready_chunks=ready_chunks, since_last_seconds=since_last, age_seconds=now - cursor.started,
        stall_seconds=rules.stall_seconds, min_round_seconds=rules.min_round_seconds,
    ) if rules.may_sleep and streaming else None
    pause = min(POLL_INTERVAL_SECONDS, float(rules.poll_seconds))
    if asleep is not None or now + pause <= rules.deadline:
        return asleep or Poll(pause)
    wait = 1 if rules.watching else max(1, min(rules.poll_seconds, 1 + int(idle)))  # back off after progress
    return Wait(wait, int(idle) + wait)


def plan_round(cursor: PlanCursor, ready: list[SegmentRecord], carry: list[MapItem], ended: bool, rules: Rules) -> PlanRound:
    """The next round: `carry` split into items of whole packs, then the ready segments' items.

    A streaming round's items are cut items (MapItem.cut); a round after stream end is sized to spread over every worker."""
    ready_chunks = sum(r.chunks for r in ready) + sum(item.count for item in carry)
    per_item = chunks_per_item(ready_chunks, rules.max_concurrency, rules.max_chunks_per_item, streaming=not ended)
    chosen = select_ready(ready, per_item, rules.max_items)  # each input's chosen records continue its cursor
    cut = not ended and rules.policies.cut_items
    segments = items_for_segments(chosen, rules.session.chunk_size, cursor.chunks, per_item, cut=cut, policies=rules.policies)
    finishing = [piece for item in carry for piece in item.split(per_item)]  # what cut items left, in whole packs
    return PlanRound(tuple(finishing + segments))


def adopt(cursor: PlanCursor, found: Round, now: float, ref: BackupRef) -> PlanCursor:
    """The cursor after the round written (this call's, or the one a racing call wrote first, with the same start)."""
    planned = [item for item in found.items if not item.finishes_cut]
    if planned and planned[0].first_index != cursor.chunks:
        raise IntegrityError(f"plan round {found.key} of {ref} starts chunk indexes at {planned[0].first_index}, expected {cursor.chunks}")
    return replace(cursor.with_round(found, now), check=check_of(found.key, found.number))


def items_for_segments(
    records: list[SegmentRecord], chunk_size: int, first_index: int, per_item: int, *, cut: bool = False, policies: Policies = ALL_ON,
) -> list[MapItem]:
    """Cut segments into items of `per_item` consecutive parts; indexes follow record order; checked records (a
    checksum per part). `cut`: MapItem.cut (a streaming round's). `policies`: each item's packs (Policies.packs)."""
    items, index = [], first_index
    for record in records:
        for part in range(1, record.chunks + 1, per_item):
            count = min(per_item, record.chunks - part + 1)
            checksums = tuple(record.chunk_checksums[part - 1 : part - 1 + count])
            items.append(MapItem(
                record.key, record.input_index, record.segment, record.offset, record.length, chunk_size, part, count, index, checksums,
                cut=cut, packs=policies.packs(count),
            ))
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

