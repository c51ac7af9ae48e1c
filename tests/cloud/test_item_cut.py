"""Cut items (braid.format.staging.MapItem.cut): a streaming item's worker stops at a pack boundary once the stream has ended,
and the items that finish it store the rest in exactly the packs the cut item would have written."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from test_item_flow import CHUNK, DATA, PARTS, Item, plaintext_of, staged  # noqa: F401  (the fixture)

from braid import contract
from braid.errors import IntegrityError, NotFoundError
from braid.format.staging import ItemResult, MapItem, StagingArea
from braid.format.staging.keys import stream_end_key
from braid.format.staging.rounds import pack_sizes
from braid.pipeline.item_flow import ChunkLanes
from braid.pipeline.worker import process_item

LAYOUT = pack_sizes(PARTS, contract.CHUNKS_PER_PACK)  # [5, 5, 3, 2, 1]


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
    store = hiding(staged, hidden=2)  # not ended at the first two pack boundaries (after 5 and 10 chunks)
    item = replace(staged.item, cut=True)
    outcome = process_item(store, staged.ref, item, key=staged.key, level=3, lanes=ChunkLanes(3))  # type: ignore[arg-type]

    done = sum(LAYOUT[:3])
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
    pieces = rest.split(2)  # whole packs, at most ~2 chunks each: [3], [2], [1]
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
    assert rest.packs() == LAYOUT[1:]

    doc = rest.to_json()
    with pytest.raises(IntegrityError, match=r"splits the pack of parts 6\.\.10 of its layout"):
        MapItem.from_json({**doc, "first_part": 7, "first_index": rest.first_index + 1, "count": rest.count - 1, "crc": doc["crc"][1:]})
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
    with pytest.raises(IntegrityError, match=r"lists 5 chunks, the plan 16"):
        prefix.check(staged.item, backup)  # an item that may not be cut must be stored whole
    with pytest.raises(IntegrityError, match=r"lists 6 chunks, the plan 16"):
        ItemResult(full.first_index, full.entries[: LAYOUT[0] + 1]).check(cut_item, backup)  # not a pack boundary
    with pytest.raises(IntegrityError, match=r"lists 0 chunks"):
        ItemResult(full.first_index, ()).check(cut_item, backup)
    assert not full.is_cut(cut_item) and prefix.is_cut(cut_item)
