"""The WAL path on AWS, priced (scripts/bench cloud-model's `wal` table): $ per TiB of WAL and p99 seconds to the final form.

Counted, not assumed: every S3 and KMS request of a pushed segment comes
from running the real code (braid.ops.wal_stage.stage_wal on the host, and
braid.ops.wal_bundled.stage_bundle for `--async`'s bundles;
braid.ops.wal_pack_process.process_staged_files and
braid.ops.wal_bundle_process.process_bundle in the WAL worker, one full
batch, the policy wal-pack on or off) over synthetic segments against
counting stores (`count_requests`). What the
stack deploys comes from braid.contract (the worker's memory, timeout,
batch size and batching window). Prices are the one table
(braid.format.prices, us-east-1 list prices) plus SQS's, which it lacks.

Lambda GB-seconds per segment: the function is billed for the time it
takes (memory x duration): the staged bytes' GET and the stored object's
PUT at the function's network rate (bench_lib.scale_sim.lambda_network_mb_s:
~76 MB/s below 2 GB, published measurements), the codec's CPU (measured by
`scripts/bench cloud-model` on the bench data, or the model's default,
stretched by the share of a vCPU the memory buys: 1,769 MB is one vCPU,
AWS Lambda "Memory and computing power"), and each request's round trip.

p99 seconds from a push's exit 0 to the final encrypted object: S3's
notification to SQS (S3 User Guide, "Amazon S3 Event Notifications":
"typically delivered in seconds but can sometimes take a minute or longer":
AWS publishes no percentile, so the figure below is an assumption stated as
one), the event source mapping's long poll (Lambda: pollers long-poll the
queue continuously, a message is received as soon as it is visible), the
batching window (the most the first message of a batch waits), a cold start
(scale_sim.COLD_START_SECONDS), and the batch's files processed one after
another (the last waits for the others): the worst case of a full batch.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_lib import scale_sim
from braid import contract
from braid.adapters.local.store import LocalStore
from braid.errors import AlreadyExistsError, NotFoundError
from braid.format.keys import DataKey, WrappedKey
from braid.format.prices import DEFAULT as PRICE_TABLE
from braid.format.repository import Repository, RepositoryConfig
from braid.format.wal import WalFile
from braid.format.wal_object import encode_wal
from braid.ports.store import ObjectInfo
from braid.ports.wal_staging import StagedWal

MiB = 2**20
TIB = 2**40
SEGMENT = 16 * MiB  # PostgreSQL's default WAL segment
SEGMENTS_PER_TIB = TIB // SEGMENT

PRICES = {
    "s3_put_class": PRICE_TABLE.prices["s3_put_request"],
    "s3_get_class": PRICE_TABLE.prices["s3_get_request"],
    "kms_request": PRICE_TABLE.prices["kms_request"],
    "lambda_gb_s": PRICE_TABLE.prices["lambda_gb_second"],
    "lambda_request": PRICE_TABLE.prices["lambda_request"],
    "s3_storage_gb_month": PRICE_TABLE.prices["s3_storage_gb_month"],
    # https://aws.amazon.com/sqs/pricing/: standard queues, $0.40 per million requests (us-east-1, after the first
    # million a month); "each 64 KB chunk of a payload is billed as 1 request" (an S3 event is about 1 KB).
    "sqs_request": 0.40 / 1e6,
}

ASSUME = {
    # S3 -> SQS: no published percentile ("typically ... seconds, sometimes a minute or longer"); assumed, see above.
    "s3_event_p99_seconds": 10.0,
    # The mapping's pollers long-poll: a visible message is received at once; one poll round trip.
    "poll_seconds": 1.0,
    # The codec's CPU per 16 MiB segment at one Graviton2 vCPU: zstd -3 + AES-GCM + Poly1305, scaled from the backup
    # worker's measured 0.45 s per 64 MiB chunk (scale_sim.WORKER_CPU_SECONDS) unless `cloud-model` measures it.
    "codec_cpu_seconds": scale_sim.WORKER_CPU_SECONDS * SEGMENT / (64 * MiB),
    "stored_ratio": scale_sim.STORED_RATIO,  # stored / plaintext (the backup model's, the same bench data)
    "staged_seconds_p50": contract.WAL_BATCH_WINDOW_SECONDS,  # how long raw bytes are billed in staging, typically
}


class CountingStore(LocalStore):
    """A directory store that counts the S3 request each call would be."""

    def __init__(self, root: Path, counts: Counter[str]) -> None:
        super().__init__(root)
        self.counts = counts

    def get(self, key: str) -> bytes:
        self.counts["s3_get_class"] += 1
        return super().get(key)

    def head(self, key: str) -> ObjectInfo | None:
        self.counts["s3_get_class"] += 1
        return super().head(key)

    def put(self, key: str, data: Any, **options: Any) -> None:
        self.counts["s3_put_class"] += 1
        super().put(key, data, **options)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.counts["s3_get_class"] += 1
        return super().get_range(key, start, length)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.counts["s3_put_class"] += 1  # LIST is priced as a PUT-class request
        return super().list(prefix)


class CountingStaging:
    """braid.ports.wal_staging.WalStaging in memory, counting each call as the S3 request S3WalStaging makes."""

    def __init__(self, counts: Counter[str], bucket: LocalStore | None = None) -> None:
        self.counts = counts
        self.bucket = bucket  # where S3 keeps staged objects beside the repository's (a ranged GET of a bundle's head reads them)
        self.tags: Counter[str] = Counter()  # which requests touch a staged object: the floor's items (`floor_row`)
        self.staged_objects: dict[str, tuple[bytes, str, str]] = {}
        self.archived: dict[str, tuple[bytes, str]] = {}
        self._version = 0

    def put_staged(self, key: str, data: bytes | bytearray, sha256: str) -> None:
        self.counts["s3_put_class"] += 1
        self.tags["staged_put"] += 1
        if key in self.staged_objects:
            raise AlreadyExistsError(key)
        self._version += 1
        self.staged_objects[key] = (bytes(data), sha256, str(self._version))
        if self.bucket is not None:
            self.bucket.put(key, bytes(data))

    def staged(self, key: str) -> StagedWal | None:
        self.counts["s3_get_class"] += 1
        found = self.staged_objects.get(key)
        return None if found is None else StagedWal(key, len(found[0]), found[1], found[2])

    def read_staged(self, key: str, version: str | None = None) -> StagedWal | None:
        self.counts["s3_get_class"] += 1
        self.tags["staged_get"] += 1
        found = self.staged_objects.get(key)
        return None if found is None else StagedWal(key, len(found[0]), found[1], found[2], found[0])

    def read_staged_range(self, key: str, version: str | None, start: int, length: int) -> bytes | None:
        self.counts["s3_get_class"] += 1
        self.tags["staged_get"] += 1
        found = self.staged_objects.get(key)
        return None if found is None else found[0][start : start + length]

    def archived_sha256(self, key: str) -> str | None:
        self.counts["s3_get_class"] += 1
        found = self.archived.get(key)
        return None if found is None else found[1]

    def put_archived(self, key: str, blob: bytes | bytearray, sha256: str) -> None:
        self.counts["s3_put_class"] += 1
        self.counts["stored_bytes"] += len(blob)
        if key in self.archived:
            raise AlreadyExistsError(key)
        self.archived[key] = (blob, sha256)

    def remove_staged(self, key: str, version: str | None) -> None:
        self.counts["s3_delete_free"] += 1  # DELETE requests are free (S3 pricing)
        if self.staged_objects.pop(key, None) is not None and self.bucket is not None:
            self.bucket.delete([key])


class CountingKeys:
    """A key service counting its requests as KMS's (GenerateDataKey, Decrypt)."""

    def __init__(self, counts: Counter[str], bucket: LocalStore | None = None) -> None:
        self.counts = counts
        self.bucket = bucket  # where S3 keeps staged objects beside the repository's (a ranged GET of a bundle's head reads them)
        self.key_id = "arn:aws:kms:us-east-1:000000000000:key/model"
        self._keys: dict[bytes, bytes] = {}

    def generate_data_key(self, context: Mapping[str, str]) -> tuple[DataKey, WrappedKey]:
        self.counts["kms_request"] += 1
        material = os.urandom(32)
        ciphertext = os.urandom(48)
        self._keys[ciphertext] = material
        return DataKey(material), WrappedKey(self.key_id, ciphertext, dict(context))

    def unwrap(self, wrapped: WrappedKey) -> DataKey:
        self.counts["kms_request"] += 1
        try:
            return DataKey(self._keys[wrapped.ciphertext])
        except KeyError:
            raise NotFoundError("no such data key") from None


