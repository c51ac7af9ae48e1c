"""The staging area: every record round-trips, and every bad one fails with its one typed error."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from braid.adapters.local.store import LocalStore
from braid.errors import AlreadyExistsError, IntegrityError, NotFoundError
from braid.format.ids import BackupRef
from braid.format.keys import WrappedKey, encryption_context
from braid.format.manifest import ChunkEntry
from braid.format.staging import (
    ItemResult,
    MapItem,
    Round,
    RoundFold,
    SegmentRecord,
    SessionRecord,
    StagingArea,
    StreamEnd,
    parse_segment_key,
    segment_key,
    segment_record_key,
    session_key,
    stream_end_key,
)
from braid.format.staging.keys import WRAPPED_KEY, fold_key, parse_round_key, result_key, round_key, staging_key
from braid.ports.pipeline import PlainStoreJanitor

CHUNK = 100
REPOSITORY = "repo-1"


@pytest.fixture
def area(tmp_path: Path) -> StagingArea:
    return StagingArea(LocalStore(tmp_path), BackupRef.new("db"))


def session_of(area: StagingArea, inputs: int = 2) -> SessionRecord:
    return SessionRecord(str(area.ref), REPOSITORY, CHUNK, 4, 3, [f"in{i}" for i in range(inputs)], "2026-01-01T00:00:00Z")


def record_of(area: StagingArea, input_index: int, segment: int, offset: int, length: int) -> SegmentRecord:
    parts = -(-length // CHUNK)
    key = segment_key(area.ref, input_index, segment)
    return SegmentRecord(input_index, segment, key, offset, length, parts, "crc64nvme:x", [f"crc-{p}" for p in range(parts)])


def wrapped_of(area: StagingArea, key_id: str = "k1", repository: str = REPOSITORY) -> WrappedKey:
    return WrappedKey(key_id, b"\x01\x02" + key_id.encode(), encryption_context(repository, str(area.ref)))


def item_of(area: StagingArea, first_index: int, count: int, segment: int = 0) -> MapItem:
    checksums = tuple(f"crc-{p}" for p in range(count))
    return MapItem(segment_key(area.ref, 0, segment), 0, segment, segment * 4 * CHUNK, count * CHUNK, CHUNK, 1, count, first_index, checksums)


def entries_of(item: MapItem) -> tuple[ChunkEntry, ...]:
    return tuple(ChunkEntry(c.index, item.input_index, c.offset, c.length, 50, "crc64nvme:y", b"\x00" * 32, "zstd") for c in item.chunks())


# -- keys ------------------------------------------------------------------------


def test_listing_parsers_invert_the_key_builders() -> None:
    ref, other = BackupRef.new("db"), BackupRef.new("db2")
    assert parse_segment_key(ref, segment_key(ref, 3, 12)) == (3, 12)
    assert parse_segment_key(ref, segment_key(ref, 0, 123456)) == (0, 123456)
    assert parse_round_key(ref, round_key(ref, 7)) == 7
    for key in (session_key(ref), segment_record_key(ref, 3, 12), segment_key(other, 3, 12), f"{segment_key(ref, 3, 12)}.tmp"):
        assert parse_segment_key(ref, key) is None
    for key in (round_key(other, 7), result_key(ref, 7), stream_end_key(ref), staging_key(ref, WRAPPED_KEY)):
        assert parse_round_key(ref, key) is None


# -- session ---------------------------------------------------------------------


def test_session_round_trips_and_is_written_once(area: StagingArea) -> None:
    session = session_of(area)
    area.write_session(session)
    assert area.read_session() == session
    assert area.store.get(session_key(area.ref)).startswith(b"{")
    with pytest.raises(AlreadyExistsError, match=rf"{area.ref} already has a staging session .*continue it with --resume {area.ref}"):
        area.write_session(session)


def test_a_missing_session_says_the_backup_was_never_staged_or_removed(area: StagingArea) -> None:
    with pytest.raises(NotFoundError, match="no staged session") as caught:
        area.read_session()
    message = str(caught.value)
    assert str(area.ref) in message and area.store.url in message
    assert "never staged" in message and "staging was removed" in message
    assert caught.value.exit_code == 8


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (json.dumps({"backup": "x"}).encode(), "missing repository, chunk_size"),
        (None, "unknown extra"),
        (None, "chunk_size must be a non-negative integer, not '100'"),
        (None, "inputs must be a list of strings"),
        (None, "level must be a non-negative integer, not True"),
    ],
)
def test_a_malformed_session_is_an_integrity_error_naming_its_key(area: StagingArea, body: bytes | None, complaint: str) -> None:
    doc = json.loads(session_of(area).to_bytes())
    if body is None:
        if "extra" in complaint:
            doc["extra"] = 1
        elif "chunk_size" in complaint:
            doc["chunk_size"] = "100"
        elif "inputs" in complaint:
            doc["inputs"] = [1]
        else:
            doc["level"] = True
        body = json.dumps(doc).encode()
    area.store.put(session_key(area.ref), body)
    with pytest.raises(IntegrityError, match=f"staged session {session_key(area.ref)} is malformed: {complaint}"):
        area.read_session()


def test_a_session_of_another_backup_or_with_impossible_settings_is_refused(area: StagingArea) -> None:
    other = BackupRef.new("other")
    area.store.put(session_key(area.ref), replace(session_of(area), backup=str(other)).to_bytes())
    with pytest.raises(IntegrityError, match=f"names {other}, not {area.ref}"):
        area.read_session()
    for bad in (replace(session_of(area), chunk_size=0), replace(session_of(area), segment_chunks=0), replace(session_of(area), inputs=[])):
        area.store.put(session_key(area.ref), bad.to_bytes())
        with pytest.raises(IntegrityError, match="impossible settings"):
            area.read_session()
        with pytest.raises(IntegrityError, match="impossible settings"):
            StagingArea(area.store, area.ref).write_session(bad)


# -- segment records -------------------------------------------------------------


def test_segment_records_round_trip_sorted_by_input_and_segment(area: StagingArea) -> None:
    session = session_of(area)
    written = [record_of(area, 1, 0, 0, 150), record_of(area, 0, 1, 400, 50), record_of(area, 0, 0, 0, 400)]
    for record in written:
        area.write_segment_record(record)
    assert area.read_segment_records(session) == sorted(written, key=lambda r: (r.input_index, r.segment))
    # An empty input's single segment: no parts, no checksums.
    empty = record_of(area, 1, 1, 150, 0)
    area.write_segment_record(empty)
    assert area.read_segment_records(session)[-1] == empty


def test_a_malformed_segment_record_names_its_key(area: StagingArea) -> None:
    key = segment_record_key(area.ref, 0, 0)
    area.store.put(key, b"\xff\xfe")
    with pytest.raises(IntegrityError, match=f"segment record {key} is malformed: not JSON"):
        area.read_segment_records(session_of(area))
    doc = json.loads(record_of(area, 0, 0, 0, 400).to_bytes())
    doc["offset"] = -1
    area.store.put(key, json.dumps(doc).encode())
    with pytest.raises(IntegrityError, match=f"segment record {key} is malformed: offset must be a non-negative integer, not -1"):
        area.read_segment_records(session_of(area))


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"input_index": 2}, "names input 2; the session has 2"),
        ({"key": "data/db/elsewhere"}, "points at data/db/elsewhere, not its own staging object"),
        ({"chunks": 5, "length": 500, "chunk_checksums": ["c"] * 5}, r"impossible sizes \(5 chunks, 500 bytes\)"),
        ({"chunks": 3}, "400 bytes make 4 chunks of 100, record says 3"),
        ({"chunk_checksums": ["crc-0"]}, "lists 1 chunk checksums for 4 chunks"),
    ],
)
def test_a_segment_record_that_disagrees_with_the_session_is_refused(area: StagingArea, change: dict[str, object], complaint: str) -> None:
    record = replace(record_of(area, 0, 0, 0, 400), **change)  # type: ignore[arg-type]
    area.store.put(segment_record_key(area.ref, record.input_index, record.segment), record.to_bytes())
    with pytest.raises(IntegrityError, match=complaint):
        area.read_segment_records(session_of(area))


def test_a_segment_record_stored_under_another_segments_key_is_refused(area: StagingArea) -> None:
    key = segment_record_key(area.ref, 0, 1)
    area.store.put(key, record_of(area, 0, 0, 0, 400).to_bytes())
    with pytest.raises(IntegrityError, match=f"segment record {key} describes in0/seg0, not its own segment"):
        area.read_segment_records(session_of(area))


def test_segment_objects_are_listed_recorded_or_not(area: StagingArea) -> None:
    for input_index, segment in ((0, 0), (0, 1), (1, 0)):
        area.store.put(segment_key(area.ref, input_index, segment), b"x" * 10)
    area.write_segment_record(record_of(area, 0, 0, 0, 10))
    area.write_session(session_of(area))
    assert [(i, s, info.key, info.size) for i, s, info in area.segment_objects()] == [
        (0, 0, segment_key(area.ref, 0, 0), 10),
        (0, 1, segment_key(area.ref, 0, 1), 10),
        (1, 0, segment_key(area.ref, 1, 0), 10),
    ]


# -- stream end ------------------------------------------------------------------


def test_stream_end_round_trips_and_is_absent_until_written(area: StagingArea) -> None:
    assert area.read_stream_end() is None
    end = StreamEnd([450, 0], [2, 1])
    area.write_stream_end(end)
    assert area.read_stream_end() == end


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        (b"", "not JSON"),
        (b'{"lengths": [1]}', "missing segments"),
        (b'{"lengths": [1, 2], "segments": [1]}', "2 lengths for 1 segment counts"),
        (b'{"lengths": [-1], "segments": [1]}', "lengths must be a list of non-negative integers"),
        (b'{"lengths": [1], "segments": [1], "abandoned": 5}', "abandoned must be a string, not 5"),
    ],
)
def test_a_malformed_stream_end_names_its_key(area: StagingArea, body: bytes, complaint: str) -> None:
    area.store.put(stream_end_key(area.ref), body)
    with pytest.raises(IntegrityError, match=f"stream-end record {stream_end_key(area.ref)} is malformed: {complaint}"):
        area.read_stream_end()


def test_a_stream_end_for_other_inputs_is_refused(area: StagingArea) -> None:
    with pytest.raises(IntegrityError, match="describes 1 inputs; the session has 2"):
        StreamEnd([10], [1]).check(area.ref, session_of(area))


# -- wrapped data key ------------------------------------------------------------


def test_wrapped_key_round_trips_and_a_racing_writers_key_wins(area: StagingArea) -> None:
    assert area.read_wrapped_key(REPOSITORY) is None
    first = wrapped_of(area, "k1")
    assert area.write_wrapped_key(first) == first
    assert area.read_wrapped_key(REPOSITORY) == first
    assert area.write_wrapped_key(wrapped_of(area, "k2")) == first
    assert area.read_wrapped_key(REPOSITORY) == first


def test_a_wrapped_key_bound_elsewhere_or_malformed_is_refused(area: StagingArea) -> None:
    with pytest.raises(IntegrityError, match="refusing to stage a data key bound to"):
        area.write_wrapped_key(WrappedKey("k1", b"x", encryption_context(REPOSITORY, str(BackupRef.new("other")))))
    area.write_wrapped_key(wrapped_of(area))
    with pytest.raises(IntegrityError, match=f"staged data key of {area.ref} is bound to .*, not to this backup"):
        area.read_wrapped_key("another-repository")
    area.store.put(staging_key(area.ref, WRAPPED_KEY), b'{"key_id": "k1"}')
    with pytest.raises(IntegrityError, match=f"staged data key {staging_key(area.ref, WRAPPED_KEY)} of {area.ref} is malformed"):
        area.read_wrapped_key(REPOSITORY)


# -- plan rounds -----------------------------------------------------------------


def test_rounds_round_trip_and_a_written_round_is_adopted(area: StagingArea) -> None:
    assert area.read_rounds() == []
    first = area.write_round(1, [item_of(area, 0, 3), item_of(area, 3, 1)])
    second = area.write_round(2, [item_of(area, 4, 2, segment=1)])
    assert area.read_rounds() == [first, second]
    assert (first.key, first.chunk_count, first.end_index, second.end_index) == (round_key(area.ref, 1), 4, 4, 6)
    assert area.write_round(2, [item_of(area, 4, 4, segment=2)]) == second


def test_rounds_that_do_not_chain_are_refused(area: StagingArea) -> None:
    area.write_round(1, [item_of(area, 0, 2)])
    area.store.put(round_key(area.ref, 3), Round(3, round_key(area.ref, 3), (item_of(area, 2, 1),)).to_bytes())
    with pytest.raises(IntegrityError, match=f"plan rounds of {area.ref} skip from 1 to 3"):
        area.read_rounds()
    area.store.delete([round_key(area.ref, 3)])
    area.write_round(2, [item_of(area, 5, 1)])
    with pytest.raises(IntegrityError, match="starts chunk indexes at 5, expected 2"):
        area.read_rounds()


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        (b"nope", "malformed: not JSON"),
        (b"[]", "not a non-empty list of map items"),
        (b'[{"segment": "s"}]', "map item .* is malformed: missing input"),
    ],
)
def test_a_malformed_round_names_its_key(area: StagingArea, body: bytes, complaint: str) -> None:
    area.store.put(round_key(area.ref, 1), body)
    with pytest.raises(IntegrityError, match=f"plan round {round_key(area.ref, 1)}.*{complaint}"):
        area.read_rounds()


def test_an_impossible_map_item_is_refused() -> None:
    item = item_of(StagingArea(LocalStore(Path("/nonexistent")), BackupRef.new("db")), 0, 2)
    assert MapItem.from_json(item.to_json()) == item
    with pytest.raises(IntegrityError, match="impossible map item"):
        MapItem.from_json({**item.to_json(), "crc": ["only-one"]})


# -- results ---------------------------------------------------------------------


def test_results_round_trip_and_count_as_progress(area: StagingArea) -> None:
    found = area.write_round(1, [item_of(area, 0, 3), item_of(area, 3, 1)])
    assert area.processed_chunks([found]) == 0
    first, second = found.items
    assert area.write_result(ItemResult(0, entries_of(first))) == result_key(area.ref, 0)
    assert area.processed_chunks([found]) == 3
    with pytest.raises(IntegrityError, match=f"chunks 3..3 of backup {area.ref} were never stored"):
        area.read_results([found])
    area.write_result(ItemResult(3, entries_of(second)))
    assert area.processed_chunks([found]) == 4
    assert area.read_results([found]) == [*entries_of(first), *entries_of(second)]


def test_a_result_that_is_truncated_or_disagrees_with_its_item_is_refused(area: StagingArea) -> None:
    found = area.write_round(1, [item_of(area, 0, 2)])
    (item,) = found.items
    key = result_key(area.ref, 0)
    doc = json.loads(ItemResult(0, entries_of(item)).to_bytes())
    area.store.put(key, json.dumps({**doc, "count": 3}).encode())
    with pytest.raises(IntegrityError, match=f"result record {key} is truncated"):
        area.read_results([found])
    area.store.put(key, b"{}")
    with pytest.raises(IntegrityError, match=f"result record {key} is malformed"):
        area.read_results([found])
    area.write_result(ItemResult(0, entries_of(item)[:1]))
    with pytest.raises(IntegrityError, match="lists 1 chunks, the plan 2"):
        area.read_results([found])
    shifted = tuple(replace(e, offset=e.offset + 1) for e in entries_of(item))
    area.write_result(ItemResult(0, shifted))
    with pytest.raises(IntegrityError, match="describes chunk 0 of input 0 at 1\\+100; the plan says input 0 at 0\\+100"):
        area.read_results([found])


# -- folds: a map's results merged by the planner ---------------------------------


def test_a_fold_stands_in_for_its_records_and_unfolded_items_are_read_from_theirs(area: StagingArea) -> None:
    found = area.write_round(1, [item_of(area, 0, 3), item_of(area, 3, 1)])
    first, second = found.items
    area.write_result(ItemResult(0, entries_of(first)))
    area.write_result(ItemResult(3, entries_of(second)))

    assert area.fold_results(1, 0, [first]) == fold_key(area.ref, 1, 0)
    # A late or retried worker rewrites, or the record goes: the fold already has it.
    area.store.delete([result_key(area.ref, 0)])
    assert area.read_results([found]) == [*entries_of(first), *entries_of(second)]  # the second from its own record
    assert RoundFold.from_bytes(area.store.get(fold_key(area.ref, 1, 0)), "k") == RoundFold(1, 0, (ItemResult(0, entries_of(first)),))


def test_an_item_with_neither_fold_nor_record_was_never_stored(area: StagingArea) -> None:
    found = area.write_round(1, [item_of(area, 0, 2), item_of(area, 2, 2)])
    first, second = found.items
    area.write_result(ItemResult(0, entries_of(first)))
    area.fold_results(1, 0, [first, second])  # the second has no record: folded without it
    with pytest.raises(IntegrityError, match=f"chunks 2..3 of backup {area.ref} were never stored"):
        area.read_results([found])


def test_a_record_that_disagrees_with_its_item_is_not_folded_and_finalize_still_refuses_it(area: StagingArea) -> None:
    found = area.write_round(1, [item_of(area, 0, 2)])
    (item,) = found.items
    area.write_result(ItemResult(0, entries_of(item)[:1]))
    assert area.fold_results(1, 0, [item]) is None
    assert list(area.store.list(fold_key(area.ref, 1, 0))) == []
    with pytest.raises(IntegrityError, match="lists 1 chunks, the plan 2"):
        area.read_results([found])


def test_a_fold_that_disagrees_with_the_plan_or_is_malformed_is_refused(area: StagingArea) -> None:
    found = area.write_round(1, [item_of(area, 0, 2)])
    (item,) = found.items
    shifted = tuple(replace(e, offset=e.offset + 1) for e in entries_of(item))
    key = fold_key(area.ref, 1, 0)
    area.write_result(ItemResult(0, entries_of(item)))  # the record is right, the fold is not: the fold is what counts
    area.store.put(key, RoundFold(1, 0, (ItemResult(0, shifted),)).to_bytes())
    with pytest.raises(IntegrityError, match="describes chunk 0 of input 0 at 1\\+100; the plan says input 0 at 0\\+100"):
        area.read_results([found])
    for body, complaint in [(b"nope", "not JSON"), (b'{"round": 1, "attempt": 0}', "malformed"), (b'{"round": 1, "attempt": 0, "items": [{}]}', "malformed")]:
        area.store.put(key, body)
        with pytest.raises(IntegrityError, match=f"result fold {key}.*{complaint}"):
            area.read_results([found])


# -- the results index: one reader path ------------------------------------------


class CountingGets(LocalStore):
    """Counts GETs, to show what the results index saves a reader."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gets: list[str] = []

    def get(self, key: str) -> bytes:
        self.gets.append(key)
        return super().get(key)


