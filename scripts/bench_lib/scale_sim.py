"""Scale simulation: the real planner and Finalize over a synthetic multi-TiB backup, counted.

What runs is the product's own code: `braid.pipeline.prepare.prepare_backup`,
`braid.pipeline.plan.plan_next_round` (its watch, cursor and pacing: the
I/O shell over the pure `braid.pipeline.decide.decide`) and
`braid.pipeline.finalize.finalize_step` (rounds, results, LIST presence
check, manifest seal/publish/read-back, staging removal), against an
in-memory store (`CountingStore`) that counts every request each Lambda
invocation makes. What is synthetic, and said so:

- the agent: segment records appear when a stream of `stream_mb_s` would
  have completed them (one 2 GiB segment of 32 × 64 MiB chunks at a time,
  `braid.agent.limits.default_segment_chunks`), its lease is rewritten every
  minute, the stream-end record is written at the end; UploadParts are
  counted per part, each of `default_part_chunks` chunks (one input at the
  default --concurrency: 2 × 64 MiB), as braid.agent.uploader sends them;
- the workers: an item's requests come from running the real
  `braid.pipeline.worker.process_item` on small items once
  (`calibrate_worker`: an item of every size, counted); in the simulation
  each item writes its stored chunks (sizes only) and its real ItemResult
  record, and lasts `item_seconds` (the worker's CPU per chunk is an input:
  measured by scripts/bench cloud-model, assumed 0.45 s on arm64 here);
- time: a virtual clock. `plan_next_round` takes the clock and its sleep,
  so a 61-hour watch runs in seconds; each request adds `REQUEST_SECONDS`,
  reads done in parallel (braid.format.staging.results.READ_THREADS) add it once per wave,
  and the Python CPU of each invocation is scaled by the function's share of
  a vCPU (botocore's per request too). That CPU is priced from the work the
  call did, counted (record bytes read and written, requests, keys listed),
  at a per-unit CPU calibrated on the real calls, best of three
  (calibrate_coordinators; COORDINATOR_CPU by default, as measured on the
  bench machine): a given calibration gives the same times however loaded
  the machine is while the simulation runs;
- history events per state as AWS records them (`EVENTS`): a Lambda Task 5,
  Choice 2, Wait 2, Pass 2, Distributed Map 6, Succeed 2, start and end 2.

Where in the planner's round cycle the stream ends moves the time after
stream end by up to one round (`end_phase_sizes`, `simulate_end_phases`):
scripts/bench cloud-model reports the worst of several end phases.

The result (`Simulation`) holds every invocation (function, requests by
kind, modelled seconds, its timeout) and the execution's events, which
tests/cloud/test_scale_simulation.py asserts against AWS's quotas and
scripts/bench cloud-model prices.
"""

from __future__ import annotations

import bisect
import hashlib
import inspect
import math
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from braid import contract
from braid.adapters.local.keys import LocalKeyFile
from braid.agent.limits import DEFAULT_CONCURRENCY, default_part_chunks, default_segment_chunks
from braid.agent.wake import POKE_INTERVAL_SECONDS
from braid.contract import CHUNKS_PER_PACK
from braid.errors import AlreadyExistsError, NotFoundError
from braid.format.checksum import crc64nvme, encode_crc64nvme, stored_checksum
from braid.format.ids import BackupRef
from braid.format.layout import chunk_key, data_prefix
from braid.format.lease import LeaseRecord
from braid.format.manifest import ChunkEntry
from braid.format.repository import Repository, RepositoryConfig
from braid.format.staging import ItemResult, MapItem, Round, SegmentRecord, SessionRecord, StagingArea, StreamEnd, segment_key
from braid.format.staging.keys import agent_lease_key, running_key, running_prefix, stream_end_key
from braid.format.staging.results import READ_THREAD_NAME, READ_THREADS
from braid.format.staging.wake import WakeRecord
from braid.format.timestamps import utc_now
from braid.pipeline import account_budget, item_flow
from braid.pipeline.execution_input import DEFAULT_MAX_CHUNKS_PER_ITEM, DEFAULT_POLL_SECONDS, DEFAULT_STALL_SECONDS
from braid.pipeline.finalize import finalize_step
from braid.pipeline.pacing import MIN_ROUND_SECONDS, ROUND_TARGET_CHUNKS, WATCH_SECONDS, round_interval
from braid.pipeline.plan import plan_next_round
from braid.pipeline.policies import ALL_ON, Policies
from braid.pipeline.prepare import load_data_key, prepare_backup
from braid.pipeline.worker import ChunkLanes, pack_sizes, packs_of, process_item
from braid.ports.store import ObjectInfo

MiB = 2**20
TIB = 2**40
HISTORY_QUOTA = 25_000
EXPRESS_CHILD_SECONDS = contract.EXPRESS_CHILD_SECONDS
LAMBDA_MAX_SECONDS = 900

# History events AWS records per state visited (Standard execution).
EVENTS = {"execution": 2, "pass": 2, "task": 5, "choice": 2, "wait": 2, "map": 6, "succeed": 2, "callback": 6}

# Assumptions (every one is printed by scripts/bench cloud-model).
# S3 round trip from Lambda for a small object: AWS gives "median latencies ... often in the tens of milliseconds range"
# for requests under 512 KB (whitepaper "Best Practices Design Patterns: Optimizing Amazon S3 Performance", Timeouts
# and Retries for Latency-Sensitive Applications); 15 ms is the low end of that range, an assumption.
REQUEST_SECONDS = 0.015
REQUEST_CPU_SECONDS = 0.002  # botocore CPU per request at one vCPU: assumed (not published)
# "At 1,769 MB, a function has the equivalent of one vCPU" (Lambda Developer Guide, Configure Lambda function memory).
FULL_VCPU_MB = 1769
ARM_SPEED = 0.8  # Graviton2 per-core speed vs this machine: assumed; scripts/bench cloud-model measures it with zstd
# Not published by AWS; an assumption (the review found no measurement either), kept until a run on AWS measures it.
MAP_START_SECONDS = 2.0  # Distributed Map: from the state's start to its first children running
INVOKE_OVERHEAD_SECONDS = 0.15  # per item: child execution + Lambda invoke (assumed, not published)
# A worker container's init (Python, the layer, the clients), billed since AWS bills the INIT phase. Containers are
# reused: a round's items run first on the containers earlier rounds started (rounds are seconds to minutes apart,
# well within the minutes Lambda keeps an idle container; AWS does not document how long), and only the rest start
# cold, so the count is the run's peak concurrency, and the items beyond the warm ones start this much later.
# Sources: AWS bills INIT since 2025-08 ("Lambda now bills the INIT phase", AWS compute blog); ~1 s for a
# Python 3 function with a ~20 MB layer is the order AWS's Lambda Power Tuning runs report. An assumption.
COLD_START_SECONDS = 1.0
# From the agent's segment (or stream-end) record to the sleeping planner's next call: the agent's GET of the wake
# record, its SendTaskSuccess, and Step Functions leaving SleepUntilWoken (braid.agent.wake). Assumed (not published).
WAKE_SECONDS = 0.2
# One S3 stream (one GET or PUT connection): AWS's "Performance guidelines for Amazon S3" (S3 User Guide,
# optimizing-performance-guidelines.html, "Scale storage connections horizontally") sizes one concurrent request
# per 85-90 MB/s of desired throughput. Capped by the function's network below.
LAMBDA_S3_MB_S = 90.0
# One Lambda function's total network, both directions (the worker reads a chunk and writes ~0.54 of it).
# Published: functions up to 2 GB measure a steady ~0.61 Gbit/s (~76 MB/s) at every memory size (public
# measurements of Lambda network throughput, as collected by the project's AWS review 3, finding H2), and AWS's
# August 2026 announcement gives more only to functions outside a VPC with 2 GB or more: "from 625 Mbps at
# 2 GB up to 3,000 Mbps at 10 GB". The worker has 1,769 MB.
# Was 300 MB/s (assumed) until 2026-11-28; lambda_network_mb_s() gives the rate at another memory size.
LAMBDA_NIC_MB_S = 76.0


