"""The worker's item pipeline (braid.pipeline.item_flow): reads ahead in ranges, even packs, bounded buffers, clean failure."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from braid import contract
from braid.adapters.local.store import LocalStore
from braid.errors import IntegrityError, StorageError
from braid.format.buffers import WritableBuffer
from braid.format.chunk import ChunkCodec
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.layout import chunk_key
from braid.format.manifest import ChunkEntry
from braid.format.staging import MapItem, StagingArea
from braid.pipeline import item_flow
from braid.pipeline.item_flow import ChunkLanes, buffers_per_item, chunk_buffers, ranges_of
from braid.pipeline.plan import plan_next_round
from braid.pipeline.prepare import load_data_key, prepare_backup
from braid.pipeline.worker import pack_sizes, process_item
from support.staged_stream import kms_repository, stage_stream

CHUNK = 64 * 1024
PARTS = 16
DATA = b"".join(f"row {i:08d} ".encode() * 4 + bytes([i % 251]) * 200 for i in range(16_000))[: CHUNK * PARTS - 1000]


@dataclass
class Item:
    store: LocalStore
    ref: BackupRef
    item: MapItem
    key: DataKey


@pytest.fixture
def staged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Item:
    monkeypatch.setattr(item_flow, "MIN_RANGE_BYTES", 16 * 1024)  # 64 KiB chunks read in four ranges, as 64 MiB ones are
    store, keys, repository_id = kms_repository(tmp_path)
    ref = BackupRef.new("db")
    stage_stream(store, ref, repository_id, DATA, chunk=CHUNK, segment_chunks=PARTS)
    prepare_backup(store, keys, ref)
    key, _ = load_data_key(store, keys, ref, repository_id)
    assert plan_next_round(store, ref, max_concurrency=1, max_chunks_per_item=PARTS, poll_seconds=1, stall_seconds=60).status == "ready"
    (item,) = StagingArea(store, ref).read_rounds()[0].items
    assert item.count == PARTS
    return Item(store, ref, item, key)


class RecordingStore:
    """The store, recording each ranged read (start, length) and what is in flight; optionally slow or failing."""

    def __init__(self, inner: LocalStore, *, into: bool = True, delay: float = 0.0, fail_at: int | None = None, short_at: int | None = None) -> None:
        self.inner = inner
        self.url = inner.url
        self.ranges: list[tuple[int, int]] = []
        self.delay, self.fail_at, self.short_at = delay, fail_at, short_at
        self.in_flight = 0
        self.lock = threading.Lock()
        self.into = into

    def __getattr__(self, name: str) -> Any:
        if name == "get_range_into":
            if not self.into:
                raise AttributeError(name)  # a store that can only return its own bytes
            return self._get_range_into
        return getattr(self.inner, name)

    def _enter(self, start: int, length: int) -> None:
        with self.lock:
            self.ranges.append((start, length))
            self.in_flight += 1
        if self.fail_at is not None and start == self.fail_at:
            with self.lock:
                self.in_flight -= 1
            raise StorageError("SlowDown: injected")
        time.sleep(self.delay)

    def _exit(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def _get_range_into(self, key: str, start: int, length: int, buffer: WritableBuffer) -> memoryview:
        self._enter(start, length)
        try:
            got = self.inner.get_range_into(key, start, length, buffer)
            return got[: length // 2] if start == self.short_at else got
        finally:
            self._exit()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self._enter(start, length)
        try:
            return self.inner.get_range(key, start, length)
        finally:
            self._exit()


def plaintext_of(store: Any, ref: BackupRef, key: DataKey, entries: tuple[ChunkEntry, ...]) -> bytes:
    codec = ChunkCodec(key)
    return b"".join(
        bytes(codec.decode(store.get_range(chunk_key(ref, e.pack), e.pack_offset, e.stored_length), backup=str(ref), index=e.index,
                           input_index=e.input_index, plaintext_length=e.length, plaintext_mac=e.mac))
        for e in entries
    )


def test_packs_are_as_even_as_possible_larger_first_and_cover_the_item_in_order() -> None:
    assert pack_sizes(32, 5) == [5, 5, 5, 5, 4, 4, 4]  # a streaming item: one segment
    assert pack_sizes(16, 5) == [4, 4, 4, 4]
    assert pack_sizes(9, 5) == [5, 4]
    assert pack_sizes(1, 5) == [1] and pack_sizes(2, 5) == [2] and pack_sizes(4, 5) == [4] and pack_sizes(0, 5) == []
    assert pack_sizes(16, 1) == [1] * 16
    for count in range(1, 70):
        for limit in (1, 2, 3, 5, 8):
            sizes = pack_sizes(count, limit)
            assert sum(sizes) == count and max(sizes) <= limit and min(sizes) >= 1
            assert len(sizes) == -(-count // limit)  # the fewest PUTs the limit allows
            assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1  # even, larger first


def test_ranges_cover_a_chunk_exactly_and_small_chunks_are_one_read() -> None:
    for length in (1, 5, 8 * 2**20, 64 * 2**20, 64 * 2**20 + 7, 75 * 2**20):
        found = ranges_of(length)
        assert found[0][0] == 0 and sum(n for _, n in found) == length
        assert all(a + n == b for (a, n), (b, _) in zip(found, found[1:], strict=False))
    assert len(ranges_of(64 * 2**20)) == item_flow.CHUNK_RANGES and ranges_of(8 * 2**20) == [(0, 8 * 2**20)]


@pytest.mark.parametrize("into", [True, False], ids=["reads into the pooled buffers", "store returns its own bytes"])
def test_the_first_chunks_are_read_in_ranges_the_rest_whole_and_the_item_stores_every_byte(staged: Item, into: bool) -> None:
    store = RecordingStore(staged.store, into=into)
    outcome = process_item(store, staged.ref, staged.item, key=staged.key, level=3, lanes=ChunkLanes(3))  # type: ignore[arg-type]

    entries = outcome.result.entries
    assert plaintext_of(staged.store, staged.ref, staged.key, entries) == DATA
    ranged = item_flow.FIRST_RANGED_CHUNKS
    expected = [(i * CHUNK + start, n) for i in range(ranged) for start, n in ranges_of(CHUNK)]
    expected += [(i * CHUNK, min(CHUNK, len(DATA) - i * CHUNK)) for i in range(ranged, PARTS)]
    assert sorted(store.ranges) == sorted(expected) and len(ranges_of(CHUNK)) == 4
    # Packs as pack_sizes lays them out, each its own object from its first chunk.
    firsts = sorted({e.pack for e in entries})
    sizes = [sum(1 for e in entries if e.pack == first) for first in firsts]
    assert sizes == pack_sizes(PARTS, contract.CHUNKS_PER_PACK)


def test_a_short_range_fails_the_item_naming_the_chunk(staged: Item) -> None:
    store = RecordingStore(staged.store, short_at=ranges_of(CHUNK)[1][0])
    with pytest.raises(IntegrityError, match=r"chunk 1 of staging/.* is \d+ bytes or shorter, the segment record implies 65536"):
        process_item(store, staged.ref, staged.item, key=staged.key, level=3, lanes=ChunkLanes(2))  # type: ignore[arg-type]
    assert StagingArea(staged.store, staged.ref).first_failure() is not None  # the item's failure record, for Cleanup


def test_a_failure_waits_for_every_read_it_started_before_it_is_raised(staged: Item) -> None:
    """A read still writing into a pooled buffer after the invocation failed would corrupt the container's next item."""
    store = RecordingStore(staged.store, delay=0.05, fail_at=5 * CHUNK)
    lanes = ChunkLanes(4)
    with pytest.raises(StorageError, match="SlowDown: injected"):
        process_item(store, staged.ref, staged.item, key=staged.key, level=3, lanes=lanes)  # type: ignore[arg-type]
    assert store.in_flight == 0
    assert len(lanes.pooled) >= 1  # every buffer the item took is back in the pool
    again = process_item(staged.store, staged.ref, staged.item, key=staged.key, level=3, lanes=lanes)  # the next invocation, same container
    assert plaintext_of(staged.store, staged.ref, staged.key, again.result.entries) == DATA


