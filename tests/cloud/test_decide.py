"""The planner's decisions, driven directly (braid.pipeline.decide): no store, no clock.

Hypothesis generates backups (inputs of any length, empty ones too), the
order their segment records arrive in, when the stream ends, retried calls
that lost their cursor, racing calls whose round is adopted, and cut items
that stop at stream end. Whatever the sequence: chunk indexes are contiguous
from 0, every chunk of every segment has exactly one accepted result, and
nothing is planned after "done".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from braid.errors import IntegrityError
from braid.format.ids import BackupRef
from braid.format.staging import MapItem, Round, SegmentRecord, SessionRecord, StreamEnd, segment_key
from braid.pipeline.decide import Observation, PlanRound, Poll, Rules, StagingStalledError, Step, Wait, adopt, decide
from braid.pipeline.pacing import Sleep
from braid.pipeline.plan_cursor import PlanCursor, fresh_cursor
from braid.pipeline.policies import ALL_ON

CHUNK = 10
SEGMENT_CHUNKS = 4
REF = BackupRef.new("db")


def session(inputs: int) -> SessionRecord:
    return SessionRecord(str(REF), "repo", CHUNK, SEGMENT_CHUNKS, 3, [f"in{i}" for i in range(inputs)], "now")


def records_of(input_index: int, length: int) -> list[SegmentRecord]:
    """An input's segment records as the agent writes them: full segments, the last one short, one empty if empty."""
    size = SEGMENT_CHUNKS * CHUNK
    lengths = [min(size, length - offset) for offset in range(0, length, size)] or [0]
    out, offset = [], 0
    for segment, n in enumerate(lengths):
        parts = -(-n // CHUNK)
        key = segment_key(REF, input_index, segment)
        out.append(SegmentRecord(input_index, segment, key, offset, n, parts, "crc64nvme:x", [f"{key}:{p}" for p in range(parts)]))
        offset += n
    return out


@dataclass
class Driver:
    """A Plan loop around `decide`, with the store's and the map's part played by dicts."""

    rules: Rules
    cursor: PlanCursor
    records: dict[tuple[int, int], SegmentRecord] = field(default_factory=dict)  # arrived
    end: StreamEnd | None = None
    rounds: dict[int, Round] = field(default_factory=dict)  # the ledger: create-only
    accepted: list[tuple[MapItem, int]] = field(default_factory=list)  # (item, chunks its accepted result stores)
    carry: tuple[MapItem, ...] = ()
    done: bool = False
    now: float = 1000.0

    def ready(self) -> tuple[SegmentRecord, ...]:
        out = []
        for index, following in enumerate(self.cursor.segments):
            while (record := self.records.get((index, following))) is not None:
                out.append(record)
                following += 1
        return tuple(out)

    def call(self, *, lose_cursor: bool, race: bool, lease: str, stop_cut: int) -> None:
        """One Plan call of one turn (the map of a round runs before the next)."""
        seen = Observation(ready=self.ready(), found_new=True, end=self.end, carry=self.carry)
        rules = replace(self.rules, deadline=self.now)
        cursor, action = decide(self.cursor, seen, self.now, rules)
        if action is Step.READ_LEASE:
            cursor, action = decide(cursor, replace(seen, lease=lease, lease_read_at=self.now), self.now, rules)
        assert not isinstance(action, Poll) and action not in (Step.READ_LEASE, Step.HOLD)
        if self.done:
            assert action is Step.DONE, f"planned after done: {action}"
        self.done = action is Step.DONE
        if not isinstance(action, PlanRound):
            self.cursor = cursor
            self.now += action.seconds if isinstance(action, Wait) else action.timeout_seconds if isinstance(action, Sleep) else 1
            return
        assert action.items, "a round of nothing"
        number = cursor.rounds + 1
        items = action.items
        segments = list(dict.fromkeys((i.input_index, i.segment_index) for i in items))
        if race and not self.carry and len(segments) > 1:  # a racing call saw fewer segments and wrote first
            items = tuple(i for i in items if (i.input_index, i.segment_index) in segments[: len(segments) // 2])
        found = self.rounds.setdefault(number, Round(number, f"plans/round-{number:05d}.json", items))
        after = adopt(cursor, found, self.now, REF)
        if lose_cursor and found.items == action.items:
            self.now += 1  # the call failed after writing its round; the retry decides again from the old cursor
            return
        self.carry = ()
        for item in found.items:
            done = item.count
            if item.cut and self.end is not None and stop_cut and len(item.packs) > 1:  # stopped at a pack boundary
                done = sum(item.packs[: 1 + stop_cut % (len(item.packs) - 1)])
                self.carry += (item.remainder(done),)
            self.accepted.append((item, done))
        self.cursor = replace(after, check=None)
        self.now += 1


@st.composite
def backups(draw: st.DrawFn) -> tuple[list[list[SegmentRecord]], list[tuple[int, int]], dict[str, object]]:
    lengths = draw(st.lists(st.integers(0, 5 * SEGMENT_CHUNKS * CHUNK), min_size=1, max_size=3))
    inputs = [records_of(i, n) for i, n in enumerate(lengths)]
    keys = [(r.input_index, r.segment) for records in inputs for r in records]
    order = draw(st.permutations(keys))
    knobs = {
        "max_concurrency": draw(st.integers(1, 6)), "max_chunks_per_item": draw(st.integers(1, 8)), "max_items": draw(st.integers(1, 5)),
        "min_round_seconds": draw(st.sampled_from([0.0, 10.0])), "may_sleep": draw(st.booleans()),
        "policies": replace(ALL_ON, cut_items=draw(st.booleans())),
    }
    return inputs, order, knobs


@settings(max_examples=150, deadline=None)
@given(backups(), st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.booleans(), st.integers(0, 5)), min_size=1, max_size=60))
def test_any_arrival_order_plans_every_chunk_once_contiguously_and_nothing_after_done(
    backup: tuple[list[list[SegmentRecord]], list[tuple[int, int]], dict[str, object]], turns: list[tuple[int, bool, bool, int]],
) -> None:
    inputs, order, knobs = backup
    rules = Rules(REF, session(len(inputs)), poll_seconds=5, stall_seconds=10**9, deadline=0.0, **knobs)  # type: ignore[arg-type]
    driver = Driver(rules, fresh_cursor(rules.session, 1000.0))
    pending = list(order)
    script = iter(turns)
    for turn in range(10_000):
        arrive, lose, race, stop = next(script, (1, False, False, 0))
        for _ in range(arrive):
            if pending:
                key = pending.pop(0)
                driver.records[key] = next(r for r in inputs[key[0]] if r.segment == key[1])
        if not pending and driver.end is None:
            driver.end = StreamEnd([sum(r.length for r in rs) for rs in inputs], [len(rs) for rs in inputs])
        driver.call(lose_cursor=lose, race=race, lease=f"lease-{turn // 7}", stop_cut=stop)
        if driver.done and turn > len(turns) + 5:
            break
    assert driver.done and not pending
    # Contiguous indexes from 0, each once, and each chunk of each segment has exactly one accepted result.
    stored: dict[int, tuple[int, int, int]] = {}
    for item, done in driver.accepted:
        for offset in range(done):
            index = item.first_index + offset
            assert index not in stored, f"chunk {index} has two accepted results"
            stored[index] = (item.input_index, item.segment_index, item.first_chunk + offset)
    expected = {(r.input_index, r.segment, part) for rs in inputs for r in rs for part in range(1, r.chunks + 1)}
    assert sorted(stored) == list(range(len(expected)))
    assert sorted(stored.values()) == sorted(expected)
    assert driver.cursor.chunks == len(expected)


def test_a_held_cursor_polls_until_the_deadline_then_returns_held() -> None:
    rules = Rules(REF, session(1), 2, 4, poll_seconds=5, stall_seconds=600, deadline=100.0)
    held = replace(fresh_cursor(rules.session, 0.0), held={"until": 10**9, "released_by": ""})
    ready = Observation(ready=tuple(records_of(0, 30)))
    assert decide(held, ready, 50.0, rules) == (held, Poll(2.0))
    assert decide(held, ready, 99.0, rules) == (held, Step.HOLD)


def test_no_progress_for_the_stall_window_raises_and_a_new_lease_is_progress() -> None:
    rules = Rules(REF, session(1), 2, 4, poll_seconds=5, stall_seconds=600, deadline=10**9)
    cursor = fresh_cursor(rules.session, 0.0)
    assert decide(cursor, Observation(), 300.0, rules)[1] is Step.READ_LEASE
    renewed, action = decide(cursor, Observation(lease="a", lease_read_at=300.0), 300.0, rules)
    assert (renewed.lease, renewed.progress, action) == ("a", 300.0, Poll(2.0))
    with pytest.raises(StagingStalledError, match="no lease renewal from the agent for 600 s"):
        decide(renewed, Observation(lease="a", lease_read_at=900.0), 900.0, rules)


def test_an_adopted_round_that_does_not_start_at_the_cursor_is_refused() -> None:
    rules = Rules(REF, session(1), 2, 4, poll_seconds=5, stall_seconds=600, deadline=0.0)
    cursor = fresh_cursor(rules.session, 0.0)
    _, action = decide(cursor, Observation(ready=tuple(records_of(0, 30))), 1.0, rules)
    assert isinstance(action, PlanRound) and [i.first_index for i in action.items] == [0]
    shifted = tuple(replace(i, first_index=i.first_index + 1) for i in action.items)
    with pytest.raises(IntegrityError, match="starts chunk indexes at 1, expected 0"):
        adopt(cursor, Round(1, "plans/round-00001.json", shifted), 1.0, REF)