def lambda_network_mb_s(memory_mb: int) -> float:
    """The published network rate of a function of `memory_mb` (outside a VPC): ~76 MB/s up to 2 GB, then
    AWS's announced line from 625 Mbit/s at 2,048 MB to 3,000 Mbit/s at 10,240 MB."""
    if memory_mb < 2048:
        return LAMBDA_NIC_MB_S
    mbit = 625 + (3000 - 625) * (min(memory_mb, 10240) - 2048) / (10240 - 2048)
    return round(max(LAMBDA_NIC_MB_S, mbit / 8), 1)


@contextmanager
def network(mb_s: float) -> Iterator[None]:
    """Simulate with `mb_s` per function instead of LAMBDA_NIC_MB_S (the model's sensitivity table)."""
    global LAMBDA_NIC_MB_S
    saved, LAMBDA_NIC_MB_S = LAMBDA_NIC_MB_S, mb_s
    try:
        yield
    finally:
        LAMBDA_NIC_MB_S = saved
WORKER_CPU_SECONDS = 0.45  # per 64 MiB chunk on arm64 (zstd-3 + AES-GCM + CRCs): scripts/bench cloud-model measures it
STORED_RATIO = 0.54  # stored / plaintext

# The functions as the stack deploys them (infra/braid_infra/functions.py): memory MB, timeout s.
FUNCTIONS = {
    "prepare": (256, 60),
    "plan": (contract.PLAN_MEMORY_MB, contract.PLAN_TIMEOUT_SECONDS),
    "worker": (contract.WORKER_MEMORY_MB, contract.WORKER_TIMEOUT_SECONDS),
    "finalize": (contract.FINALIZE_MEMORY_MB, 900),
}


# -- the counting store ------------------------------------------------------------


@dataclass
class Invocation:
    """One Lambda invocation as the simulation ran it."""

    function: str
    requests: Counter[str] = field(default_factory=Counter)
    work: Counter[str] = field(default_factory=Counter)  # record bytes read and written, keys listed (CoordinatorCpu prices them)
    parallel: Counter[str] = field(default_factory=Counter)  # of those, made by StagingArea's parallel readers
    watched: float = 0.0  # virtual seconds spent sleeping between polls
    cpu: float = 0.0  # Python CPU seconds of the real code on this machine, priced from its counted work (CoordinatorCpu)
    measured_cpu: float = 0.0  # the call's thread CPU as it ran here (calibrate_coordinators' raw figure; load moves it)
    seconds: float = 0.0  # modelled duration
    count: int = 1  # identical invocations this record stands for (workers)
    peak_bytes: int = 0  # Python heap the call allocated at its peak, above what it started with (simulate(trace_memory=True))
    speed: float = ARM_SPEED  # Graviton2 per-core speed vs this machine, the CPU figure's divisor (simulate(cpu_speed=...))
    cold: bool = False  # the function's container starts first (COLD_START_SECONDS, billed): a step run once per backup

    @property
    def billed_seconds(self) -> float:
        """What Lambda bills: the modelled duration."""
        return self.seconds

    @property
    def timeout(self) -> int:
        return FUNCTIONS[self.function][1]

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def units(self) -> float:
        """The call's work in CoordinatorCpu's units: record bytes read and written, plus each request and listed key at
        its weight in bytes (REQUEST_WEIGHT_BYTES, LISTED_WEIGHT_BYTES)."""
        w = self.work
        return w["read"] + w["written"] + REQUEST_WEIGHT_BYTES * self.total_requests + LISTED_WEIGHT_BYTES * (w["listed"] + w["deleted"])

    def model(self) -> float:
        memory = FUNCTIONS[self.function][0]
        vcpu = min(1.0, memory / FULL_VCPU_MB)
        sequential = self.total_requests - sum(self.parallel.values())
        waves = math.ceil(sum(self.parallel.values()) / READ_THREADS)
        per_request = REQUEST_SECONDS + REQUEST_CPU_SECONDS / vcpu
        self.seconds = self.watched + (sequential + waves) * per_request + sum(self.parallel.values()) * REQUEST_CPU_SECONDS / vcpu
        self.seconds += self.cpu / self.speed / vcpu
        self.seconds += COLD_START_SECONDS if self.cold else 0.0
        return self.seconds


# The coordinators' CPU (Prepare, Plan, Finalize) is priced from the work each call does, counted by the store: the
# record bytes it reads and writes (what it decodes and encodes), each request (its key, the call, the bookkeeping
# around it) and each key it lists or deletes. The relative weights, in bytes of record, were fitted by least squares
# on the Plan calls of a 1 TiB simulation at 50/300/1,000 MB/s (2026-11-28: ~0.1 ms per request, ~6 us per listed
# key, ~0.1 us per record byte on the bench machine); the price of a unit is calibrated once per process
# (calibrate_coordinators). Measured live per call, machine load moved the modelled tail by 10% and more.
REQUEST_WEIGHT_BYTES = 1000
LISTED_WEIGHT_BYTES = 50


@dataclass(frozen=True)
class CoordinatorCpu:
    """CPU seconds on this machine per unit of counted work (Invocation.units), by function.

    Made by calibrate_coordinators: the real calls' thread CPU, best of several runs, over their counted
    work. A simulation priced with one is deterministic: the same backup gives the same times whatever
    else the machine runs. `UNPRICED` charges nothing (the calibration's own runs)."""

    per_unit: dict[str, float]

    def seconds(self, invocation: Invocation) -> float:
        return self.per_unit.get(invocation.function, 0.0) * invocation.units()


