"""Planning: from completed staging segments to Distributed Map items.

The planner runs in a loop while the agent uploads. Each call takes every
segment the agent has completed (a segment record exists) that no earlier
round planned, assigns those segments' chunks the next global chunk indexes,
and writes them as one *round*: `plans/round-NNNNN.json`, a JSON array of
map items, which is also what the Distributed Map's ItemReader reads.

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

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from braid.errors import AlreadyExistsError, IntegrityError, NotFoundError, RepositoryError
from braid.format.ids import BackupRef
from braid.format.layout import staging_prefix
from braid.format.staging import (
    SegmentRecord,
    SessionRecord,
    StreamEnd,
    plan_key,
    segment_key,
    segment_records_prefix,
    session_key,
    stream_end_key,
)
from braid.pipeline.item_sizing import MAX_ITEMS_PER_ROUND, chunks_per_item
from braid.ports.store import ObjectStore

_ROUND = re.compile(r"round-(\d{5})\.json$")


def rounds_prefix(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}plans/round-"


def round_key(ref: BackupRef, number: int) -> str:
    return f"{staging_prefix(ref)}plans/round-{number:05d}.json"


@dataclass(frozen=True)
class ChunkSlice:
    """One chunk of an item: where its bytes are in the segment and in the input."""

    index: int
    part: int
    start: int  # within the segment object
    length: int
    offset: int  # within the input
    checksum: str  # CRC64NVME (base64) of the part as the agent read it


@dataclass(frozen=True)
class MapItem:
    """One Distributed Map item: `count` consecutive parts of one segment."""

    segment: str  # repository-relative key of the segment object
    input_index: int
    segment_index: int
    segment_offset: int
    segment_length: int
    chunk_size: int
    first_part: int  # 1-based, as S3 numbers parts
    count: int
    first_index: int  # global index of the item's first chunk
    checksums: tuple[str, ...]  # per part, from the segment record

    @property
    def end_index(self) -> int:
        return self.first_index + self.count

    def chunks(self) -> list[ChunkSlice]:
        slices = []
        for j in range(self.count):
            part = self.first_part + j
            start = (part - 1) * self.chunk_size
            length = min(self.chunk_size, self.segment_length - start)
            if length <= 0:
                raise IntegrityError(f"map item for {self.segment} names part {part}, beyond the segment's {self.segment_length} bytes")
            slices.append(ChunkSlice(self.first_index + j, part, start, length, self.segment_offset + start, self.checksums[j]))
        return slices

    def to_json(self) -> dict[str, Any]:
        return {
            "segment": self.segment,
            "input": self.input_index,
            "seg": self.segment_index,
            "seg_offset": self.segment_offset,
            "seg_length": self.segment_length,
            "chunk_size": self.chunk_size,
            "first_part": self.first_part,
            "count": self.count,
            "first_index": self.first_index,
            "crc": list(self.checksums),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MapItem:
        try:
            item = cls(
                segment=str(doc["segment"]),
                input_index=int(doc["input"]),
                segment_index=int(doc["seg"]),
                segment_offset=int(doc["seg_offset"]),
                segment_length=int(doc["seg_length"]),
                chunk_size=int(doc["chunk_size"]),
                first_part=int(doc["first_part"]),
                count=int(doc["count"]),
                first_index=int(doc["first_index"]),
                checksums=tuple(str(c) for c in doc["crc"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(f"malformed map item {dict(doc)!r}: {exc}") from None
        if item.count < 1 or item.first_part < 1 or item.chunk_size < 1 or item.first_index < 0 or len(item.checksums) != item.count:
            raise IntegrityError(f"impossible map item {dict(doc)!r}")
        return item


@dataclass(frozen=True)
class Round:
    number: int
    key: str
    items: tuple[MapItem, ...]

    @property
    def chunk_count(self) -> int:
        return sum(i.count for i in self.items)


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


def read_session(store: ObjectStore, ref: BackupRef) -> SessionRecord:
    try:
        session = SessionRecord.from_bytes(store.get(session_key(ref)))
    except NotFoundError:
        raise RepositoryError(
            f"no staged session for {ref} in {store.url}: the agent writes {session_key(ref)} before starting the pipeline"
        ) from None
    except (ValueError, TypeError) as exc:
        raise IntegrityError(f"staged session of {ref} is malformed: {exc}") from None
    if session.backup != str(ref):
        raise IntegrityError(f"staged session at {session_key(ref)} names {session.backup}, not {ref}")
    if session.chunk_size < 1 or session.segment_parts < 1 or not session.inputs:
        raise IntegrityError(f"staged session of {ref} has impossible settings (chunk size {session.chunk_size})")
    return session


def read_stream_end(store: ObjectStore, ref: BackupRef) -> StreamEnd | None:
    try:
        return StreamEnd.from_bytes(store.get(stream_end_key(ref)))
    except NotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise IntegrityError(f"stream-end record of {ref} is malformed: {exc}") from None


def check_record(ref: BackupRef, session: SessionRecord, record: SegmentRecord) -> None:
    """Refuse a record that points outside its own staging object or has impossible sizes."""
    where = f"segment record in{record.input_index}/seg{record.segment} of {ref}"
    if not 0 <= record.input_index < len(session.inputs):
        raise IntegrityError(f"{where} names input {record.input_index}; the session has {len(session.inputs)}")
    if record.key != segment_key(ref, record.input_index, record.segment):
        raise IntegrityError(f"{where} points at {record.key}, not its own staging object")
    if record.parts > session.segment_parts or record.length < 0 or record.offset < 0:
        raise IntegrityError(f"{where} has impossible sizes ({record.parts} parts, {record.length} bytes)")
    expected_parts = -(-record.length // session.chunk_size)
    if record.parts != expected_parts:
        raise IntegrityError(f"{where}: {record.length} bytes make {expected_parts} parts of {session.chunk_size}, record says {record.parts}")


def read_segment_records(store: ObjectStore, ref: BackupRef, session: SessionRecord) -> list[SegmentRecord]:
    records = []
    for info in store.list(segment_records_prefix(ref)):
        try:
            record = SegmentRecord.from_bytes(store.get(info.key))
        except (ValueError, TypeError) as exc:
            raise IntegrityError(f"segment record {info.key} of {ref} is malformed: {exc}") from None
        check_record(ref, session, record)
        records.append(record)
    return sorted(records, key=lambda r: (r.input_index, r.segment))


def parse_round(raw: bytes, number: int, key: str) -> Round:
    try:
        docs = json.loads(raw)
    except ValueError:
        raise IntegrityError(f"plan round {key} is not JSON") from None
    if not isinstance(docs, list) or not docs:
        raise IntegrityError(f"plan round {key} is not a non-empty list of map items")
    return Round(number, key, tuple(MapItem.from_json(d) for d in docs))


def load_rounds(store: ObjectStore, ref: BackupRef) -> list[Round]:
    """Every round so far, checked to chain: round N's indexes follow round N-1's."""
    rounds = []
    for info in store.list(rounds_prefix(ref)):
        match = _ROUND.search(info.key)
        if match:
            rounds.append(parse_round(store.get(info.key), int(match.group(1)), info.key))
    rounds.sort(key=lambda r: r.number)
    next_index = 0
    for expected, found in enumerate(rounds, start=1):
        if found.number != expected:
            raise IntegrityError(f"plan rounds of {ref} skip from {expected - 1} to {found.number}")
        for item in found.items:
            if item.first_index != next_index:
                raise IntegrityError(f"plan round {found.key} of {ref} starts chunk indexes at {item.first_index}, expected {next_index}")
            next_index = item.end_index
    return rounds


def next_chunk_index(rounds: Iterable[Round]) -> int:
    end = 0
    for found in rounds:
        for item in found.items:
            end = max(end, item.end_index)
    return end


def items_for_segments(records: list[SegmentRecord], chunk_size: int, first_index: int, per_item: int) -> list[MapItem]:
    """Cut segments into items of `per_item` consecutive parts; indexes follow record order."""
    items = []
    index = first_index
    for record in records:
        if len(record.part_checksums) != record.parts:
            raise IntegrityError(
                f"segment record {record.key} lists {len(record.part_checksums)} part checksums for {record.parts} parts"
            )
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


def write_round(store: ObjectStore, ref: BackupRef, number: int, items: list[MapItem]) -> Round:
    """Persist round `number` create-only; a round already there wins and is adopted."""
    key = round_key(ref, number)
    body = json.dumps([i.to_json() for i in items], separators=(",", ":")).encode()
    try:
        store.put(key, body, create_only=True)
        return Round(number, key, tuple(items))
    except AlreadyExistsError:
        return parse_round(store.get(key), number, key)


def write_segment_plans(store: ObjectStore, ref: BackupRef, found: Round) -> None:
    """Per-segment plan files (staging contract): the items of each segment in the round."""
    by_segment: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for item in found.items:
        by_segment.setdefault((item.input_index, item.segment_index), []).append(item.to_json())
    for (input_index, segment), docs in by_segment.items():
        body = json.dumps({"round": found.number, "items": docs}, separators=(",", ":")).encode()
        store.put(plan_key(ref, input_index, segment), body)


def check_complete(ref: BackupRef, records: list[SegmentRecord], end: StreamEnd, session: SessionRecord) -> bool:
    """True once every segment the stream-end record announces is recorded; raises if they disagree."""
    if len(end.lengths) != len(session.inputs) or len(end.segments) != len(session.inputs):
        raise IntegrityError(f"stream-end record of {ref} describes {len(end.lengths)} inputs; the session has {len(session.inputs)}")
    by_input: dict[int, list[SegmentRecord]] = {}
    for record in records:
        by_input.setdefault(record.input_index, []).append(record)
    for index, (length, count) in enumerate(zip(end.lengths, end.segments)):
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
    session = read_session(store, ref)
    records = read_segment_records(store, ref, session)
    rounds = load_rounds(store, ref)
    planned = {(item.input_index, item.segment_index) for found in rounds for item in found.items}
    planned_chunks = next_chunk_index(rounds)
    ready = [r for r in records if r.parts > 0 and (r.input_index, r.segment) not in planned]
    end = read_stream_end(store, ref)
    if ready:
        per_item = chunks_per_item(sum(r.parts for r in ready), max_concurrency, max_chunks_per_item, streaming=end is None)
        chosen = select_ready(ready, per_item, max_items)
        found = write_round(store, ref, len(rounds) + 1, items_for_segments(chosen, session.chunk_size, planned_chunks, per_item))
        write_segment_plans(store, ref, found)
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
