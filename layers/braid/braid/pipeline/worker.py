"""Worker: one map item, a few consecutive parts of a staging segment.

Each chunk is a ranged GET of its part (every part is chunk_size bytes but an
input's last, so the range follows from the part number). The item's chunks
are stored in packs of up to CHUNKS_PER_PACK consecutive chunks, one
create-only PUT each (`braid.engine.chunk_worker.store_pack`: the same frames
the local engine writes), so a retried or late worker can never replace a
published pack. Packs follow from the item alone, and round files fix the
items, so a retry forms the same packs.
The item's result goes to staging (an ItemResult record, see
braid.format.staging); the Lambda returns almost nothing.

Chunks of an item run on a few *lanes* (threads, each with its own codec and
a reusable chunk buffer that the ranged GET fills and the codec then writes
the stored chunk over): while one lane compresses, another downloads or
uploads. zstd and AES-GCM `encrypt_into` release the GIL, so on one vCPU the
worker bills about the CPU time instead of CPU + I/O (see item_sizing).

A worker that fails writes its error to staging (an ItemFailure record)
before it re-raises, so Cleanup can tell a person the worker's real error;
on AWS the map itself reports only States.ExceedToleratedFailureThreshold.

The data key is unwrapped once per container and backup (DataKeyCache):
KMS Decrypt is billed and throttled per request.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from braid.contract import CHUNKS_PER_PACK
from braid.engine.chunk_worker import ChunkTask, store_pack
from braid.errors import IntegrityError, NotFoundError, UsageError
from braid.format.buffers import WritableBuffer, new_buffer
from braid.format.checksum import crc64nvme, encode_crc64nvme
from braid.format.chunk import Buffer, ChunkCodec, stored_size
from braid.format.ids import BackupRef
from braid.format.keys import DataKey, WrappedKey
from braid.format.manifest import ChunkEntry
from braid.format.staging import ChunkSlice, ItemFailure, ItemResult, MapItem, StagingArea, segment_key
from braid.pipeline.prepare import load_data_key
from braid.ports.keys import KeyService
from braid.ports.store import ObjectStore, read_range
from braid.ports.usage import InvocationMeter, in_context

T = TypeVar("T")
R = TypeVar("R")

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
        try:
            ref = BackupRef.parse(str(event["backup"]))
            prefix, repository, level = str(event.get("prefix", "")), str(event["repository"]), int(event["level"])
            item = MapItem.from_json(event["item"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"invalid worker event: {exc}") from None
        return cls(ref, prefix, repository, level, item)


class DataKeyCache:
    """Unwrapped data keys by repository and backup; small, since a container serves few backups."""

    def __init__(self, keys: KeyService, capacity: int = 4) -> None:
        self._keys = keys
        self._capacity = capacity
        self._cache: OrderedDict[tuple[str, str], tuple[DataKey, WrappedKey]] = OrderedDict()
        self._lock = threading.Lock()
        self.unwraps = 0

    def get(self, store: ObjectStore, ref: BackupRef, repository_id: str) -> tuple[DataKey, WrappedKey]:
        slot = (store.url, str(ref))
        with self._lock:
            if slot in self._cache:
                self._cache.move_to_end(slot)
                return self._cache[slot]
            found = load_data_key(store, self._keys, ref, repository_id)
            self.unwraps += 1
            self._cache[slot] = found
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
            return found


class ChunkLanes:
    """A few threads, each with a codec per data key and a chunk buffer; kept for the
    container's lifetime so the large buffers are allocated once, not per chunk or invocation."""

    def __init__(self, lanes: int = 2) -> None:
        self.lanes = max(1, lanes)
        self._pool = ThreadPoolExecutor(max_workers=self.lanes, thread_name_prefix="braid-lane")
        self._local = threading.local()

    def codec(self, key: DataKey, level: int) -> ChunkCodec:
        slot = (key.fingerprint, level)
        if getattr(self._local, "slot", None) != slot:
            self._local.codec = ChunkCodec(key, level)
            self._local.slot = slot
        codec: ChunkCodec = self._local.codec
        return codec

    def buffers(self, count: int, size: int) -> list[WritableBuffer]:
        """This lane's first `count` chunk buffers, each at least `size` bytes: one per chunk of a pack,
        a part read into it and its stored frame written over it.

        Only the lane's own thread uses them, one pack at a time, so they are
        free again when that pack's PUT returned."""
        current: list[WritableBuffer] = getattr(self._local, "buffers", [])
        while len(current) < count:
            current.append(new_buffer(size))
        for i in range(count):
            if len(current[i]) < size:
                current[i] = new_buffer(size)
        self._local.buffers = current
        return current[:count]

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """`fn` over `items` on the lanes, results in item order (the first error is raised).

        Each runs in the caller's context, so its requests count for the invocation (braid.ports.usage)."""
        return list(self._pool.map(in_context(fn), items))


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