def three_finished_rounds(area: StagingArea) -> list[Round]:
    """Rounds 1..3 (2 items, 1, 1), every result recorded; rounds 1 and 2's maps folded."""
    rounds = [
        area.write_round(1, [item_of(area, 0, 2), item_of(area, 2, 2)]),
        area.write_round(2, [item_of(area, 4, 3, segment=1)]),
        area.write_round(3, [item_of(area, 7, 1, segment=1)]),
    ]
    for found in rounds:
        for item in found.items:
            area.write_result(ItemResult(item.first_index, entries_of(item)))
    area.fold_results(1, 0, rounds[0].items)
    area.fold_results(2, 0, rounds[1].items)
    return rounds


def test_the_results_index_stands_in_for_the_records_it_holds(tmp_path: Path) -> None:
    area = StagingArea(CountingGets(tmp_path), BackupRef.new("db"))
    rounds = three_finished_rounds(area)
    expected = [entry for found in rounds for item in found.items for entry in entries_of(item)]
    # Late workers rewrite, records go: the folds already have them.
    area.store.delete([result_key(area.ref, i) for i in (0, 2, 4)])
    store = area.store
    assert isinstance(store, CountingGets)
    store.gets.clear()

    assert area.read_results(rounds) == expected
    # A GET per fold, then the record of round 3's item, which no fold holds: none of what the index holds.
    assert sorted(store.gets) == sorted([fold_key(area.ref, 1, 0), fold_key(area.ref, 2, 0), result_key(area.ref, 7)])