UNPRICED = CoordinatorCpu({})
# simulate()'s default: the per-unit CPU calibrate_coordinators() found on the bench machine (x86, the least of eight
# calibrations, 2026-11-28), so the tests' figures do not move with that machine's load or speed, as the worker's CPU
# is WORKER_CPU_SECONDS; scripts/bench cloud-model calibrates its own (tests/cloud checks this one is not stale).
COORDINATOR_CPU = CoordinatorCpu({"prepare": 56e-9, "plan": 56e-9, "finalize": 44e-9})


@dataclass
class _Object:
    data: bytes | None  # None: a stored chunk kept by size only
    size: int
    modified: float


class CountingStore:
    """An in-memory ObjectStore that counts requests, S3-style (a LIST or DeleteObjects per 1,000 keys)."""

    def __init__(self, clock: Any) -> None:
        self._objects: dict[str, _Object] = {}
        self._sorted: list[str] | None = []  # the keys in order, rebuilt on the next LIST after a change
        self._lock = threading.Lock()
        self._clock = clock
        self.current: Invocation | None = None
        self.totals: Counter[str] = Counter()
        self.deleted_at: dict[str, float] = {}  # when each deleted key went (staging storage is billed until then)

    @property
    def url(self) -> str:
        return "sim://bucket"

    def object_key(self, key: str) -> str:
        return key

    def _count(self, kind: str, n: int = 1, **work: int) -> None:
        with self._lock:
            self.totals[kind] += n
            if self.current is not None:
                self.current.requests[kind] += n
                self.current.work.update(work)
                if threading.current_thread().name.startswith(READ_THREAD_NAME):
                    self.current.parallel[kind] += n

    def _set(self, key: str, value: _Object) -> None:
        with self._lock:
            if key not in self._objects:
                self._sorted = None
            self._objects[key] = value

    def put(self, key: str, data: Any, *, checksum: str | None = None, create_only: bool = False, durable: bool = True) -> None:
        self._count("PUT", written=len(data))
        if create_only and key in self._objects:
            raise AlreadyExistsError(f"{key} exists")
        self._set(key, _Object(bytes(data), len(data), self._clock()))

    def put_sized(self, key: str, size: int) -> None:
        """A stored chunk by size only (10 TiB do not fit in memory); counted as the worker's PUT."""
        self._count("PUT")
        self._set(key, _Object(None, size, self._clock()))

    def sync(self, keys: Iterable[str]) -> None:
        pass

    def get(self, key: str) -> bytes:
        found = self._objects.get(key)
        self._count("GET", read=len(found.data) if found is not None and found.data is not None else 0)
        if found is None:
            raise NotFoundError(key)
        if found.data is None:
            raise NotFoundError(f"{key} is kept by size only in the simulation")
        return found.data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        found = self._objects.get(key)
        data = b"" if found is None or found.data is None else found.data[start : start + length]
        self._count("GET", read=len(data))
        if found is None or found.data is None:
            raise NotFoundError(key)
        return data

    def head(self, key: str) -> ObjectInfo | None:
        self._count("HEAD")
        found = self._objects.get(key)
        return None if found is None else ObjectInfo(key, found.size)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        with self._lock:
            ordered = self._ordered()
            start = bisect.bisect_left(ordered, prefix)
            end = bisect.bisect_left(ordered, prefix + "\U0010ffff")
            keys = ordered[start:end]
            found = [ObjectInfo(k, self._objects[k].size) for k in keys]
        self._count("LIST", max(1, math.ceil(len(found) / 1000)), listed=len(found))
        return iter(found)

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if not keys:
            return
        self._count("DELETE", math.ceil(len(keys) / 1000), deleted=len(keys))
        with self._lock:
            for key in keys:
                if self._objects.pop(key, None) is not None:
                    self.deleted_at[key] = self._clock()
            self._sorted = None

    def _ordered(self) -> list[str]:
        if self._sorted is None:
            self._sorted = sorted(self._objects)
        return self._sorted

    def keys_under(self, prefix: str) -> int:
        with self._lock:
            ordered = self._ordered()
            return bisect.bisect_left(ordered, prefix + "\U0010ffff") - bisect.bisect_left(ordered, prefix)


class CountingJanitor:
    """Aborting uploads and purging versions: one LIST each (S3: ListMultipartUploads, ListObjectVersions)."""

    def __init__(self, store: CountingStore) -> None:
        self.store = store

    def abort_uploads(self, prefix: str) -> int:
        self.store._count("LIST")
        return 0

    def purge_versions(self, prefix: str, exact: bool = False) -> int:
        self.store._count("LIST")
        return 0


class NullPublisher:
    def __init__(self) -> None:
        self.events: list[str] = []

    def publish(self, detail_type: str, detail: Any) -> None:
        self.events.append(detail_type)


# -- the worker, calibrated from the real process_item ------------------------------


@dataclass(frozen=True)
class ItemShape:
    """What a worker's requests depend on: its chunks within their pack layout, and where a cut item stopped.

    `layout`: chunks of the item whose packs these are (MapItem.layout); `start`: this item's first chunk within
    it; `count`: its chunks; `cut`: whether it asks for the stream end at each pack boundary; `packs`: the packs it
    stored (fewer than its own when it was cut); `sizes`: its own pack sizes (MapItem.packs, as the planner's policies
    decided them; () for pack_sizes')."""

    layout: int
    start: int
    count: int
    cut: bool
    packs: int
    sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.sizes:
            object.__setattr__(self, "sizes", tuple(pack_sizes(self.count, CHUNKS_PER_PACK)))

    @property
    def stopped(self) -> bool:
        """A cut item that stopped before its last pack (cut items are planned whole: their layout is their own)."""
        return self.cut and self.packs < len(self.sizes)

    @classmethod
    def of(cls, item: MapItem, packs: int | None = None) -> ItemShape:
        layout_first, layout_count = item.layout_range
        return cls(layout_count, item.first_chunk - layout_first, item.count, item.cut, len(item.packs) if packs is None else packs, item.packs)


