"""The planner's cursor: what earlier Plan calls already did, carried in the execution's state (`$.plan.cursor`).

With it a call reads only what is new, O(1) per call rather than O(n):
for each input the *next* segment record by its key (segments are planned
in order), and the stream-end record. The round files stay the ledger: a
call without a cursor rebuilds it from them once, and a retried call that
finds its round written adopts it (StagingArea.write_round), so indexes
are never assigned twice. It also carries the clocks of pacing and stall
detection: the first call, the last round, the agent's last progress.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from braid.errors import IntegrityError, UsageError
from braid.format.fields import Fields
from braid.format.ids import BackupRef
from braid.format.staging import Round, SegmentRecord, SessionRecord, StagingArea, StreamEnd


@dataclass(frozen=True)
class PlanCursor:
    rounds: int  # rounds written so far
    chunks: int  # chunks planned so far: the next global chunk index
    segments: tuple[int, ...]  # per input: the next segment to plan
    offsets: tuple[int, ...]  # per input: bytes planned so far
    started: float  # epoch seconds: the first Plan call
    last_round: float | None  # epoch seconds of the last round planned
    progress: float  # epoch seconds of the agent's last sign of progress
    lease: str = ""  # digest of the agent's lease as last read
    # The last map's items file, checked by the next call: {"key", "round", "attempt", "limit"} (braid.pipeline.replan).
    check: Mapping[str, Any] | None = None
    # Set while the backup is held: {"until": epoch seconds, "released_by": nonce} (HoldRecord, braid.format.staging.records).
    held: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "segments": list(self.segments), "offsets": list(self.offsets)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], inputs: int) -> PlanCursor:
        try:
            f = Fields(dict(doc), "planner cursor", ("rounds", "chunks", "segments", "offsets", "started", "progress"), ("last_round", "lease", "check", "held"))
            last = doc.get("last_round")
            lease = doc.get("lease", "")
            if not isinstance(lease, str):
                raise ValueError(f"lease must be a string, not {lease!r}")
            cursor = cls(
                rounds=f.count("rounds"),
                chunks=f.count("chunks"),
                segments=tuple(f.counts("segments")),
                offsets=tuple(f.counts("offsets")),
                started=_seconds(doc["started"], "started"),
                last_round=None if last is None else _seconds(last, "last_round"),
                progress=_seconds(doc["progress"], "progress"),
                lease=lease,
                check=_mapping_or_none(doc.get("check"), ("key", "round", "attempt", "limit")),
                held=_mapping_or_none(doc.get("held"), ("until", "released_by")),
            )
        except IntegrityError as exc:
            raise UsageError(f"invalid planner cursor in the execution state: {exc.message}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"invalid planner cursor in the execution state: {exc}") from None
        if len(cursor.segments) != inputs or len(cursor.offsets) != inputs or cursor.rounds < 0 or cursor.chunks < 0:
            raise UsageError(f"invalid planner cursor in the execution state: {dict(doc)!r} for {inputs} inputs")
        return cursor

    def with_round(self, found: Round, now: float) -> PlanCursor:
        """The cursor after `found` (this call's round, or the one a racing call wrote first)."""
        segments, offsets = list(self.segments), list(self.offsets)
        last: dict[int, tuple[int, int, int]] = {}
        for item in found.items:
            last[item.input_index] = max(last.get(item.input_index, (-1, 0, 0)), (item.segment_index, item.segment_offset, item.segment_length))
        for index, (segment, offset, length) in last.items():
            if segment + 1 > segments[index]:
                segments[index], offsets[index] = segment + 1, offset + length
        return replace(
            self, rounds=found.number, chunks=max(self.chunks, found.end_index), segments=tuple(segments), offsets=tuple(offsets),
            last_round=now, progress=now,
        )

    def past(self, record: SegmentRecord) -> PlanCursor:
        """The cursor as if `record` were planned: an empty input's record (nothing to plan, but it counts), or one read."""
        segments, offsets = list(self.segments), list(self.offsets)
        segments[record.input_index], offsets[record.input_index] = record.segment + 1, record.offset + record.length
        return replace(self, segments=tuple(segments), offsets=tuple(offsets))


def _mapping_or_none(value: Any, names: tuple[str, ...]) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or any(n not in value for n in names):
        raise ValueError(f"expected an object with {names}, not {value!r}")
    return dict(value)


def fresh_cursor(session: SessionRecord, now: float) -> PlanCursor:
    inputs = len(session.inputs)
    return PlanCursor(0, 0, (0,) * inputs, (0,) * inputs, started=now, last_round=None, progress=now)


def recover_cursor(area: StagingArea, session: SessionRecord, now: float, idle_seconds: float = 0.0) -> PlanCursor:
    """Rebuild the cursor from the round files (one read of every round: only when none was carried)."""
    cursor = replace(fresh_cursor(session, now), progress=now - idle_seconds)
    for found in area.read_rounds():
        cursor = replace(cursor.with_round(found, now), progress=now - idle_seconds, last_round=None)
    return cursor


def lease_digest(raw: bytes | None) -> str:
    return "" if raw is None else hashlib.sha256(raw).hexdigest()[:16]


def check_continues(ref: BackupRef, cursor: PlanCursor, record: SegmentRecord, session: SessionRecord) -> None:
    """A new record must continue its input where the planned ones end (every earlier segment full)."""
    expected = cursor.segments[record.input_index] * session.segment_chunks * session.chunk_size
    if record.offset != cursor.offsets[record.input_index] or record.offset != expected:
        raise IntegrityError(
            f"segment {record.segment} of input {record.input_index} of {ref} starts at byte {record.offset};"
            f" the input's planned segments end at {cursor.offsets[record.input_index]}"
        )


def stream_complete(ref: BackupRef, cursor: PlanCursor, end: StreamEnd, session: SessionRecord) -> bool:
    """True once every segment the stream-end record announces is planned; raises if they disagree."""
    end.check(ref, session)
    for index, (length, count) in enumerate(zip(end.lengths, end.segments, strict=True)):
        if cursor.segments[index] > count:
            raise IntegrityError(f"input {index} of {ref} has {cursor.segments[index]} segments planned, stream-end says {count}")
        if cursor.segments[index] < count:
            return False
        if cursor.offsets[index] != length:
            raise IntegrityError(f"input {index} of {ref} is {length} bytes by stream-end, its segments hold {cursor.offsets[index]}")
    return True


def rounds_cover_stream(ref: BackupRef, rounds: Iterable[Round], end: StreamEnd, session: SessionRecord) -> None:
    """Finalize's check, from the rounds alone: every input's segments are planned, whole, in order, through its end.

    The items of each segment must cover its parts 1..n exactly once, and
    the segments must tile the input from byte 0 to the stream-end length.
    """
    end.check(ref, session)
    parts: dict[tuple[int, int], list[tuple[int, int]]] = {}
    spans: dict[tuple[int, int], tuple[int, int]] = {}
    for found in rounds:
        for item in found.items:
            if item.finishes_cut:
                continue  # a cut item's last packs, planned again: the cut item covers them (StagingArea.read_results)
            slot = (item.input_index, item.segment_index)
            parts.setdefault(slot, []).append((item.first_chunk, item.count))
            spans[slot] = (item.segment_offset, item.segment_length)
    for index, (length, count) in enumerate(zip(end.lengths, end.segments, strict=True)):
        offset = 0
        for segment in range(count):
            slot = (index, segment)
            if slot not in spans:
                if offset == length:  # an empty input's record has no parts, hence no items
                    continue
                raise IntegrityError(f"backup {ref}: segment {segment} of input {index} was never planned")
            seg_offset, seg_length = spans[slot]
            expected = -(-seg_length // session.chunk_size)
            covered = sorted(parts[slot])
            next_part = 1
            for first, n in covered:
                if first != next_part:
                    raise IntegrityError(f"backup {ref}: the items of segment {segment} of input {index} do not cover its parts in order")
                next_part = first + n
            if seg_offset != offset or next_part != expected + 1:
                raise IntegrityError(f"backup {ref}: segment {segment} of input {index} does not continue the input at byte {offset}")
            offset += seg_length
        if offset != length or any(i == index and s >= count for i, s in spans):
            raise IntegrityError(f"backup {ref}: input {index} is {length} bytes by stream-end, its planned segments hold {offset}")


def _seconds(value: Any, name: str) -> float:
    """A JSON number (an integer or a float; never a boolean or a string), as written by the planner."""
    if type(value) not in (int, float):
        raise ValueError(f"{name} must be a number, not {value!r}")
    return float(value)