@dataclass(frozen=True)
class Requests:
    """Requests per segment, counted from the real code, by price class: the host's and the WAL worker's; with the
    policy async-bundle, the pusher's and the worker's for bundles (`bundle_messages`: staged objects, so S3 events
    and SQS messages, per segment); with sync-bundle, a plain wal-push's at a backlog."""

    host: dict[str, float]
    host_async: dict[str, float]
    worker: dict[str, float]
    host_bundle: dict[str, float]
    worker_bundle: dict[str, float]
    bundle_messages: float
    # Policy sync-bundle: PostgreSQL's calls of a plain `wal-push` at a backlog (each its own process), the worker's
    # requests for the bundles they staged, and staged objects per segment.
    host_sync_bundle: dict[str, float]
    worker_sync_bundle: dict[str, float]
    sync_messages: float
    # The quiet wal-push's requests that touch its staged object (tags, not prices): the host's staged PUTs and the
    # worker's staged GETs per segment, the items no design of one staged object per segment avoids (`floor_row`).
    staged_puts: float
    staged_gets: float


def _segment(name: str, size: int) -> bytes:
    """A whole segment `name` with a real long page header (braid.format.wal.segment_identity reads it)."""
    import struct

    file = WalFile.parse(name)
    header = struct.pack("<HHIQI4xQII", 0xD110, 0x0006, file.timeline, file.segno(size) * size, 0, 7_000_000_000_000_000_001, size, 8192)
    return header + os.urandom(size - len(header))


