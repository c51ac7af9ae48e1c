"""Worker: one map item, a few consecutive parts of a staging segment.

Each chunk is a ranged GET of its part. The item's chunks are stored in the
packs the planner chose (MapItem.packs), one create-only PUT each
(braid.engine.chunk_worker.put_pack), so a retried or late worker forms the
same packs and never replaces a published one; they flow through
braid.pipeline.item_flow. The item's result goes to staging (an ItemResult
record); a failing worker first writes an ItemFailure record, so Cleanup
can name its real error (on AWS the map reports only
States.ExceedToleratedFailureThreshold). The data key is unwrapped once per
container and backup (DataKeyCache): KMS Decrypt is billed per request.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Any

from braid.contract import CHUNKS_PER_PACK
from braid.errors import IntegrityError, NotFoundError
from braid.format.checksum import crc64nvme, encode_crc64nvme
from braid.format.chunk import Buffer, stored_size
from braid.format.ids import BackupRef
from braid.format.keys import DataKey, WrappedKey
from braid.format.staging import ChunkSlice, ItemFailure, ItemResult, MapItem, StagingArea, segment_key
from braid.format.staging.rounds import pack_sizes
from braid.pipeline.failure import invalid_input
from braid.pipeline.item_flow import ChunkLanes, store_item_chunks
from braid.pipeline.prepare import load_data_key
from braid.ports.keys import KeyService
from braid.ports.store import ObjectStore, read_range
from braid.ports.usage import InvocationMeter

__all__ = ["ChunkLanes", "DataKeyCache", "WorkerEvent", "pack_sizes", "packs_of", "process_item"]

RESULT_PUT = "s3:PutObject"  # the request that writes the result record


@dataclass(frozen=True)
class WorkerEvent:
    """What the map's ItemSelector gives each worker: the backup, its repository and level, one item."""

    ref: BackupRef
    prefix: str
    repository: str
    level: int
    item: MapItem

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> WorkerEvent:
        with invalid_input("invalid worker event"):
            ref = BackupRef.parse(str(event["backup"]))
            prefix, repository, level = str(event.get("prefix", "")), str(event["repository"]), int(event["level"])
            item = MapItem.from_json(event["item"])
        return cls(ref, prefix, repository, level, item)


class DataKeyCache:
    """Unwrapped data keys by repository and backup; small, since a container serves few backups."""

    def __init__(self, keys: KeyService, capacity: int = 4) -> None:
        self._keys = keys
        self._capacity = capacity
        self._cache: OrderedDict[tuple[str, str], tuple[DataKey, WrappedKey]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store: ObjectStore, ref: BackupRef, repository_id: str) -> tuple[DataKey, WrappedKey]:
        slot = (store.url, str(ref))
        with self._lock:
            if slot in self._cache:
                self._cache.move_to_end(slot)
                return self._cache[slot]
            found = load_data_key(store, self._keys, ref, repository_id)
            self._cache[slot] = found
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
            return found


@dataclass(frozen=True)
class ItemOutcome:
    result: ItemResult
    bytes_in: int
    bytes_out: int
    seconds: float

    @property
    def ratio(self) -> float:
        return self.bytes_out / self.bytes_in if self.bytes_in else 1.0

    @property
    def seconds_per_chunk(self) -> float:
        return self.seconds / max(1, len(self.result.entries))


def check_item(ref: BackupRef, item: MapItem) -> None:
    """An item may only read its own backup's staging segment."""
    if item.segment != segment_key(ref, item.input_index, item.segment_index):
        raise IntegrityError(f"map item names {item.segment}, which is not a staging segment of {ref}")


def read_part_range(store: ObjectStore, ref: BackupRef, item: MapItem, piece: ChunkSlice, start: int, length: int, view: memoryview) -> Buffer:
    """`length` staged bytes of a part from `start` within it, read into `view` where the store can."""
    try:
        data = read_range(store, item.segment, piece.start + start, length, view)
    except NotFoundError:
        raise IntegrityError(f"staging segment {item.segment} of {ref} is gone: the backup was cleaned up or expired") from None
    if len(data) != length:
        raise IntegrityError(
            f"chunk {piece.position} of {item.segment} is {start + len(data)} bytes or shorter, the segment record implies {piece.length}"
        )
    return data


def check_part(ref: BackupRef, item: MapItem, piece: ChunkSlice, data: Buffer) -> None:
    """The part as read must be the part the agent staged: its CRC64NVME, from the segment record."""
    if encode_crc64nvme(crc64nvme(data)) != piece.checksum:
        raise IntegrityError(
            f"chunk {piece.position} of {item.segment} (chunk {piece.index} of {ref}) does not match the checksum the agent"
            " recorded: the staged bytes changed between the host and the worker"
        )


def packs_of(pieces: Sequence[ChunkSlice], sizes: Iterable[int]) -> list[list[ChunkSlice]]:
    """The item's chunks as packs of consecutive chunks, of `sizes` (MapItem.packs)."""
    return [list(pieces[start:end]) for start, end in pairwise([0, *accumulate(sizes)])]


class StreamEnded:
    """Whether the backup's stream has ended (a cut item's stop test): one GET of the stream-end record per pack
    boundary until it has, then remembered; the encoders ask one at a time, so no GET follows the one that found it."""

    def __init__(self, area: StagingArea) -> None:
        self._area = area
        self._ended = False
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        with self._lock:
            if not self._ended:
                self._ended = self._area.read_stream_end() is not None
            return self._ended


def process_item(
    store: ObjectStore,
    ref: BackupRef,
    item: MapItem,
    *,
    key: DataKey,
    level: int,
    lanes: ChunkLanes,
    meter: InvocationMeter | None = None,
    chunks_per_pack: int = CHUNKS_PER_PACK,
) -> ItemOutcome:
    """Store the item's chunks and write its result record; `meter`: the invocation's, whose usage the record carries."""
    try:
        check_item(ref, item)
        if max(item.packs) > chunks_per_pack:
            raise IntegrityError(f"map item for chunks {item.first_index}.. of {ref} has a pack of {max(item.packs)} chunks; this worker holds {chunks_per_pack}")
        started = time.monotonic()
        pieces = item.chunks()
        entries = tuple(
            store_item_chunks(
                lanes, store, ref, packs_of(pieces, item.packs), chunks_per_pack=chunks_per_pack,
                input_index=item.input_index, stop=StreamEnded(StagingArea(store, ref)) if item.cut else None,
                buffer_size=stored_size(str(ref), max(piece.length for piece in pieces)), key=key, level=level,
                fetch_range=lambda piece, start, length, view: read_part_range(store, ref, item, piece, start, length, view),
                check=lambda piece, data: check_part(ref, item, piece, data),
            )
        )
        # The usage so far and the record's own PUT, which is counted before it is made.
        usage = meter.usage(pending={RESULT_PUT: 1}) if meter is not None else None
        result = ItemResult(item.first_index, entries, usage)
        StagingArea(store, ref).write_result(result)
        return ItemOutcome(
            result,
            bytes_in=sum(e.length for e in entries),
            bytes_out=sum(e.stored_length for e in entries),
            seconds=time.monotonic() - started,
        )
    except Exception as exc:
        record_failure(store, ref, item, exc)
        raise


def record_failure(store: ObjectStore, ref: BackupRef, item: MapItem, exc: Exception) -> None:
    """Best-effort: the record only explains the failure, so failing to write it must not hide the error."""
    try:
        StagingArea(store, ref).write_failure(ItemFailure(item.first_index, item.count, type(exc).__name__, str(exc)))
    except Exception:  # the original error is what the map must see
        pass