@dataclass(frozen=True)
class WorkerRequests:
    """Requests of one map item by its number of chunks, by kind, counted from the real process_item.

    Not a per-chunk rate: the worker reads an item's first chunks in several
    ranges (braid.pipeline.item_flow) and stores its chunks in packs that
    shrink towards the item's end (braid.format.staging.rounds.pack_sizes), so
    each item size is counted as it is. Other shapes (a cut item that
    stopped after some packs, an item finishing one: ItemShape) are counted
    the same way, from the real worker, the first time the simulation meets one.
    """

    by_chunks: dict[int, Counter[str]]
    chunks_per_pack: int = CHUNKS_PER_PACK
    chunk_size: int = 64 * 2**20
    shapes: dict[ItemShape, Counter[str]] = field(default_factory=dict)

    def of(self, chunks: int) -> Counter[str]:
        if chunks not in self.by_chunks:
            raise ValueError(f"no calibration for an item of {chunks} chunks (counted: 1..{max(self.by_chunks)})")
        return Counter(self.by_chunks[chunks])

    def of_shape(self, shape: ItemShape) -> Counter[str]:
        default = tuple(pack_sizes(shape.count, self.chunks_per_pack))
        if (shape.layout, shape.start, shape.cut, shape.packs, shape.sizes) == (shape.count, 0, False, len(default), default):
            if shape.count in self.by_chunks:
                return self.of(shape.count)
        if shape not in self.shapes:
            with tempfile.TemporaryDirectory() as tmp:
                self.shapes[shape] = _count_item(LocalKeyFile.create(Path(tmp) / "master.key"), shape.count, self.chunk_size, shape)
        return Counter(self.shapes[shape])