def test_without_the_index_the_same_reader_reads_every_record(area: StagingArea) -> None:
    rounds = three_finished_rounds(area)
    expected = [entry for found in rounds for item in found.items for entry in entries_of(item)]
    area.store.delete([fold_key(area.ref, 1, 0), fold_key(area.ref, 2, 0)])  # the planner indexed nothing (--no-policy results_index)
    assert area.read_results(rounds) == expected
    area.write_result(ItemResult(4, entries_of(rounds[1].items[0])[:1]))  # round 2's record disagrees with its item
    with pytest.raises(IntegrityError, match="lists 1 chunks, the plan 3"):
        area.read_results(area.read_rounds())


# -- removal ---------------------------------------------------------------------


def test_remove_deletes_every_staging_object_and_nothing_else(area: StagingArea) -> None:
    area.write_session(session_of(area))
    area.write_segment_record(record_of(area, 0, 0, 0, 10))
    area.store.put(segment_key(area.ref, 0, 0), b"x" * 10)
    area.write_round(1, [item_of(area, 0, 1)])
    neighbour = StagingArea(area.store, BackupRef.new("db2"))
    neighbour.write_session(session_of(neighbour))
    assert area.remove(PlainStoreJanitor()) == 4
    assert list(area.store.list(area.prefix)) == []
    assert neighbour.read_session() == session_of(neighbour)