def fetch_part(store: ObjectStore, ref: BackupRef, item: MapItem, piece: ChunkSlice, buffer: WritableBuffer) -> Buffer:
    """The part's staged bytes, read into `buffer` (where the store can), checked against the agent's CRC64NVME."""
    try:
        data = read_range(store, item.segment, piece.start, piece.length, buffer)
    except NotFoundError:
        raise IntegrityError(f"staging segment {item.segment} of {ref} is gone: the backup was cleaned up or expired") from None
    if len(data) != piece.length:
        raise IntegrityError(f"part {piece.part} of {item.segment} is {len(data)} bytes, the segment record implies {piece.length}")
    if encode_crc64nvme(crc64nvme(data)) != piece.checksum:
        raise IntegrityError(
            f"part {piece.part} of {item.segment} (chunk {piece.index} of {ref}) does not match the checksum the agent"
            " recorded: the staged bytes changed between the host and the worker"
        )
    return data


def packs_of(pieces: Iterable[ChunkSlice], chunks_per_pack: int) -> list[list[ChunkSlice]]:
    """The item's chunks in runs of `chunks_per_pack` from its first (the last run may be shorter)."""
    ordered = list(pieces)
    size = max(1, chunks_per_pack)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


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
        return _process_item(store, ref, item, key=key, level=level, lanes=lanes, meter=meter, chunks_per_pack=chunks_per_pack)
    except Exception as exc:
        record_failure(store, ref, item, exc)
        raise


def record_failure(store: ObjectStore, ref: BackupRef, item: MapItem, exc: Exception) -> None:
    """Best-effort: the record only explains the failure, so failing to write it must not hide the error."""
    try:
        StagingArea(store, ref).write_failure(ItemFailure(item.first_index, item.count, type(exc).__name__, str(exc)))
    except Exception:  # the original error is what the map must see
        pass


def _process_item(
    store: ObjectStore,
    ref: BackupRef,
    item: MapItem,
    *,
    key: DataKey,
    level: int,
    lanes: ChunkLanes,
    meter: InvocationMeter | None,
    chunks_per_pack: int,
) -> ItemOutcome:
    check_item(ref, item)
    started = time.monotonic()

    def one(pack: list[ChunkSlice]) -> list[ChunkEntry]:
        # One buffer per chunk of the pack, with room for the stored form too: each part is read
        # into its own and the codec writes its frame over it, so the frames wait for the pack's
        # PUT in the pages their plaintext came in.
        buffers = lanes.buffers(len(pack), stored_size(str(ref), max(piece.length for piece in pack)))
        slots = {piece.index: (piece, buffer) for piece, buffer in zip(pack, buffers, strict=False)}
        tasks = [ChunkTask(index=piece.index, input_index=item.input_index, offset=piece.offset) for piece in pack]

        def read(task: ChunkTask) -> tuple[Buffer, WritableBuffer]:
            piece, buffer = slots[task.index]
            return fetch_part(store, ref, item, piece, buffer), buffer

        return store_pack(lanes.codec(key, level), store, ref, tasks, read)

    entries = tuple(entry for stored in lanes.map(one, packs_of(item.chunks(), chunks_per_pack)) for entry in stored)
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