def count_requests(segments: int = contract.WAL_BATCH_SIZE, size: int = 1 * MiB, *, pack: bool = True, list_once: bool = True) -> Requests:
    """Push `segments` segments as `wal-push` does (a process each: the repository opened each time), as the
    `--async` pusher does (one process: each alone, then, policy async-bundle, in bundles of a slot), then process
    them as the WAL worker does: one full batch (one container: the repository and archive record read once), and a
    full batch of bundles (one per message: contract.WAL_BATCH_SIZE slots) by its step, with the policies `wal-pack`
    (`pack`) and `worker-list-once` (`list_once`: the batch's bundles share a LIST per directory) on or off."""
    from braid.format.wal_bundle import BUNDLE_FILES, bundle_slot
    from braid.ops.wal import ArchiveInfo
    from braid.ops.wal_bundle_process import process_bundle
    from braid.ops.wal_bundled import stage_bundle
    from braid.ops.wal_lookahead import look_in_bundle, stage_with_mates
    from braid.ops.wal_pack_process import Batch, process_staged_files
    from braid.ops.wal_packed import PackListing
    from braid.ops.wal_process import process_staged
    from braid.ops.wal_stage import stage_wal

    slots = contract.WAL_BATCH_SIZE  # a backlog: one full batch of bundles, a message each
    with tempfile.TemporaryDirectory(prefix="wal-model-") as tmp:
        root = Path(tmp)
        setup: Counter[str] = Counter()
        config = RepositoryConfig.new({"type": "kms", "key_id": "arn:aws:kms:us-east-1:000000000000:key/model"}, "2026-11-28T00:00:00Z", {"stack": "Braid"})
        Repository.create(CountingStore(root / "repo", setup), config)
        # The first segment records the archive; the counted ones start a slot (whole bundles: a backlog).
        first_slot = BUNDLE_FILES * -(-2 // BUNDLE_FILES)  # the first whole slot after the first segment's
        names = ["000000010000000000000001"] + [f"0000000100000000{first_slot + n:08X}" for n in range(segments)]
        files = []
        for name in names:
            (root / name).write_bytes(_segment(name, size))
            files.append(root / name)
        host: Counter[str] = Counter()
        staging = CountingStaging(setup)
        worker: Counter[str] = Counter()
        known: dict[str, ArchiveInfo] = {}
        # The first segment records the archive's identity (once per archive, not per segment): outside the count.
        first = Repository.open(CountingStore(root / "repo", setup))
        stage_wal(first, staging, "pg", files[0])
        process_staged(first, CountingKeys(setup), staging, "pg", WalFile.parse(names[0]), known=known)
        staging.counts, staging.tags = host, Counter()
        for path in files[1:]:  # a plain wal-push each (braid.cli.commands.wal.cmd_wal_push): quiet, no slot-mate is ready
            looked = look_in_bundle(CountingStore(root / "repo", host), "pg", path)  # before config.json
            stage_with_mates(Repository.open(CountingStore(root / "repo", host)), staging, "pg", path, looked=looked)
        host_tags, staging.tags = staging.tags, Counter()
        pusher: Counter[str] = Counter()
        resident = Repository.open(CountingStore(root / "repo", Counter()))  # the async pusher opens it once
        resident_staging = CountingStaging(pusher)
        packs = PackListing()  # the pusher lists each directory's packs once in its life (LIST: PUT-class)
        for path in files[1:]:
            stage_wal(Repository(CountingStore(root / "repo", pusher), resident.config), resident_staging, "pg", path, packs)
        staging.counts = worker
        container = Repository.open(CountingStore(root / "repo", Counter()))  # once per container, not per segment
        container = Repository(CountingStore(root / "repo", worker), container.config)
        keys = CountingKeys(worker)
        batch = [(WalFile.parse(name), None) for name in names[1:]]
        pack_files = contract.WAL_PACK_FILES if pack else 1
        for start in range(0, len(batch), contract.WAL_BATCH_SIZE):
            done = process_staged_files(container, keys, staging, "pg", batch[start : start + contract.WAL_BATCH_SIZE], pack_files=pack_files, known=known)
            assert all(not isinstance(d, Exception) for d in done), done
        assert not staging.staged_objects, "every staged file was processed and removed"
        worker_tags = staging.tags
        # async-bundle: a full batch of whole slots (a backlog) to a new cluster's archive (a second name), bundled.
        bundler: Counter[str] = Counter()
        bundled = CountingStaging(setup)
        stage_wal(Repository(CountingStore(root / "repo", setup), resident.config), bundled, "pg2", files[0])
        process_staged(first, CountingKeys(setup), bundled, "pg2", WalFile.parse(names[0]), known=known)
        bundled.counts = bundler
        by_slot: dict[str, list[Path]] = {}
        for n in range(slots * BUNDLE_FILES):
            path = root / "bundled" / f"0000000100000000{first_slot + n:08X}"
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(_segment(path.name, size))
            by_slot.setdefault(bundle_slot(WalFile.parse(path.name)), []).append(path)
        bundle_packs = PackListing()
        for members in by_slot.values():
            results = stage_bundle(Repository(CountingStore(root / "repo", bundler), resident.config), bundled, "pg2", members, bundle_packs)
            assert all(not isinstance(r, Exception) for r in results), results
        messages = len(bundled.staged_objects)
        assert messages == len(by_slot) == slots and all(len(m) == BUNDLE_FILES for m in by_slot.values()), "whole bundles, one object each"
        worker_bundle: Counter[str] = Counter()
        bundled.counts = worker_bundle
        step = Batch(
            Repository(CountingStore(root / "repo", worker_bundle), resident.config), CountingKeys(worker_bundle), bundled, "pg2", known=known,
            listings={} if list_once else None,
        )
        for key in list(bundled.staged_objects):
            slot = WalFile.parse(key.rpartition("/")[2].removesuffix(".bundle"))
            done_bundle = process_bundle(step, slot, bundled.staged_objects[key][2], pack_files=pack_files)  # the event's version
            assert not isinstance(done_bundle, Exception), done_bundle
        assert not bundled.staged_objects, "every staged bundle was processed and removed"
        host_sync, worker_sync, sync_messages = _count_sync_bundle(root, first, resident.config, first_slot, size, known, pack_files, list_once)

    def each(counts: Counter[str], per: float = float(segments)) -> dict[str, float]:
        return {k: v / per for k, v in counts.items() if k != "stored_bytes"}

    bundled_segments = float(slots * BUNDLE_FILES)
    return Requests(
        each(host), each(pusher), each(worker), each(bundler, bundled_segments), each(worker_bundle, bundled_segments), messages / bundled_segments,
        each(host_sync, bundled_segments), each(worker_sync, bundled_segments), sync_messages / bundled_segments,
        host_tags["staged_put"] / segments, worker_tags["staged_get"] / segments,
    )


def _count_sync_bundle(
    root: Path, first: Repository, config: RepositoryConfig, first_slot: int, size: int, known: dict[str, Any], pack_files: int, list_once: bool
) -> tuple[Counter[str], Counter[str], int]:
    """Policy sync-bundle, counted: a full batch of whole slots of segments ready at once (a backlog) in a pg_wal directory, archived
    as PostgreSQL does (one plain wal-push process per segment, in order, its `.ready` renamed `.done` after the call),
    to a new archive (a third name), then each staged object processed by the worker's step. Returns the host's and
    the worker's requests and the staged objects (S3 events, SQS messages)."""
    from braid.format.wal_bundle import BUNDLE_FILES
    from braid.ops.wal_bundle_process import process_bundle
    from braid.ops.wal_lookahead import look_in_bundle, stage_with_mates
    from braid.ops.wal_pack_process import Batch
    from braid.ops.wal_process import process_staged
    from braid.ops.wal_stage import stage_wal

    setup: Counter[str] = Counter()
    staging = CountingStaging(setup, LocalStore(root / "repo"))
    wal = root / "pg_wal"
    (wal / "archive_status").mkdir(parents=True)
    opening = wal / "000000010000000000000001"  # the archive's first segment records it: outside the count
    opening.write_bytes(_segment(opening.name, size))
    stage_wal(Repository(CountingStore(root / "repo", setup), config), staging, "pg3", opening)
    process_staged(first, CountingKeys(setup), staging, "pg3", WalFile.parse(opening.name), known=known)
    order = []
    for n in range(contract.WAL_BATCH_SIZE * BUNDLE_FILES):
        path = wal / f"0000000100000000{first_slot + n:08X}"
        path.write_bytes(_segment(path.name, size))
        (wal / "archive_status" / f"{path.name}.ready").touch()
        order.append(path)
    host: Counter[str] = Counter()
    staging.counts = host
    for path in order:  # PostgreSQL: one call at a time, each a process (braid.cli.commands.wal.cmd_wal_push's steps)
        looked = look_in_bundle(CountingStore(root / "repo", host), "pg3", path)  # before config.json
        if looked is None or looked.result is None:
            stage_with_mates(Repository.open(CountingStore(root / "repo", host)), staging, "pg3", path, looked=looked)
        (wal / "archive_status" / f"{path.name}.ready").rename(wal / "archive_status" / f"{path.name}.done")
    messages = len(staging.staged_objects)
    assert messages == contract.WAL_BATCH_SIZE, "a backlog of whole slots is one staged bundle each"
    worker: Counter[str] = Counter()
    staging.counts = worker
    step = Batch(
        Repository(CountingStore(root / "repo", worker), config), CountingKeys(worker), staging, "pg3", known=known, listings={} if list_once else None
    )
    for key in list(staging.staged_objects):
        slot = WalFile.parse(key.rpartition("/")[2].removesuffix(".bundle"))
        done = process_bundle(step, slot, staging.staged_objects[key][2], pack_files=pack_files)
        assert not isinstance(done, Exception), done
    assert not staging.staged_objects, "every staged bundle was processed and removed"
    return host, worker, messages


def measure_codec_cpu(data: bytes, level: int = 3) -> float:
    """CPU seconds (this machine) of encoding one segment's bytes as the worker does (braid.format.wal_object.encode_wal)."""
    key = DataKey(os.urandom(32))
    wrapped = WrappedKey("k", os.urandom(48), {})
    encode_wal(key, wrapped, "pg@wal/000000010000000000000001", data[:SEGMENT], level)  # warm-up
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        encode_wal(key, wrapped, "pg@wal/000000010000000000000001", data[:SEGMENT], level)
        best = min(best, time.process_time() - start)
    return best


def segment_seconds(
    codec_cpu: float, stored_ratio: float, worker_requests: Mapping[str, float], memory_mb: int = contract.WAL_MEMORY_MB, *, overlap: bool = False
) -> float:
    """The WAL worker's billed seconds for one segment: its GET and PUT at the function's network rate, the codec
    at the vCPU share `memory_mb` buys, and each request's round trip (KMS's too). With `overlap` (the policy
    worker-overlap: a second lane reads a pack's next staged file while this one is encoded) the GET hides behind
    the codec; the PUT of the pack still follows it."""
    network = scale_sim.lambda_network_mb_s(memory_mb) * 1e6
    get, put = SEGMENT / network, SEGMENT * stored_ratio / network
    cpu = codec_cpu * scale_sim.FULL_VCPU_MB / min(memory_mb, scale_sim.FULL_VCPU_MB)
    work = (max(get, cpu) if overlap else get + cpu) + put
    return work + sum(worker_requests.values()) * scale_sim.REQUEST_SECONDS  # a DELETE is free but takes its round trip


def cost_per_tib(
    requests: Requests, codec_cpu: float, stored_ratio: float, *, asynchronous: bool = False, overlap: bool = False, bundle: bool = False,
    lookahead: bool = False,
) -> dict[str, float]:
    """$ per TiB of WAL by item: the host's and the worker's requests, KMS, SQS, Lambda, raw bytes billed in staging.
    `overlap`: the worker's policy worker-overlap (a pack's, or a bundle's, next member read during the codec);
    `bundle`: `--async`'s policy async-bundle at a backlog (whole bundles: one staged object, S3 event and SQS
    message each); `lookahead`: a plain wal-push's policy sync-bundle at a backlog (PostgreSQL's calls: the slot's
    first stages the bundle, the others find their segment in it)."""
    n = SEGMENTS_PER_TIB
    bundled = bundle and asynchronous
    looked = lookahead and not asynchronous
    host = requests.host_bundle if bundled else requests.host_async if asynchronous else requests.host_sync_bundle if looked else requests.host
    worker = requests.worker_bundle if bundled else requests.worker_sync_bundle if looked else requests.worker
    # staged objects per segment: S3 events, SQS messages
    messages = requests.bundle_messages if bundled else requests.sync_messages if looked else 1.0
    batch = contract.WAL_BATCH_SIZE
    seconds = segment_seconds(codec_cpu, stored_ratio, worker, overlap=overlap)
    gb_s = seconds * contract.WAL_MEMORY_MB / 1024
    staged_gb_months = (TIB / 1e9) * ASSUME["staged_seconds_p50"] / (30 * 86400)
    return {
        "host s3 PUT-class": n * host.get("s3_put_class", 0) * PRICES["s3_put_class"],
        "host s3 GET-class": n * host.get("s3_get_class", 0) * PRICES["s3_get_class"],
        "worker s3 PUT-class": n * worker.get("s3_put_class", 0) * PRICES["s3_put_class"],
        "worker s3 GET-class": n * worker.get("s3_get_class", 0) * PRICES["s3_get_class"],
        "kms requests": n * (host.get("kms_request", 0) + worker.get("kms_request", 0)) * PRICES["kms_request"],
        # S3's SendMessage per staged object; per batch one ReceiveMessage (a full batch) and one DeleteMessageBatch.
        "sqs requests": n * messages * (1 + 2 / batch) * PRICES["sqs_request"],
        "lambda invocations": n * messages / batch * PRICES["lambda_request"],
        "lambda GB-seconds": n * gb_s * PRICES["lambda_gb_s"],
        "staging storage": staged_gb_months * PRICES["s3_storage_gb_month"],
    }


def p99_seconds(
    codec_cpu: float, stored_ratio: float, worker_requests: Mapping[str, float], *, overlap: bool = True, files_per_message: int = 1
) -> dict[str, float]:
    """The worst case of a full batch, by step: the p99 from a push's exit 0 to its final encrypted object (a batch of
    bundles holds `files_per_message` segments per message)."""
    seconds = segment_seconds(codec_cpu, stored_ratio, worker_requests, overlap=overlap)
    return {
        "s3 event to sqs (assumed p99)": ASSUME["s3_event_p99_seconds"],
        "long poll": ASSUME["poll_seconds"],
        "batching window": float(contract.WAL_BATCH_WINDOW_SECONDS),
        "cold start": scale_sim.COLD_START_SECONDS,
        "full batch, one file after another": contract.WAL_BATCH_SIZE * files_per_message * seconds,
    }


MODES = (
    # (row, --async, at a backlog): as deployed, every policy on
    ("wal-push", False, True),
    ("wal-push --async", True, True),
    ("wal-push, quiet", False, False),
    ("wal-push --async, quiet", True, False),
)


def table_rows(
    requests: Requests, codec_cpu: float, stored_ratio: float, backup_cost_per_tib: float | None, *, overlap: bool = True
) -> list[dict[str, Any]]:
    """The `wal` table's rows (stable names): one per archive_command mode, as deployed (every policy on), at a backlog
    (a full batch of whole slots ready: `--async`'s bundles, a plain push's look-ahead bundles) and quiet (one segment ready at a
    time: each staged alone), then the floor of one staged object per segment (`floor_row`)."""
    from braid.format.wal_bundle import BUNDLE_FILES

    rows = []
    for mode, asynchronous, backlog in MODES:
        bundled = backlog  # a backlog is staged in bundles by both modes (async-bundle, sync-bundle)
        worker = (requests.worker_bundle if asynchronous else requests.worker_sync_bundle) if bundled else requests.worker
        p99 = p99_seconds(codec_cpu, stored_ratio, worker, overlap=overlap, files_per_message=BUNDLE_FILES if bundled else 1)
        costs = cost_per_tib(requests, codec_cpu, stored_ratio, asynchronous=asynchronous, overlap=overlap, bundle=bundled, lookahead=bundled)
        total = sum(costs.values())
        rows.append({
            "mode": mode,
            "wal_cost_per_tib": round(total, 4),
            "backup_cost_per_tib": None if backup_cost_per_tib is None else round(backup_cost_per_tib, 4),
            "wal_over_backup": None if not backup_cost_per_tib else round(total / backup_cost_per_tib, 3),
            "p99_seconds_to_final": round(sum(p99.values()), 2),
            "segment_seconds": round(segment_seconds(codec_cpu, stored_ratio, worker, overlap=overlap), 3),
            "costs_per_tib": {k: round(v, 5) for k, v in costs.items()},
            "p99_steps": {k: round(v, 3) for k, v in p99.items()},
        })
    rows.append(floor_row(requests, codec_cpu, backup_cost_per_tib))
    return rows


def floor_row(requests: Requests, codec_cpu: float, backup_cost_per_tib: float | None) -> dict[str, Any]:
    """The least a TiB of WAL can cost when each segment is staged alone (a plain wal-push on a quiet cluster: PostgreSQL
    hands over one segment per call, and exit 0 needs it durable in S3): the staged PUT, its S3 event's SQS message,
    the worker's GET of it (counted: the tags of a quiet push's staged requests) and the codec's CPU, which bills
    the same GB-s at any memory up to one vCPU (codec_cpu x 1,769 MB). Left out, so the floor is below any real
    path: the host's checks, the final PUT, KMS, the invocations, the network's seconds and each request's round trip."""
    n = SEGMENTS_PER_TIB
    costs = {
        "host s3 PUT-class": n * requests.staged_puts * PRICES["s3_put_class"],
        "worker s3 GET-class": n * requests.staged_gets * PRICES["s3_get_class"],
        "sqs requests": n * requests.staged_puts * PRICES["sqs_request"],
        "lambda GB-seconds": n * codec_cpu * scale_sim.FULL_VCPU_MB / 1024 * PRICES["lambda_gb_s"],
    }
    total = sum(costs.values())
    return {
        "mode": "floor: one staged object per segment",
        "wal_cost_per_tib": round(total, 4),
        "backup_cost_per_tib": None if backup_cost_per_tib is None else round(backup_cost_per_tib, 4),
        "wal_over_backup": None if not backup_cost_per_tib else round(total / backup_cost_per_tib, 3),
        "p99_seconds_to_final": None,
        "segment_seconds": round(codec_cpu * scale_sim.FULL_VCPU_MB / contract.WAL_MEMORY_MB, 3),
        "costs_per_tib": {k: round(v, 5) for k, v in costs.items()},
        "p99_steps": {},
    }


# The WAL path's policies, each built and its requests counted by running its code: `wal-pack`
# (braid.ops.wal_pack_process), `worker-overlap` (its second lane: the staged GET hidden behind the codec, priced
# here), `async-bundle` (wal-push --async staging a slot's ready segments in one PUT at a backlog:
# braid.ops.wal_bundled, braid.ops.wal_bundle_process), `sync-bundle` (a plain wal-push doing so for its
# segment's ready slot-mates: braid.ops.wal_lookahead) and `worker-list-once` (a batch's bundles share one LIST
# per directory: braid.ops.wal_bundle_process).
POLICIES = ("wal-pack", "async-bundle", "sync-bundle", "worker-list-once", "worker-overlap")
BUILT = {"wal-pack": True, "async-bundle": True, "sync-bundle": True, "worker-list-once": True, "worker-overlap": True}
COUNTED = frozenset({"wal-pack", "worker-list-once"})  # the policies that change what the code requests: counted on and off


def count_policies() -> dict[frozenset[str], Requests]:
    """count_requests for each combination of the COUNTED policies (the key: those on)."""
    return {
        frozenset(p for p, on in (("wal-pack", pack), ("worker-list-once", once)) if on): count_requests(pack=pack, list_once=once)
        for pack in (True, False) for once in (True, False)
    }


def policy_rows(
    counts: Mapping[frozenset[str], Requests], codec_cpu: float, stored_ratio: float, backup_cost_per_tib: float | None
) -> list[dict[str, Any]]:
    """$ per TiB per mode at a backlog with each policy alone, all off, and all on: rows of the `wal policies` table."""
    sets: list[tuple[str, set[str]]] = [("none (before)", set())] + [(p, {p}) for p in POLICIES] + [
        ("wal-pack + worker-overlap", {"wal-pack", "worker-overlap"}),
        ("all but worker-list-once", set(POLICIES) - {"worker-list-once"}),
        ("all", set(POLICIES)),
    ]
    rows = []
    for label, on in sets:
        requests = counts[frozenset(on & COUNTED)]
        for mode, asynchronous in (("wal-push", False), ("wal-push --async", True)):
            if on and on <= {"async-bundle", "sync-bundle"} and ("async-bundle" in on) != asynchronous:
                continue  # each bundle policy is its own mode's alone
            overlap = {"worker-overlap", "wal-pack"} <= on  # the second lane reads a pack's members: alone, it has nothing to overlap
            costs = cost_per_tib(
                requests, codec_cpu, stored_ratio, asynchronous=asynchronous, overlap=overlap, bundle="async-bundle" in on, lookahead="sync-bundle" in on
            )
            total = sum(costs.values())
            rows.append({
                "policies": label, "mode": mode, "built": all(BUILT[p] for p in on), "wal_cost_per_tib": round(total, 4),
                "wal_over_backup": None if not backup_cost_per_tib else round(total / backup_cost_per_tib, 3),
            })
    return rows
