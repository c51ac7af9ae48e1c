"""Planner: contiguous, persisted chunk indexes; a retried planner never renumbers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from braid.adapters.local.store import LocalStore
from braid.errors import IntegrityError
from braid.format.ids import BackupRef
from braid.format.staging import MapItem, SegmentRecord, SessionRecord, StagingArea, StreamEnd, segment_key, segment_record_key, session_key, stream_end_key
from braid.pipeline.item_sizing import chunks_per_item
from braid.pipeline.plan import StagingStalledError, items_for_segments, plan_next_round

CHUNK = 100


def record(ref: BackupRef, input_index: int, segment: int, offset: int, length: int) -> SegmentRecord:
    parts = -(-length // CHUNK)
    return SegmentRecord(
        input_index, segment, segment_key(ref, input_index, segment), offset, length, parts, "crc64nvme:x", [f"part-{p}" for p in range(parts)]
    )


def plan(store: LocalStore, ref: BackupRef, idle: int = 0):  # type: ignore[no-untyped-def]
    return plan_next_round(store, ref, max_concurrency=2, max_chunks_per_item=3, poll_seconds=5, stall_seconds=20, idle_seconds=idle)


def test_rounds_number_chunks_contiguously_and_a_retry_adopts_the_written_round(tmp_path: Path) -> None:
    store, ref = LocalStore(tmp_path), BackupRef.new("db")
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a", "b"], "now").to_bytes())
    assert plan(store, ref).status == "waiting"
    first = record(ref, 1, 0, 0, 350)
    store.put(segment_record_key(ref, 1, 0), first.to_bytes())
    ready = plan(store, ref)
    assert (ready.status, ready.round, ready.chunks) == ("ready", 1, 4)
    # A racing attempt that computed round 1 differently loses and adopts what is stored.
    adopted = StagingArea(store, ref).write_round(1, items_for_segments([record(ref, 0, 0, 0, 400)], CHUNK, 0, 1))
    assert {(i.input_index, i.segment_index) for i in adopted.items} == {(1, 0)} and sum(i.count for i in adopted.items) == 4
    for segment, offset in ((0, 0), (1, 400)):
        store.put(segment_record_key(ref, 0, segment), record(ref, 0, segment, offset, 400 if segment == 0 else 50).to_bytes())
    second = plan(store, ref)
    assert (second.round, second.chunks, second.planned_chunks) == (2, 5, 9)
    indexes = sorted(c.index for r in StagingArea(store, ref).read_rounds() for item in r.items for c in item.chunks())
    assert indexes == list(range(9))
    assert plan(store, ref).status == "waiting"
    store.put(stream_end_key(ref), StreamEnd([450, 350], [2, 1]).to_bytes())
    assert plan(store, ref).status == "done"


def test_a_stalled_agent_fails_the_plan(tmp_path: Path) -> None:
    store, ref = LocalStore(tmp_path), BackupRef.new("db")
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    with pytest.raises(StagingStalledError, match="stopped uploading"):
        plan(store, ref, idle=20)


def test_items_are_a_few_chunks_only_when_that_still_fills_the_workers() -> None:
    assert chunks_per_item(10, 100, 8) == 1
    assert chunks_per_item(1000, 100, 8) == 8
    assert chunks_per_item(300, 100, 8) == 3


def test_items_stay_full_while_the_stream_is_still_arriving() -> None:
    # A streaming round is about one segment: filling 500 workers with it would
    # make every item a single unoverlapped chunk.
    assert chunks_per_item(32, 500, 8, streaming=True) == 8
    assert chunks_per_item(32, 500, 8, streaming=False) == 1


def test_planner_sizes_items_by_whether_the_stream_ended(tmp_path: Path) -> None:
    store, ref = LocalStore(tmp_path), BackupRef.new("db")
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    store.put(segment_record_key(ref, 0, 0), record(ref, 0, 0, 0, 400).to_bytes())
    streaming = plan(store, ref)  # max_concurrency=2 would want 2 items; streaming keeps items of 3
    assert [i.count for i in StagingArea(store, ref).read_rounds()[0].items] == [3, 1] and streaming.items == 2
    store.put(segment_record_key(ref, 0, 1), record(ref, 0, 1, 400, 400).to_bytes())
    store.put(stream_end_key(ref), StreamEnd([800], [2]).to_bytes())
    ended = plan(store, ref)  # after stream end: spread over both workers
    assert [i.count for i in StagingArea(store, ref).read_rounds()[1].items] == [2, 2] and ended.items == 2


def test_items_carry_their_parts_checksums_and_records_must_list_them(tmp_path: Path) -> None:
    store, ref = LocalStore(tmp_path), BackupRef.new("db")
    items = items_for_segments([record(ref, 0, 0, 0, 400)], CHUNK, 0, 3)
    assert [c.checksum for item in items for c in item.chunks()] == ["part-0", "part-1", "part-2", "part-3"]
    assert MapItem.from_json(items[0].to_json()) == items[0]
    # The planner only sees records the staging area checked: one checksum per part.
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    broken = replace(record(ref, 0, 0, 0, 400), part_checksums=["part-0"])
    store.put(segment_record_key(ref, 0, 0), broken.to_bytes())
    with pytest.raises(IntegrityError, match="lists 1 part checksums for 4 parts"):
        plan(store, ref)
