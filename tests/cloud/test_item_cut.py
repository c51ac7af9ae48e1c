"""Cut items (braid.format.staging.MapItem.cut): a streaming item's worker stops at a pack boundary once the stream has ended,
and the items that finish it store the rest in exactly the packs the cut item would have written."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_item_flow import CHUNK, DATA, PARTS, Item, plaintext_of, staged  # noqa: F401  (the fixture)

from braid import contract
from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.errors import IntegrityError, NotFoundError
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.layout import manifest_key
from braid.format.manifest import open_manifest
from braid.format.staging import ItemResult, MapItem, StagingArea
from braid.format.staging.keys import fold_key, result_key, stream_end_key
from braid.format.staging.rounds import pack_sizes
from braid.ops.chunk_reader import ChunkReader
from braid.pipeline.finalize import finalize_step
from braid.pipeline.item_flow import ChunkLanes
from braid.pipeline.plan import plan_next_round
from braid.pipeline.prepare import load_data_key, prepare_backup
from braid.pipeline.worker import process_item
from braid.ports.pipeline import PlainStoreJanitor, RecordingPublisher
from support.staged_stream import kms_repository, stage_stream

LAYOUT = pack_sizes(PARTS, contract.CHUNKS_PER_PACK)  # [4, 4, 4, 4]


class EndAfter:
    """The store, with the stream-end record hidden from its first `hidden` reads (the stream ends during the item)."""

    def __init__(self, inner: Any, end_key: str, hidden: int) -> None:
        self.inner, self.end_key, self.hidden, self.end_reads = inner, end_key, hidden, 0
        self.url = inner.url

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, key: str) -> bytes:
        if key == self.end_key:
            self.end_reads += 1
            if self.end_reads <= self.hidden:
                raise NotFoundError(f"{key} not found")
        return bytes(self.inner.get(key))


def hiding(item: Item, hidden: int) -> EndAfter:
    return EndAfter(item.store, stream_end_key(item.ref), hidden)


def packs_in(entries: tuple[Any, ...]) -> list[int]:
    firsts = sorted({e.pack for e in entries})
    return [sum(1 for e in entries if e.pack == first) for first in firsts]


def test_a_cut_item_stops_at_its_first_pack_boundary_once_the_stream_has_ended(staged: Item) -> None:  # noqa: F811
    item = replace(staged.item, cut=True)
    outcome = process_item(staged.store, staged.ref, item, key=staged.key, level=3, lanes=ChunkLanes(3))

    assert len(outcome.result.entries) == LAYOUT[0] and packs_in(outcome.result.entries) == LAYOUT[:1]
    assert plaintext_of(staged.store, staged.ref, staged.key, outcome.result.entries) == DATA[: LAYOUT[0] * CHUNK]
    area = StagingArea(staged.store, staged.ref)
    (found,) = area.read_item_results([item]).values()  # the record the planner and Finalize read
    assert found.entries == outcome.result.entries
    assert outcome.result.is_cut(item)
    outcome.result.check(item, str(staged.ref))  # a cut prefix of whole packs is a valid result of a cut item


def test_a_stream_that_ends_during_the_item_cuts_it_at_the_next_pack_boundary(staged: Item) -> None:  # noqa: F811
    store = hiding(staged, hidden=2)  # not ended at the first two pack boundaries (after 4 and 8 chunks)
    item = replace(staged.item, cut=True)
    outcome = process_item(store, staged.ref, item, key=staged.key, level=3, lanes=ChunkLanes(3))  # type: ignore[arg-type]

    done = sum(LAYOUT[:3])
    # One codec lane at a time asks whether the stream ended (pipeline.worker.StreamEnded): the third answer stops it.
    assert len(outcome.result.entries) == done and store.end_reads == 3
    assert plaintext_of(staged.store, staged.ref, staged.key, outcome.result.entries) == DATA[: done * CHUNK]


def test_a_cut_item_whose_stream_goes_on_stores_everything_reading_the_end_once_per_boundary(staged: Item) -> None:  # noqa: F811
    store = hiding(staged, hidden=99)
    outcome = process_item(store, staged.ref, replace(staged.item, cut=True), key=staged.key, level=3, lanes=ChunkLanes(3))  # type: ignore[arg-type]

    assert len(outcome.result.entries) == PARTS and packs_in(outcome.result.entries) == LAYOUT
    assert store.end_reads == len(LAYOUT) - 1
    assert plaintext_of(staged.store, staged.ref, staged.key, outcome.result.entries) == DATA


def test_an_item_that_is_not_cut_never_reads_the_stream_end(staged: Item) -> None:  # noqa: F811
    store = hiding(staged, hidden=0)
    outcome = process_item(store, staged.ref, staged.item, key=staged.key, level=3, lanes=ChunkLanes(3))  # type: ignore[arg-type]
    assert len(outcome.result.entries) == PARTS and store.end_reads == 0


def test_the_remainder_is_stored_in_the_cut_items_packs_and_a_late_full_attempt_meets_the_same_objects(staged: Item) -> None:  # noqa: F811
    item = replace(staged.item, cut=True)
    cut = process_item(hiding(staged, hidden=1), staged.ref, item, key=staged.key, level=3, lanes=ChunkLanes(3)).result  # type: ignore[arg-type]
    done = sum(LAYOUT[:2])
    assert len(cut.entries) == done

    rest = item.remainder(done)
    assert (rest.first_index, rest.count, rest.layout, rest.cut) == (item.first_index + done, PARTS - done, (1, PARTS), False)
    pieces = rest.split(2)  # whole packs, one pack at least each: [4], [4]
    assert [p.count for p in pieces] == LAYOUT[2:] and all(p.finishes_cut for p in pieces)
    finished = [process_item(staged.store, staged.ref, p, key=staged.key, level=3, lanes=ChunkLanes(2)).result for p in pieces]
    entries = cut.entries + tuple(e for r in finished for e in r.entries)
    assert plaintext_of(staged.store, staged.ref, staged.key, entries) == DATA
    assert packs_in(entries) == LAYOUT  # the packs the whole item would have written
    for piece, result in zip(pieces, finished, strict=True):
        assert result.first_index == piece.first_index
        result.check(piece, str(staged.ref))

    # A late attempt of the whole item (it never saw the stream end) meets exactly these objects, and accepts them.
    late = process_item(hiding(staged, hidden=99), staged.ref, item, key=staged.key, level=3, lanes=ChunkLanes(3)).result  # type: ignore[arg-type]
    assert [(e.index, e.pack, e.pack_offset, e.stored_length, e.checksum) for e in late.entries] == [
        (e.index, e.pack, e.pack_offset, e.stored_length, e.checksum) for e in entries
    ]


def test_map_items_carry_their_layout_and_cut_flag_and_refuse_one_that_splits_a_pack(staged: Item) -> None:  # noqa: F811
    item = replace(staged.item, cut=True)
    assert MapItem.from_json(item.to_json()) == item and item.to_json()["cut"] is True and "layout" not in item.to_json()
    assert "cut" not in staged.item.to_json()  # an ordinary item's JSON is what it always was
    rest = item.remainder(LAYOUT[0])
    assert MapItem.from_json(rest.to_json()) == rest and rest.to_json()["layout"] == [1, PARTS]
    assert list(rest.packs) == LAYOUT[1:]

    doc = rest.to_json()
    second = (LAYOUT[0], LAYOUT[0] + LAYOUT[1] - 1)  # the chunk indexes of the layout's second pack
    with pytest.raises(IntegrityError, match=rf"splits the pack of chunks {second[0]}\.\.{second[1]}"):
        rest.piece(1, rest.count - 1)
    with pytest.raises(IntegrityError, match=rf"has packs {list(rest.packs)} for {rest.count - 1} chunks".replace("[", "\\[").replace("]", "\\]")):
        MapItem.from_json({**doc, "first_chunk": doc["first_chunk"] + 1, "first_index": rest.first_index + 1, "count": rest.count - 1, "crc": doc["crc"][1:]})
    with pytest.raises(IntegrityError, match="impossible map item"):
        MapItem.from_json({**doc, "layout": [7, 4]})  # the layout must hold the item
    with pytest.raises(IntegrityError, match="cut must be true or false"):
        MapItem.from_json({**doc, "cut": "yes"})
    with pytest.raises(IntegrityError, match="no remainder after"):
        item.remainder(PARTS)


def test_a_result_may_stop_short_only_for_a_cut_item_and_only_at_a_pack_boundary(staged: Item) -> None:  # noqa: F811
    full = process_item(staged.store, staged.ref, staged.item, key=staged.key, level=3, lanes=ChunkLanes(3)).result
    backup = str(staged.ref)
    cut_item = replace(staged.item, cut=True)
    prefix = ItemResult(full.first_index, full.entries[: LAYOUT[0]])
    prefix.check(cut_item, backup)
    with pytest.raises(IntegrityError, match=rf"lists {LAYOUT[0]} chunks, the plan {PARTS}"):
        prefix.check(staged.item, backup)  # an item that may not be cut must be stored whole
    with pytest.raises(IntegrityError, match=rf"lists {LAYOUT[0] + 1} chunks, the plan {PARTS}"):
        ItemResult(full.first_index, full.entries[: LAYOUT[0] + 1]).check(cut_item, backup)  # not a pack boundary
    with pytest.raises(IntegrityError, match=r"lists 0 chunks"):
        ItemResult(full.first_index, ()).check(cut_item, backup)
    assert not full.is_cut(cut_item) and prefix.is_cut(cut_item)


# -- the planner and Finalize around cut items ------------------------------------------------------------------------


def streaming_round(tmp_path: Path) -> tuple[LocalStore, LocalKeyFile, BackupRef, DataKey, list[MapItem]]:
    """Two segments of PARTS chunks planned while the stream still arrives (items of PARTS: cut items), then the stream ends."""
    store, keys, repository_id = kms_repository(tmp_path)
    ref = BackupRef.new("db")
    stage_stream(store, ref, repository_id, TWO, chunk=CHUNK, segment_chunks=PARTS)
    end = store.get(stream_end_key(ref))
    store.delete([stream_end_key(ref)])
    prepare_backup(store, keys, ref)
    key, _ = load_data_key(store, keys, ref, repository_id)
    status = plan(store, ref, None)
    assert status.status == "ready"
    items = StagingArea(store, ref).read_items(status.items_key, status.round)
    assert [(i.count, i.cut) for i in items] == [(PARTS, True), (PARTS - 1, True)]
    store.put(stream_end_key(ref), end)
    store.cursor = status.to_json()["cursor"]  # type: ignore[attr-defined]
    return store, keys, ref, key, items


TWO = DATA + bytes(reversed(DATA))[: len(DATA) - CHUNK]  # two segments, the second a chunk short of full


def plan(store: LocalStore, ref: BackupRef, cursor: Any) -> Any:
    return plan_next_round(store, ref, max_concurrency=8, max_chunks_per_item=PARTS, poll_seconds=1, stall_seconds=60, cursor=cursor)


def test_a_round_with_a_cut_item_and_a_failed_one_maps_both_again_and_the_backup_restores_whole(tmp_path: Path) -> None:
    store, keys, ref, key, items = streaming_round(tmp_path)
    area = StagingArea(store, ref)
    cut = process_item(store, ref, items[0], key=key, level=3, lanes=ChunkLanes(2)).result  # the stream has ended: one pack
    assert len(cut.entries) == LAYOUT[0]
    # items[1]'s worker failed: no result.

    status = plan(store, ref, store.cursor)  # type: ignore[attr-defined]
    assert status.status == "ready" and "retry" in status.items_key
    again = area.read_items(status.items_key, status.round)
    assert again == [items[1], items[0].remainder(LAYOUT[0])]  # the failed item, and the cut item's last packs
    assert list(store.list(fold_key(ref, 1, 0)))  # the cut result the planner planned after is folded
    for item in again:
        process_item(store, ref, item, key=key, level=3, lanes=ChunkLanes(2))
    while (status := plan(store, ref, status.to_json()["cursor"])).status != "done":
        assert status.status == "ready", status
        for item in area.read_items(status.items_key, status.round):
            process_item(store, ref, item, key=key, level=3, lanes=ChunkLanes(2))

    summary = finalize_step(store, keys, PlainStoreJanitor(), RecordingPublisher(), ref)

    assert (summary.chunks, summary.plaintext_bytes) == (2 * PARTS - 1, len(TWO))
    manifest = open_manifest(store.get(manifest_key(ref)), "m").authenticate(key)
    reader = ChunkReader(store, manifest, key)
    assert b"".join(bytes(reader.read(chunk, bytearray(CHUNK))) for chunk in manifest.chunks()) == TWO
    assert {chunk.pack for chunk in manifest.chunks()} == {items[0].first_index + sum(LAYOUT[:n]) for n in range(len(LAYOUT))} | {
        items[1].first_index + sum(pack_sizes(items[1].count)[:n]) for n in range(len(pack_sizes(items[1].count)))
    }  # the cut item's chunks are in the packs it would have stored whole


def test_cut_items_left_after_stream_end_are_planned_in_the_final_round_not_a_retry(tmp_path: Path) -> None:
    store, keys, ref, key, items = streaming_round(tmp_path)
    area = StagingArea(store, ref)
    for item in items:
        process_item(store, ref, item, key=key, level=3, lanes=ChunkLanes(2))

    status = plan(store, ref, store.cursor)  # type: ignore[attr-defined]
    assert status.status == "ready" and "round-00002" in status.items_key
    final = area.read_items(status.items_key, status.round)
    assert all(item.finishes_cut and not item.cut for item in final)
    assert sum(i.count for i in final) == sum(i.count - pack_sizes(i.count)[0] for i in items)  # every chunk the cut items left
    assert all(i.packs for i in final)  # whole packs of their cut item's packs (piece() refuses a split one)
    for item in final:
        process_item(store, ref, item, key=key, level=3, lanes=ChunkLanes(2))
    assert plan(store, ref, status.to_json()["cursor"]).status == "done"
    summary = finalize_step(store, keys, PlainStoreJanitor(), RecordingPublisher(), ref)
    assert summary.plaintext_bytes == len(TWO)
    assert area.read_rounds() == []  # staging is gone once published


def test_finalize_takes_a_cut_items_longer_record_where_the_items_after_the_planners_prefix_left_a_gap(tmp_path: Path) -> None:
    """A planner call retried after a late attempt rewrote a cut record can fold a longer prefix than the one it
    planned the rest after; Finalize then finds no record where the fold ends, and reads on from the cut item's own."""
    store, keys, ref, key, items = streaming_round(tmp_path)
    area = StagingArea(store, ref)
    for item in items:
        process_item(store, ref, item, key=key, level=3, lanes=ChunkLanes(2))
    status = plan(store, ref, store.cursor)  # type: ignore[attr-defined]
    final = area.read_items(status.items_key, status.round)
    for item in final:
        process_item(store, ref, item, key=key, level=3, lanes=ChunkLanes(2))
    assert plan(store, ref, status.to_json()["cursor"]).status == "done"
    first = items[0]
    prefix = ItemResult.from_bytes(store.get(result_key(ref, first.first_index)), "prefix")
    following = [i for i in final if i.layout == (first.first_chunk, first.count)]
    after = ItemResult.from_bytes(store.get(result_key(ref, following[0].first_index)), "after")
    area.write_result(ItemResult(first.first_index, prefix.entries + after.entries))  # a late attempt stored further
    store.delete([result_key(ref, following[0].first_index)])  # and the record where the planner's prefix ends is gone

    summary = finalize_step(store, keys, PlainStoreJanitor(), RecordingPublisher(), ref)
    assert summary.plaintext_bytes == len(TWO)
