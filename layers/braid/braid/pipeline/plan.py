"""Planning: from completed staging segments to Distributed Map items.

The planner runs in a loop while the agent uploads. Each call takes every
segment the agent has completed (a segment record exists) that no earlier
round planned, assigns those segments' chunks the next global chunk indexes,
and writes them as one *round* (braid.format.staging: `plans/round-NNNNN.json`,
a JSON array of map items, which is also what the Distributed Map's
ItemReader reads).

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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from braid.errors import BackupError, IntegrityError
from braid.format.ids import BackupRef
from braid.format.staging import MapItem, Round, SegmentRecord, SessionRecord, StagingArea, StreamEnd
from braid.pipeline.item_sizing import MAX_ITEMS_PER_ROUND, chunks_per_item
from braid.ports.store import ObjectStore


@dataclass(frozen=True)
class PlanStatus:
    """What the planner tells the state machine: map a round, wait, or finish."""

    status: str  # "ready" | "waiting" | "done"
    round: int = 0
    items_key: str = ""  # repository-relative key of the round file
    items: int = 0
    chunks: int = 0
    planned_chunks: int = 0  # over all rounds so far
    idle_seconds: int = 0  # waited since the last progress (stall detection)
    wait_seconds: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "round": self.round,
            "items_key": self.items_key,
            "items": self.items,
            "chunks": self.chunks,
            "planned_chunks": self.planned_chunks,
            "idle_seconds": self.idle_seconds,
            "wait_seconds": self.wait_seconds,
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


def next_chunk_index(rounds: Iterable[Round]) -> int:
    return max((found.end_index for found in rounds), default=0)


def planned_segments(rounds: Iterable[Round]) -> set[tuple[int, int]]:
    """(input, segment) of every segment some round already planned."""
    return {(item.input_index, item.segment_index) for found in rounds for item in found.items}


def items_for_segments(records: list[SegmentRecord], chunk_size: int, first_index: int, per_item: int) -> list[MapItem]:
    """Cut segments into items of `per_item` consecutive parts; indexes follow record order.

    Takes records StagingArea.read_segment_records checked (one part checksum per part).
    """
    items = []
    index = first_index
    for record in records:
        part = 1
        while part <= record.parts:
            count = min(per_item, record.parts - part + 1)
            checksums = tuple(record.part_checksums[part - 1 : part - 1 + count])
            items.append(
                MapItem(record.key, record.input_index, record.segment, record.offset, record.length, chunk_size, part, count, index, checksums)
            )
            part += count
            index += count
    return items


def select_ready(ready: list[SegmentRecord], per_item: int, max_items: int) -> list[SegmentRecord]:
    """Whole segments, in order, while the round stays within `max_items` (at least one)."""
    chosen: list[SegmentRecord] = []
    items = 0
    for record in ready:
        needed = -(-record.parts // per_item)
        if chosen and items + needed > max_items:
            break
        chosen.append(record)
        items += needed
    return chosen


def check_complete(ref: BackupRef, records: list[SegmentRecord], end: StreamEnd, session: SessionRecord) -> bool:
    """True once every segment the stream-end record announces is recorded; raises if they disagree.

    An abandoned stream is never complete: StreamAbandonedError (Finalize asks this too).
    """
    check_not_abandoned(ref, end)
    end.check(ref, session)
    by_input: dict[int, list[SegmentRecord]] = {}
    for record in records:
        by_input.setdefault(record.input_index, []).append(record)
    for index, (length, count) in enumerate(zip(end.lengths, end.segments, strict=True)):
        found = sorted(by_input.get(index, []), key=lambda r: r.segment)
        if len(found) < count:
            return False
        if [r.segment for r in found] != list(range(count)):
            raise IntegrityError(f"input {index} of {ref} has segment records {[r.segment for r in found]}, stream-end says {count}")
        offset = 0
        for position, record in enumerate(found):
            last = position == count - 1
            if record.offset != offset or (not last and record.length != record.parts * session.chunk_size):
                raise IntegrityError(f"segment {record.segment} of input {index} of {ref} does not continue the input at byte {offset}")
            offset += record.length
        if offset != length:
            raise IntegrityError(f"input {index} of {ref} is {length} bytes by stream-end, its segments hold {offset}")
    return True


def idle_since_progress(previous: Mapping[str, Any] | None) -> int:
    """Seconds the planner has waited without progress, carried in its previous result (the state's `plan`)."""
    if not previous or previous.get("status") != "waiting":
        return 0
    return int(previous.get("idle_seconds", 0))


def next_wait(idle_seconds: int, poll_seconds: int) -> int:
    """Poll quickly right after progress, then back off to `poll_seconds` (state transitions cost)."""
    return max(1, min(poll_seconds, 1 + idle_seconds))


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
) -> PlanStatus:
    area = StagingArea(store, ref)
    session = area.read_session()
    records = area.read_segment_records(session)
    rounds = area.read_rounds()
    planned = planned_segments(rounds)
    planned_chunks = next_chunk_index(rounds)
    ready = [r for r in records if r.parts > 0 and (r.input_index, r.segment) not in planned]
    end = area.read_stream_end()
    check_not_abandoned(ref, end)  # before planning more work for a stream that will never end
    if ready:
        per_item = chunks_per_item(sum(r.parts for r in ready), max_concurrency, max_chunks_per_item, streaming=end is None)
        chosen = select_ready(ready, per_item, max_items)
        found = area.write_round(len(rounds) + 1, items_for_segments(chosen, session.chunk_size, planned_chunks, per_item))
        return PlanStatus(
            "ready",
            round=found.number,
            items_key=found.key,
            items=len(found.items),
            chunks=found.chunk_count,
            planned_chunks=planned_chunks + found.chunk_count,
        )
    if end is not None and check_complete(ref, records, end, session):
        return PlanStatus("done", round=len(rounds), planned_chunks=planned_chunks)
    if idle_seconds >= stall_seconds:
        raise StagingStalledError(
            f"backup {ref}: no new staged segment for {idle_seconds} s and the stream has not ended;"
            " the agent stopped uploading. Run the backup again (or resume it sooner with --resume)"
        )
    wait = next_wait(idle_seconds, poll_seconds)
    return PlanStatus("waiting", round=len(rounds), planned_chunks=planned_chunks, idle_seconds=idle_seconds + wait, wait_seconds=wait)