def _count_item(keys: LocalKeyFile, chunks: int, chunk_size: int, shape: ItemShape | None = None) -> Counter[str]:
    """The requests of the real worker storing one item of `chunks` small chunks, as it would at `chunk_size`.

    The chunks are 4 KiB (the requests do not depend on the bytes), and the
    smallest range the worker reads a chunk in is scaled by the same factor,
    so its chunks are cut into as many ranged GETs as `chunk_size` ones are.
    `shape`: the item's place in its pack layout and where a cut item stops (default: a whole item of its own).
    """
    chunk = 4096
    saved = item_flow.MIN_RANGE_BYTES
    item_flow.MIN_RANGE_BYTES = max(1, saved * chunk // chunk_size)
    try:
        return _run_count(keys, chunk, shape or ItemShape(chunks, 0, chunks, False, len(pack_sizes(chunks, CHUNKS_PER_PACK))))
    finally:
        item_flow.MIN_RANGE_BYTES = saved


def _run_count(keys: LocalKeyFile, chunk: int, shape: ItemShape) -> Counter[str]:
    store = CountingStore(time.time)
    _repository(store, keys)
    ref = BackupRef.new("calibrate")
    data = bytes(range(256)) * (chunk * shape.layout // 256)
    area = StagingArea(store, ref)
    repo_id = Repository.open(store).config.id
    area.write_session(SessionRecord(str(ref), repo_id, chunk, shape.layout, 3, ["in"], utc_now()))
    store.put(segment_key(ref, 0, 0), data)
    crcs = tuple(encode_crc64nvme(crc64nvme(data[i : i + chunk])) for i in range(0, len(data), chunk))
    prepare_backup(store, keys, ref)
    key, _ = load_data_key(store, keys, ref, repo_id)
    whole = (shape.start, shape.count) == (0, shape.layout)
    item = MapItem(
        segment_key(ref, 0, 0), 0, 0, 0, len(data), chunk, 1 + shape.start, shape.count, shape.start, crcs[shape.start : shape.start + shape.count],
        None if whole else (1, shape.layout), shape.cut, shape.sizes,
    )
    if shape.cut:  # the stream ends just before the boundary after `packs` packs (its check finds the record)
        _end_at_check(store, ref, shape.packs)
    store.current = Invocation("worker")
    process_item(store, ref, item, key=key, level=3, lanes=ChunkLanes(2))
    return store.current.requests


def _end_at_check(store: CountingStore, ref: BackupRef, stored: int) -> None:
    """Make the stream-end record appear when a cut worker checks for it the `stored`-th time (never if it stores all)."""
    end = stream_end_key(ref)
    get = store.get
    seen = 0

    def get_with_end(key: str) -> bytes:
        nonlocal seen
        if key == end:
            seen += 1
            if seen == stored:
                saved, store.current = store.current, None
                StagingArea(store, ref).write_stream_end(StreamEnd([1], [1]))
                store.current = saved
        return get(key)

    store.get = get_with_end  # type: ignore[method-assign]


_WORKER_CALIBRATIONS: dict[tuple[int, int], WorkerRequests] = {}


def calibrate_worker(chunk_size: int = 64 * 2**20, max_chunks: int = DEFAULT_MAX_CHUNKS_PER_ITEM) -> WorkerRequests:
    """Run the real worker on an item of every size from 1 to `max_chunks` chunks and count its requests.

    Counted once per process and size (cached): the counts are the code's, the same on every call."""
    if (chunk_size, max_chunks) not in _WORKER_CALIBRATIONS:
        with tempfile.TemporaryDirectory() as tmp:
            keys = LocalKeyFile.create(Path(tmp) / "master.key")
            found = WorkerRequests({n: _count_item(keys, n, chunk_size) for n in range(1, max_chunks + 1)}, chunk_size=chunk_size)
        _WORKER_CALIBRATIONS[chunk_size, max_chunks] = found
    return _WORKER_CALIBRATIONS[chunk_size, max_chunks]


def _repository(store: CountingStore, keys: LocalKeyFile) -> Repository:
    # The pipeline requires a KMS repository; the local key file stands in for KMS (the same KeyService port).
    return Repository.create(store, RepositoryConfig.new({"type": "kms", "key_id": keys.key_id}, utc_now()))


def item_seconds(chunks: int, cpu_chunk: float, chunk: int, ratio: float, lanes: int, packs: list[int] | None = None) -> float:
    """One map item of `chunks` chunks through the worker's pipeline (braid.pipeline.item_flow), in seconds.

    Reads: the first FIRST_RANGED_CHUNKS chunks one after the other, each in
    ranges over the whole NIC; then up to `lanes` GETs at once, one S3
    stream each, sharing the NIC. The codec (one vCPU) takes the chunks in
    order, each once it has arrived; a pack's PUT (one stream) starts when
    its last chunk is encoded (`packs`: the item's, MapItem.packs; default
    pack_sizes). The item ends with the last PUT, or with its bytes over
    the NIC if that is longer, plus the invocation's overhead.
    """
    timeline = ItemTimeline.of(chunks, cpu_chunk, chunk, ratio, lanes, packs)
    return timeline.seconds(len(timeline.packs))


@dataclass(frozen=True)
class ItemTimeline:
    """When an item's chunks arrive and its packs' PUTs end, from its start (see item_seconds)."""

    packs: list[int]
    arrivals: list[float]  # per chunk
    encoded: list[float]  # per chunk: when the codec is done with it
    pack_ends: list[float]  # per pack: its PUT's end
    io_per_chunk: float  # NIC seconds per chunk, both ways

    @classmethod
    def of(
        cls, chunks: int, cpu_chunk: float, chunk: int, ratio: float, lanes: int, packs: list[int] | None = None, read_ratio: float = 1.0,
    ) -> ItemTimeline:
        """`read_ratio`: staged bytes per plaintext byte (1: the agent stages the stream as it is; below 1, a host-side
        pre-compression the worker undoes before its codec, which the model only prices: cloud_model.precompression_rows)."""
        mb = 1e6
        size = chunk / mb
        staged = size * read_ratio
        ranged = staged / min(len(item_flow.ranges_of(chunk)) * LAMBDA_S3_MB_S, LAMBDA_NIC_MB_S)
        arrivals = [ranged * (i + 1) for i in range(min(chunks, item_flow.FIRST_RANGED_CHUNKS))]
        rest = chunks - len(arrivals)
        if rest:
            start = arrivals[-1]
            rate = min(lanes * LAMBDA_S3_MB_S, LAMBDA_NIC_MB_S)  # MB/s of the read-ahead
            batch = min(lanes, rest)
            arrivals += [start + max(batch, j + 1) * staged / rate for j in range(rest)]  # the first batch shares the NIC, then one by one
        encoded, done = [], 0.0
        for arrival in arrivals:
            done = max(done, arrival) + cpu_chunk
            encoded.append(done)
        sizes = list(packs) if packs is not None else pack_sizes(chunks, CHUNKS_PER_PACK)
        ends, first, end = [], 0, 0.0
        for pack in sizes:
            first += pack
            end = max(end, encoded[first - 1] + pack * size * ratio / LAMBDA_S3_MB_S)
            ends.append(end)
        return cls(sizes, arrivals, encoded, ends, size * (read_ratio + ratio) / LAMBDA_NIC_MB_S)

    def seconds(self, packs: int) -> float:
        """The item's duration if it stores its first `packs` packs (all of them, unless it is cut)."""
        chunks = sum(self.packs[:packs])
        return max(self.pack_ends[packs - 1], chunks * self.io_per_chunk) + INVOKE_OVERHEAD_SECONDS

    def stored_packs(self, started: float, ended_at: float | None) -> int:
        """Packs a cut item started at `started` stores when the stream ends at `ended_at` (None: not before it ends).

        Its worker asks for the stream end as the codec reaches each pack after the first, once it is done with
        the previous pack's last chunk (braid.pipeline.item_flow): the first answer "ended" stops it there."""
        if ended_at is None:
            return len(self.packs)
        first = 0
        for n, pack in enumerate(self.packs[:-1], start=1):
            first += pack
            if started + self.encoded[first - 1] >= ended_at:
                return n
        return len(self.packs)


# -- the simulation ------------------------------------------------------------------


@dataclass
class Simulation:
    tib: float
    stream_mb_s: float
    workers: int
    chunk_size: int
    segments: int
    chunks: int
    stream_seconds: float
    invocations: list[Invocation]
    history_events: int
    turns: Counter[str]
    finished_at: float
    agent_requests: Counter[str]
    store_totals: Counter[str]
    items: int
    worker_seconds: float  # sum of every item's duration (billed worker time)
    map_seconds: float
    transitions: int  # Standard state transitions of the backup execution (billed)
    staged_byte_seconds: float  # raw bytes in staging x how long they stayed (until Finalize removed them)
    packs: int = 0  # stored objects of chunks: one worker PUT each (braid.contract.CHUNKS_PER_PACK chunks at most)
    containers: int = 0  # worker containers started (cold starts): the peak of items running at once
    rounds: list[tuple[float, float]] = field(default_factory=list)  # each map round's (start, wall seconds) on the virtual clock
    item_spans: list[tuple[float, float]] = field(default_factory=list)  # each item's worker (start, end) on the virtual clock

    @property
    def express_items(self) -> int:
        """Items run as Express children (billed per child and its duration): every item."""
        return self.items

    @property
    def seconds_after_stream_end(self) -> float:
        return self.finished_at - self.stream_seconds

    @property
    def idle_after_stream_end(self) -> float:
        """Seconds after stream end in which neither a map round nor Finalize ran: the planner's own turns (its calls,
        the agent's wake, any Wait). What the planner controls of the tail; the rest is work the model prices."""
        finalize = sum(i.seconds for i in self.by_function("finalize"))
        end, until = self.stream_seconds, self.finished_at - finalize
        busy = sum(max(0.0, min(start + wall, until) - max(start, end)) for start, wall in self.rounds)
        return max(0.0, until - end - busy)

    def by_function(self, function: str) -> list[Invocation]:
        return [i for i in self.invocations if i.function == function]

    @property
    def max_timeout_fraction(self) -> float:
        return max(i.seconds / i.timeout for i in self.invocations)

    def requests(self, function: str | None = None) -> Counter[str]:
        total: Counter[str] = Counter()
        for invocation in self.invocations:
            if function is None or invocation.function == function:
                for kind, n in invocation.requests.items():
                    total[kind] += n * invocation.count
        return total


class _Agent:
    """The synthetic agent: writes what braid.agent.uploader would have by each moment."""

    def __init__(self, store: CountingStore, ref: BackupRef, session: SessionRecord, total: int, rate: float, staged_ratio: float = 1.0) -> None:
        self.store, self.ref, self.session, self.rate, self.staged_ratio = store, ref, session, rate, staged_ratio
        self.area = StagingArea(store, ref)
        self.seg_bytes = session.segment_chunks * session.chunk_size
        self.total = total
        self.segments = max(1, math.ceil(total / self.seg_bytes))
        self.next_segment = 0
        self.next_lease = 0.0
        self.ended = False
        self.end_at = total / rate
        self.requests: Counter[str] = Counter()
        self.crc = encode_crc64nvme(0)
        self.completed: list[tuple[float, int, str]] = []  # (when, bytes, key) per segment

    def catch_up(self, now: float) -> None:
        saved, self.store.current = self.store.current, None  # the agent's writes are not the invocation's
        try:
            while self.next_segment < self.segments and min(self.total, (self.next_segment + 1) * self.seg_bytes) / self.rate <= now:
                self._complete(self.next_segment)
                self.next_segment += 1
            while self.next_lease <= min(now, self.end_at):
                record = LeaseRecord(str(self.ref), f"t+{self.next_lease:.0f}", "sim", 1)
                self.store.put(agent_lease_key(self.ref), record.to_bytes())
                self.requests["PUT"] += 1
                self.next_lease += 60.0
            if not self.ended and now >= self.end_at and self.next_segment == self.segments:
                self.area.write_stream_end(StreamEnd([self.total], [self.segments]))
                self.requests["PUT"] += 1
                self.requests["GET"] += 1  # the wake record, read at the end
                self.ended = True
        finally:
            self.store.current = saved

    def _complete(self, number: int) -> None:
        offset = number * self.seg_bytes
        length = min(self.seg_bytes, self.total - offset)
        chunks = math.ceil(length / self.session.chunk_size)
        record = SegmentRecord(0, number, segment_key(self.ref, 0, number), offset, length, chunks, stored_checksum(b""), [self.crc] * chunks)
        self.store.put_sized(record.key, length)  # the completed multipart object (by size)
        self.completed.append(((offset + length) / self.rate, length, record.key))
        self.area.write_segment_record(record)
        # CreateMultipartUpload, UploadPart per part (of part_chunks chunks), CompleteMultipartUpload, the record's PUT;
        # then the GET of the wake record (braid.agent.wake: after every segment record, and at the end).
        self.requests["PUT"] += 1 + math.ceil(chunks * self.staged_ratio / self.session.part_chunks) + 1 + 1
        self.requests["GET"] += 1

    def wake_time(self, now: float, chunks: int, after: float, timeout: float) -> tuple[float, bool]:
        """When the agent wakes a planner that went to sleep at `now` (braid.agent.wake), or the sleep's timeout:
        (the moment, woken). The agent reads the wake record at each segment record it writes (the first of them starts
        its `after` clock) and at the stream's end; one that has ended already pokes while it waits for the pipeline."""
        limit = now + timeout
        record = WakeRecord(chunks, int(after), "simulated")
        if self.ended:
            return now + POKE_INTERVAL_SECONDS + WAKE_SECONDS, True
        first_read: float | None = None
        for number in range(self.next_segment, self.segments):
            end_byte = min(self.total, (number + 1) * self.seg_bytes)
            when = end_byte / self.rate
            if when > limit:
                return limit, False
            first_read = when if first_read is None else first_read
            if record.due(math.ceil(end_byte / self.session.chunk_size), when - first_read, ended=False):  # the agent's own test
                return when + WAKE_SECONDS, True
        return (max(now, self.end_at) + WAKE_SECONDS, True) if self.end_at <= limit else (limit, False)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.agent: _Agent | None = None
        self.watched = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        if self.agent is not None:
            self.agent.catch_up(self.now)

    def sleep(self, seconds: float) -> None:
        self.watched += seconds
        self.advance(seconds)


# simulate()'s memo while `memoized()` is open: one Simulation per distinct configuration (simulation_key).
_MEMO: dict[tuple[Any, ...], Simulation] | None = None


@contextmanager
def memoized() -> Iterator[dict[tuple[Any, ...], Simulation]]:
    """Within it, simulate() runs each distinct configuration once and returns the same Simulation after.

    scripts/bench cloud-model's tables share rows (the optimisation table's "all on" runs are the main table's,
    the sensitivity table's deployed memory at the published rate is the main table's 1 TiB x 500 x 300 MB/s
    row, ...). A simulation's figures depend only on its inputs (simulation_key: its arguments and the
    network rate; a given CoordinatorCpu makes them independent of machine load), so a second run would
    only repeat the first (to ~1e-7 s: record timestamps vary in length by a byte or two). Not used by the tests, which may change the module's assumptions between runs."""
    global _MEMO
    saved, _MEMO = _MEMO, {} if _MEMO is None else _MEMO
    try:
        yield _MEMO
    finally:
        _MEMO = saved


def _frozen(value: Any) -> Any:
    """`value` as a hashable, content-equal key part (simulation_key)."""
    if isinstance(value, WorkerRequests):
        counts = tuple(sorted((n, tuple(sorted(c.items()))) for n, c in value.by_chunks.items()))
        return ("WorkerRequests", value.chunk_size, value.chunks_per_pack, counts)
    if isinstance(value, CoordinatorCpu):
        return ("CoordinatorCpu", tuple(sorted(value.per_unit.items())))
    return value


def simulation_key(tib: float, stream_mb_s: float, workers: int, **options: Any) -> tuple[Any, ...]:
    """What a simulate() call's result depends on: its arguments, defaults filled in, and the network rate (network())."""
    bound = _SIGNATURE.bind(tib, stream_mb_s, workers, **options)
    bound.apply_defaults()
    return (LAMBDA_NIC_MB_S, *((name, _frozen(value)) for name, value in bound.arguments.items()))


def simulate(tib: float, stream_mb_s: float, workers: int, **options: Any) -> Simulation:
    """One backup through the real steps (_simulate, which documents the options); memoized inside memoized()."""
    if _MEMO is None or options.get("trace_memory"):
        return _simulate(tib, stream_mb_s, workers, **options)
    key = simulation_key(tib, stream_mb_s, workers, **options)
    if key not in _MEMO:
        _MEMO[key] = _simulate(tib, stream_mb_s, workers, **options)
    return _MEMO[key]


def _simulate(
    tib: float,
    stream_mb_s: float,
    workers: int,
    *,
    chunk_size: int = 64 * MiB,
    worker_cpu: float = WORKER_CPU_SECONDS,
    ratio: float = STORED_RATIO,
    lanes: int = contract.DEFAULT_WORKER_LANES,
    calibration: WorkerRequests | None = None,
    trace_memory: bool = False,
    cpu_speed: float = ARM_SPEED,
    coordinators: CoordinatorCpu | None = None,
    staged_ratio: float = 1.0,
    policies: Policies = ALL_ON,
    budget: int | None = None,
    others: int = 0,
) -> Simulation:
    """One backup of `tib` TiB streamed at `stream_mb_s` MB/s with a fan-out of `workers`, through the real steps.

    `trace_memory`: record each Prepare, Plan and Finalize call's peak heap (tracemalloc). `coordinators`: the price
    of their counted work in CPU seconds on this machine (default COORDINATOR_CPU; calibrate_coordinators() measures it).
    `cpu_speed`: Graviton2's per-core speed relative to this machine, which that CPU is divided by (scripts/bench
    cloud-model passes the factor it measured with zstd, as for the worker). `staged_ratio`: staged bytes per stream
    byte, below 1 for a host-side pre-compression (modelled, not built: the agent's parts, staging storage and the
    workers' reads shrink by it; `worker_cpu` then includes undoing it).
    `policies`: the optimisations the execution input would choose (braid.pipeline.policies), given to the real planner.
    `budget`: the stack's worker budget; each Plan call first takes this backup's share of it, with `others` backups
    running beside it (braid.pipeline.account_budget, as functions/plan/app.py: their planners' registrations are
    renewed as theirs would be), and the map runs that many items at once. None: the map runs `workers`."""
    calibration = calibration or calibrate_worker()
    coordinators = COORDINATOR_CPU if coordinators is None else coordinators
    clock = _Clock()
    store = CountingStore(clock)
    invocations: list[Invocation] = []
    turns: Counter[str] = Counter()
    events = EVENTS["execution"] + EVENTS["pass"]  # started, Identify
    with tempfile.TemporaryDirectory() as tmp:
        keys = LocalKeyFile.create(Path(tmp) / "master.key")
        repository = _repository(store, keys)
        ref = BackupRef.new("sim")
        total = int(tib * TIB)
        session = SessionRecord(
            str(ref), repository.config.id, chunk_size, default_segment_chunks(chunk_size), 3, ["stdin"], utc_now(),
            part_chunks=default_part_chunks(chunk_size, 1, DEFAULT_CONCURRENCY),
        )
        StagingArea(store, ref).write_session(session)
        agent = _Agent(store, ref, session, total, stream_mb_s * 1e6, staged_ratio)
        clock.agent = agent

        def invoke(function: str, call: Any, *, cold: bool = False) -> Any:
            invocation = Invocation(function, speed=cpu_speed, cold=cold)
            store.current = invocation
            clock.watched = 0.0
            if trace_memory:
                tracemalloc.start()
            cpu0 = time.thread_time()
            try:
                return call()
            finally:
                invocation.measured_cpu = time.thread_time() - cpu0
                invocation.cpu = coordinators.seconds(invocation)
                if trace_memory:
                    invocation.peak_bytes = tracemalloc.get_traced_memory()[1]
                    tracemalloc.stop()
                invocation.watched = clock.watched
                store.current = None
                invocations.append(invocation)
                clock.advance(invocation.model() - invocation.watched)

        # Prepare, the first Plan call and Finalize each start a container, once per backup (Finalize's in the time
        # after stream end).
        invoke("prepare", lambda: prepare_backup(store, keys, ref), cold=True)
        events += EVENTS["task"]
        key, _ = load_data_key(store, keys, ref, repository.config.id)
        previous: dict[str, Any] | None = None
        items_total = 0
        containers = 0
        worker_seconds = 0.0
        map_seconds = 0.0
        worker_invocations: Counter[tuple[ItemShape, float]] = Counter()
        rounds: list[tuple[float, float]] = []
        spans: list[tuple[float, float]] = []
        renewed = {BackupRef.new(f"other{n}"): -math.inf for n in range(others)}  # each other planner's last registration
        fan_out = [workers]  # this backup's map concurrency: its share of `budget`, as its last Plan call took it

        def plan_call(cursor: Any) -> Any:
            if budget is not None:
                saved, store.current = store.current, None  # the other backups' planners' renewals, not this call's
                for other, last in renewed.items():
                    if clock.now - last >= account_budget.REFRESH_SECONDS:
                        store.delete([info.key for info in store.list(running_prefix(other))])
                        store.put(running_key(other, int(clock.now)), b"{}")
                        renewed[other] = clock.now
                store.current = saved
                fan_out[0] = account_budget.share(store, ref, budget=budget, requested=workers, now=clock.now)
            status = plan_next_round(
                store, ref, max_concurrency=fan_out[0], max_chunks_per_item=DEFAULT_MAX_CHUNKS_PER_ITEM,
                poll_seconds=DEFAULT_POLL_SECONDS, stall_seconds=DEFAULT_STALL_SECONDS, cursor=cursor,
                watch_seconds=WATCH_SECONDS, min_round_seconds=MIN_ROUND_SECONDS, clock=clock, sleep=clock.sleep, may_sleep=True,
                policies=policies,
            )
            if budget is not None and status.status == "done":
                account_budget.release(store, ref)
            return status

        while True:
            cursor = previous.get("cursor") if previous else None
            status = invoke("plan", lambda cursor=cursor: plan_call(cursor), cold=previous is None)
            previous = status.to_json()
            events += EVENTS["task"] + EVENTS["choice"]
            if events > 4 * HISTORY_QUOTA:
                raise RuntimeError(f"runaway simulation: {events} history events")
            if status.status == "done":
                break
            if status.status == "waiting":
                events += EVENTS["wait"]
                turns["wait"] += 1
                clock.advance(status.wait_seconds)
                continue
            if status.status == "sleeping":  # SleepUntilWoken: the state machine's PUT of the wake record, then the agent's wake
                events += EVENTS["callback"]
                turns["sleep"] += 1
                wake_at, woken = agent.wake_time(clock.now, status.wake_chunks, status.wake_after_seconds, status.wait_seconds)
                turns["woken" if woken else "slept_out"] += 1
                clock.advance(max(0.0, wake_at - clock.now))
                continue
            turns["map"] += 1
            found = _round_items(store, status.items_key, status.round)
            events += EVENTS["map"]
            duration, billed, containers = _run_items(
                store, ref, found, key, calibration, fan_out[0], worker_cpu, ratio, lanes, worker_invocations, start=MAP_START_SECONDS,
                warm=containers, now=clock.now, ended_at=agent.end_at, read_ratio=staged_ratio, spans=spans,
            )
            rounds.append((clock.now, duration))
            items_total += len(found)
            worker_seconds += billed
            map_seconds += duration
            clock.advance(duration)
        publisher = NullPublisher()
        invoke("finalize", lambda: finalize_step(store, keys, CountingJanitor(store), publisher, ref), cold=True)
        events += EVENTS["task"] + EVENTS["succeed"]
        turns["cut"] = sum(n for (shape, _), n in worker_invocations.items() if shape.stopped)
        for (shape, seconds), n in worker_invocations.items():
            worker = Invocation("worker", requests=calibration.of_shape(shape), count=n)
            worker.seconds = seconds
            invocations.append(worker)
        plans = sum(1 for i in invocations if i.function == "plan")
        # Identify, Prepare; Plan + Choice; Wait | SleepUntilWoken | Map; Finalize, Succeed
        transitions = 2 + 2 * plans + turns["wait"] + turns["sleep"] + turns["map"] + 2
        staged = staged_ratio * sum(size * max(0.0, store.deleted_at.get(key, clock.now) - when) for when, size, key in agent.completed)
        agent.requests["PUT"] += 2  # session, and the agent's own check LISTs below
        agent.requests["LIST"] += math.ceil(agent.segments * session.segment_chunks / 1000)
        return Simulation(
            tib=tib, stream_mb_s=stream_mb_s, workers=workers, chunk_size=chunk_size, segments=agent.segments,
            chunks=math.ceil(total / chunk_size), stream_seconds=agent.end_at, invocations=invocations, history_events=events,
            turns=turns, finished_at=clock.now, agent_requests=agent.requests, store_totals=store.totals, items=items_total,
            packs=store.keys_under(data_prefix(ref)),
            worker_seconds=worker_seconds, map_seconds=map_seconds, transitions=transitions, staged_byte_seconds=staged,
            containers=containers, rounds=rounds, item_spans=spans,
        )


_SIGNATURE = inspect.signature(_simulate)  # simulation_key's: the parameters and defaults
_COORDINATORS: CoordinatorCpu | None = None
CALIBRATION_RUNS = 3  # best of: a call's least CPU over the runs rejects the moments another process held the core


def calibrate_coordinators(calibration: WorkerRequests | None = None, runs: int = CALIBRATION_RUNS) -> CoordinatorCpu:
    """The coordinators' CPU per unit of work on this machine, measured once per process (cached).

    A reference backup (1/4 TiB at 300 MB/s, 100 workers: streaming, sleeping and final rounds, Finalize) is
    simulated `runs` times unpriced, so every run makes the same calls; each call's thread CPU is the least of its
    runs, and a function's price is their sum over the sum of its calls' work (Invocation.units)."""
    global _COORDINATORS
    if _COORDINATORS is None:
        sims = [simulate(0.25, 300, 100, calibration=calibration, coordinators=UNPRICED) for _ in range(runs)]
        per_unit = {}
        for function in ("prepare", "plan", "finalize"):
            calls = [sim.by_function(function) for sim in sims]
            best = [min(run[n].measured_cpu for run in calls) for n in range(min(map(len, calls)))]
            units = sum(call.units() for call in calls[0][: len(best)])
            per_unit[function] = sum(best) / units if units else 0.0
        _COORDINATORS = CoordinatorCpu(per_unit)
    return _COORDINATORS


END_PHASES = 6  # stream ends sampled across one round period (end_phase_sizes)


def end_phase_sizes(tib: float, stream_mb_s: float, phases: int = END_PHASES, chunk_size: int = 64 * MiB) -> list[float]:
    """Backup sizes (TiB) whose streams end at `phases` evenly spread points of one round period.

    The time after stream end depends on where in the planner's round
    cycle the stream happens to end: just after a round started, the last
    segment waits for that whole round (its map start and its longest item)
    before the final round can begin; just before, it joins the next one at
    once. Rounds are `round_interval(age)` apart and carry at least
    ROUND_TARGET_CHUNKS (pacing.round_due), so taking
    `phases` sizes that shorten the stream by 0, 1/phases, ... of one round
    period's worth of data samples every end phase at the same rate, the
    same fan-out and within ~1% of the size. A guarantee ("within 15 s of
    stream end") is judged on the worst of them, never on a lucky phase.
    """
    total = tib * TIB
    period_bytes = max(round_interval(total / (stream_mb_s * 1e6)) * stream_mb_s * 1e6, ROUND_TARGET_CHUNKS * chunk_size)
    return [(total - k * period_bytes / phases) / TIB for k in range(phases)]


def simulate_end_phases(tib: float, stream_mb_s: float, workers: int, phases: int = END_PHASES, **options: Any) -> list[Simulation]:
    """`simulate` at every size of end_phase_sizes: the first is the backup of exactly `tib` TiB."""
    sizes = end_phase_sizes(tib, stream_mb_s, phases, options.get("chunk_size", 64 * MiB))
    return [simulate(size, stream_mb_s, workers, **options) for size in sizes]


def _round_items(store: CountingStore, key: str, number: int) -> list[MapItem]:
    """What the Distributed Map's ItemReader reads: the round file (the state machine's GET, not a Lambda's)."""
    saved, store.current = store.current, None
    try:
        return list(Round.from_bytes(store.get(key), number, key).items)
    finally:
        store.current = saved


def _run_items(
    store: CountingStore, ref: BackupRef, items: list[MapItem], key: Any, calibration: WorkerRequests, workers: int,
    worker_cpu: float, ratio: float, lanes: int, invocations: Counter[tuple[ItemShape, float]], *, start: float = MAP_START_SECONDS,
    warm: int = 0, now: float = 0.0, ended_at: float | None = None, read_ratio: float = 1.0, spans: list[tuple[float, float]] | None = None,
) -> tuple[float, float, int]:
    """One map round: each item stores its chunks (sizes) and its real result record; returns (wall, billed) seconds and
    the worker containers started so far.

    `start`: from the map state's start to its first items running (a Distributed Map run).
    `warm`: containers earlier rounds started; the round's other concurrent items first start one (COLD_START_SECONDS).
    `now`, `ended_at`: when the round starts and when the agent writes the stream-end record: a cut item (MapItem.cut)
    running then stops at its next pack boundary (ItemTimeline.stored_packs) and writes a result for what it stored.
    Items run longest first on the least busy container, as round_wall."""
    area = StagingArea(store, ref)
    timelines = [ItemTimeline.of(i.count, worker_cpu, i.chunk_size, ratio, lanes, i.packs, read_ratio) for i in items]
    order = sorted(range(len(items)), key=lambda n: -timelines[n].seconds(len(timelines[n].packs)))
    running = max(1, min(workers, len(items)))
    lanes_free = [0.0] * min(running, warm) + [COLD_START_SECONDS] * max(0, running - warm)
    billed = 0.0
    saved, store.current = store.current, None  # counted through the calibration instead
    try:
        for n in order:
            item, timeline = items[n], timelines[n]
            lanes_free.sort()
            began = lanes_free[0]
            stored = timeline.stored_packs(now + start + began, ended_at) if item.cut else len(timeline.packs)
            seconds = timeline.seconds(stored)
            lanes_free[0] += seconds
            billed += seconds
            if spans is not None:  # when the item's worker ran, on the virtual clock
                spans.append((now + start + began, now + start + began + seconds))
            entries = []
            for pack in packs_of(item.chunks(), timeline.packs)[:stored]:  # one object per pack, as the worker stores them
                offset = 0
                for piece in pack:
                    size = max(1, int(piece.length * ratio))
                    mac = hashlib.blake2b(piece.index.to_bytes(8, "big"), digest_size=32).digest()
                    entries.append(
                        ChunkEntry(piece.index, item.input_index, piece.offset, piece.length, size, stored_checksum(b""), mac, "zstd", pack[0].index, offset)
                    )
                    offset += size
                store.put_sized(chunk_key(ref, pack[0].index), offset)
            area.write_result(ItemResult(item.first_index, tuple(entries)))
            invocations[(ItemShape.of(item, stored), seconds)] += 1
    finally:
        store.current = saved
    wall = start + max(lanes_free) if items else start
    return wall, billed, max(warm, running if items else 0)


def round_wall(durations: list[float], workers: int, warm: int, start: float) -> tuple[float, int]:
    """A map round's wall time, its items (`durations`) run longest first on the least busy of up to `workers` containers,
    `warm` of them already started and the others first paying COLD_START_SECONDS; and the containers started by its end."""
    running = max(1, min(workers, len(durations)))
    lanes_free = [0.0] * min(running, warm) + [COLD_START_SECONDS] * max(0, running - warm)
    for seconds in sorted(durations, reverse=True):
        lanes_free.sort()
        lanes_free[0] += seconds
    return start + max(lanes_free), max(warm, running if durations else 0)