def test_the_buffers_an_item_holds_stay_within_the_budget_while_puts_are_slow(staged: Item, monkeypatch: pytest.MonkeyPatch) -> None:
    lanes = ChunkLanes(2)
    held: list[int] = [0, 0]  # now, most
    lock = threading.Lock()
    take, give_back = lanes.take, lanes.give_back

    def counting_take(size: int) -> WritableBuffer:
        with lock:
            held[0] += 1
            held[1] = max(held[1], held[0])
        return take(size)

    def counting_give_back(buffers: Any) -> None:
        with lock:
            held[0] -= len(buffers)
        give_back(buffers)

    monkeypatch.setattr(lanes, "take", counting_take)
    monkeypatch.setattr(lanes, "give_back", counting_give_back)
    put = staged.store.put

    def slow_put(key: str, *args: Any, **kwargs: Any) -> None:
        if key.startswith("data/"):
            time.sleep(0.2)  # packs: S3 slower than the codec
        put(key, *args, **kwargs)

    monkeypatch.setattr(staged.store, "put", slow_put)
    process_item(staged.store, staged.ref, staged.item, key=staged.key, level=3, lanes=lanes)
    assert held[1] <= buffers_per_item(2, contract.CHUNKS_PER_PACK) < PARTS
    assert chunk_buffers(contract.DEFAULT_WORKER_LANES, contract.CHUNKS_PER_PACK) == buffers_per_item(4, contract.CHUNKS_PER_PACK) + 2 * item_flow.ENCODERS
