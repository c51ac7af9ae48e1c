"""cloud-model: time after stream end and cost per TiB on arm64 Lambda, from measured worker CPU.

Measured here (in a child process, the real worker code):
- `braid.pipeline.worker.process_item` on map items of up to
  `max_chunks_per_item` chunks of the bench data: ranged GETs of a staging
  segment, `store_chunk` (ChunkCodec: Poly1305 + zstd + AES-256-GCM, then the
  CRC64NVME and create-only PUT of S3Store) on the worker's lanes, and the
  result record; against s3proxy on loopback (moto with --s3-server moto).
  Its process CPU per chunk is the Lambda's billed work, less network waits.
- the same chunks through `store_chunk` into a store that keeps nothing:
  the codec's share, for attribution.

Modelled (printed with every assumption): a 1 TiB backup at 100, 500 and
1,000 workers, using the pipeline's own sizing (braid.pipeline.item_sizing
`chunks_per_item`, MAX_ITEMS_PER_ROUND; the execution input's defaults; the
staging segment size) and the worker's memory and lanes read from
infra/braid_infra/functions.py. The x86 CPU figure is scaled to Graviton2 by
a stated factor, with a sensitivity table.
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench_lib import s3proxy
from bench_lib.context import Context, add_engine_options, add_option_once
from bench_lib.report import Section, Table
from braid.agent.limits import default_segment_parts
from braid.pipeline.execution_input import DEFAULT_MAX_CHUNKS_PER_ITEM, DEFAULT_POLL_SECONDS
from braid.pipeline.item_sizing import MAX_ITEMS_PER_ROUND, chunks_per_item

NAME = "cloud-model"
HELP = "cloud model: seconds after stream end and $ per TiB at 100/500/1000 arm64 Lambda workers, from measured worker CPU"
ORDER = 40
IN_ALL = True
TIME_TARGET = 60.0  # seconds after stream end at 500 workers
COST_TARGET = 0.30  # $ per TiB
TIB = 2**40

# us-east-1 list prices used by the model.
PRICES = {
    "lambda_arm_gb_s": 0.0000133334,
    "lambda_request": 0.20 / 1e6,
    "s3_put_class": 0.005 / 1000,  # PUT, COPY, POST, LIST, UploadPart, Create/CompleteMultipartUpload
    "s3_get_class": 0.0004 / 1000,  # GET, HEAD
    "sfn_standard_transition": 0.025 / 1000,
    "sfn_express_request": 1.00 / 1e6,
    "sfn_express_gb_s": 0.00001667,
    "kms_request": 0.03 / 10000,
}

# Assumptions (stated in the output).
ASSUME = {
    "arm_speed": 0.8,  # Graviton2 per-core speed vs this machine for zstd+AES+CRC (CPU s on arm = x86 s / 0.8)
    "lambda_s3_mb_s": 90.0,  # one Lambda's S3 throughput per stream, MB/s (GET of a part / PUT of a chunk)
    "lambda_nic_mb_s": 300.0,  # one Lambda's total network throughput at 1,769 MB, MB/s
    "map_start_s": 2.0,  # Distributed Map: from the round's start to its first children running
    "cold_start_s": 1.0,  # per container: init (billed) of Python + layer
    "invoke_overhead_s": 0.15,  # per item: Lambda invoke + child execution scheduling
    "express_memory_gb": 0.064,  # EXPRESS children billed in 64 MB steps
    "finalize_s_per_1000_items": 1.5,  # Finalize: LIST + GET of result records (threaded), per 1,000 items
    "finalize_fixed_s": 2.0,  # manifest write + authentication, staging delete, event
    "agent_mb_s": 300.0,  # the agent's upload rate (sets how long the stream lasts and how often the planner loops)
    "standard_transitions_per_item": 2,  # STANDARD children: iteration + Worker task (no retries)
    "parent_transitions_per_loop": 3,  # PlanSegments, SegmentsReady?, WaitForSegments
}

# Child: put the data as one staging segment, then time process_item and store_chunk.
_MEASURE = r"""
import json, os, sys, time, threading
from braid.adapters.aws.clients import s3_client
from braid.adapters.aws.s3 import S3Store
from braid.format.ids import BackupRef
from braid.format.chunk import ChunkCodec
from braid.format.staging import MapItem
from braid.pipeline.worker import ChunkLanes, process_item
from braid.format.keys import DataKey
from braid.format.staging import segment_key
from braid.format.checksum import crc64nvme, encode_crc64nvme
from braid.engine.chunk_worker import ChunkTask, store_chunk
doc = json.loads(sys.argv[1])
chunk, per_item, lanes_n, level, reps = doc["chunk"], doc["per_item"], doc["lanes"], doc["level"], doc["reps"]
with open(doc["path"], "rb") as f:
    data = f.read()
size = len(data)
client = s3_client(endpoint_url=doc["endpoint"])
try:
    client.create_bucket(Bucket=doc["bucket"])
except Exception:
    pass
key = DataKey(os.urandom(32))
out = {"size": size, "items": [], "codec": []}
class NullStore:
    url = "null://"
    def put(self, key, data, *, checksum=None, create_only=False, durable=True):
        pass
view = memoryview(data)
# The codec alone (thread CPU per chunk), one lane, after a warm-up.
codec = ChunkCodec(key, level)
ref0 = BackupRef.new("bench")
store_chunk(codec, NullStore(), ref0, ChunkTask(0, 0, 0), view[:chunk])
for rep in range(reps):
    for i in range(0, size, chunk):
        t0 = time.thread_time()
        store_chunk(codec, NullStore(), ref0, ChunkTask(i // chunk, 0, i), view[i:i + chunk])
        out["codec"].append(time.thread_time() - t0)
lanes = ChunkLanes(lanes_n)
for rep in range(reps + 1):  # the first pass warms the lanes' codecs and connections
    ref = BackupRef.new("bench")
    store = S3Store(client, doc["bucket"], f"model{rep}")
    seg = segment_key(ref, 0, 0)
    t0 = time.perf_counter()
    store.put(seg, data)
    print(f"segment put {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    parts = -(-size // chunk)
    first = 1
    while first <= parts:
        count = min(per_item, parts - first + 1)
        crcs = tuple(encode_crc64nvme(crc64nvme(memoryview(data)[(p - 1) * chunk : p * chunk])) for p in range(first, first + count))
        item = MapItem(seg, 0, 0, 0, size, chunk, first, count, first - 1, crcs)
        c0, w0 = time.process_time(), time.perf_counter()
        outcome = process_item(store, ref, item, key=key, level=level, lanes=lanes)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        if rep:
            out["items"].append({"chunks": count, "cpu": cpu, "wall": wall, "bytes_in": outcome.bytes_in, "bytes_out": outcome.bytes_out})
        first += count
        print(f"item of {count}: {wall:.1f} s wall, {cpu:.2f} s cpu", file=sys.stderr, flush=True)
    for info in list(store.list("")):
        client.delete_object(Bucket=doc["bucket"], Key=store.object_key(info.key))
print(json.dumps(out))
"""


def add_arguments(parser) -> None:
    add_engine_options(parser)
    add_option_once(
        parser, "--s3-server", choices=("s3proxy", "moto"), default="s3proxy",
        help="cloud: the local S3-compatible server (default s3proxy, falling back to moto if it cannot start)",
    )
    add_option_once(parser, "--arm-speed", type=float, default=ASSUME["arm_speed"],
                    help="cloud-model: Graviton2 per-core speed relative to this machine (default 0.8)")
    add_option_once(parser, "--agent-rate", type=float, default=ASSUME["agent_mb_s"],
                    help="cloud-model: the agent's upload rate in MB/s for the streamed scenario (default 300)")
    add_option_once(parser, "--worker-cpu", type=float, nargs=2, metavar=("SECONDS", "RATIO"), default=None,
                    help="cloud-model: skip the measurement; x86 CPU seconds per chunk and stored/plaintext ratio")


def worker_spec(root: Path) -> tuple[int, int]:
    """(worker memory MB, lanes): the values the stack deploys, from braid.contract."""
    from braid import contract

    return contract.WORKER_MEMORY_MB, contract.DEFAULT_WORKER_LANES


@dataclass(frozen=True)
class Measured:
    cpu_per_chunk: float  # x86 s, whole worker item (GET + codec + PUT + result), per full chunk
    codec_per_chunk: float  # x86 s, store_chunk into a null store
    wall_per_chunk: float  # x86 s on this box, against the local server (not used by the model)
    ratio: float  # stored / plaintext
    chunks_measured: int


def measure(ctx: Context, memory_lanes: tuple[int, int], notes: list[str]) -> tuple[Measured, str]:
    args = ctx.args
    data = ctx.dataset()
    chunk = args.chunk_size
    work = ctx.scratch("cloud-model")
    server: s3proxy.Server
    if args.s3_server == "moto":
        server = s3proxy.start_moto(work, ctx.venv_bin, "moto-s3")
    else:
        try:
            server = s3proxy.start_s3proxy(ctx.workdir, ctx.log)
        except s3proxy.ServerError as exc:
            notes.append(f"s3proxy could not be used ({exc}); the worker was measured against moto's server")
            server = s3proxy.start_moto(work, ctx.venv_bin, "moto-s3")
    try:
        env = ctx.env(**s3proxy.credentials_env())
        env.pop("AWS_ENDPOINT_URL", None)
        if server.kind == "s3proxy":
            env = s3proxy.compat_env(env)
        doc = {
            "path": str(data.path), "endpoint": server.endpoint, "bucket": "braid-bench-model", "chunk": chunk,
            "per_item": DEFAULT_MAX_CHUNKS_PER_ITEM, "lanes": memory_lanes[1], "level": args.level, "reps": max(1, min(ctx.reps, 3)),
        }
        ctx.log(f"cloud-model: timing process_item ({doc['per_item']} chunks per item, {doc['lanes']} lanes) against {server.kind} ...")
        proc = subprocess.run([str(ctx.python), "-c", _MEASURE, json.dumps(doc)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"worker measurement failed: {proc.stderr.strip().splitlines()[-3:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        server.stop()
    items = out["items"]
    full = [i for i in items if i["chunks"] == DEFAULT_MAX_CHUNKS_PER_ITEM] or items
    # Least CPU per chunk over the repetitions, like the other benchmarks' "best".
    cpu = min(i["cpu"] / i["chunks"] for i in full)
    wall = min(i["wall"] / i["chunks"] for i in full)
    chunks_per_pass = -(-out["size"] // chunk)
    codec_runs = [out["codec"][k : k + chunks_per_pass] for k in range(0, len(out["codec"]), chunks_per_pass)]
    codec = min(sum(run) / len(run) for run in codec_runs)
    ratio = sum(i["bytes_out"] for i in items) / sum(i["bytes_in"] for i in items)
    scale = out["size"] / chunks_per_pass / chunk  # < 1 when the last chunk is short
    return Measured(cpu / scale, codec / scale, wall / scale, ratio, sum(i["chunks"] for i in items)), f"{server.kind} {server.version}".strip()


@dataclass(frozen=True)
class Estimate:
    workers: int
    scenario: str  # "streamed" or "staged"
    per_item: int
    items: int
    item_seconds: float
    after_end: float
    gb_s: float
    costs: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.costs.values())


def item_seconds(k: int, cpu_chunk: float, chunk: int, ratio: float, lanes: int, assume: dict) -> float:
    """One map item of k chunks on `lanes` lanes (pipeline_worker.ChunkLanes).

    Each chunk is a GET of its part, the codec (one vCPU at 1,769 MB, shared by
    the lanes) and the PUT of the stored chunk. With several lanes, one chunk's
    I/O overlaps another's CPU, so the item takes about the larger of the
    total CPU and the total I/O spread over the lanes (capped by the
    function's network), plus the first GET and the last PUT that nothing
    overlaps."""
    mb = 1e6
    per_stream = assume["lambda_s3_mb_s"]
    rate = min(per_stream * max(1, min(lanes, k)), assume["lambda_nic_mb_s"])
    get_s, put_s = chunk / mb / per_stream, chunk * ratio / mb / per_stream
    io_total = k * chunk * (1 + ratio) / mb / rate
    if k == 1 or lanes == 1:
        body = k * (get_s + cpu_chunk + put_s)
    else:
        body = get_s + max(k * cpu_chunk, io_total) + put_s
    return body + assume["invoke_overhead_s"]


def estimate(
    workers: int,
    *,
    cpu_chunk_arm: float,
    ratio: float,
    memory_mb: int,
    lanes: int,
    chunk: int,
    scenario: str = "streamed",
    size: int = TIB,
    per_item: int | None = None,
    children: str = "EXPRESS",
    assume: dict = ASSUME,
) -> Estimate:
    """1 TiB through the pipeline at `workers` concurrency.

    streamed: the pipeline runs while the agent uploads. The planner plans
    whatever segments completed since its last round (about one 2 GiB segment
    per round when the round is quicker than the agent's segment interval), and
    item_sizing.chunks_per_item keeps those items full (streaming=True); only
    the last round, planned after stream end, is spread over the workers.
    staged: the whole TiB is staged before the fan-out starts (the upper bound
    on time after stream end; items sized from all 16,384 chunks)."""
    mb = 1e6
    chunks = -(-size // chunk)
    seg_chunks = default_segment_parts(chunk)
    segments = -(-chunks // seg_chunks)
    stream_s = size / mb / assume["agent_mb_s"]
    seg_interval = stream_s / segments
    if scenario == "streamed":
        # A round: plan + map start + one wave of items; segments that completed meanwhile go in the next.
        round_s = 1.0 + assume["map_start_s"] + item_seconds(1, cpu_chunk_arm, chunk, ratio, lanes, assume)
        per_round = seg_chunks * max(1, math.ceil(round_s / seg_interval))
        k = per_item or chunks_per_item(per_round, workers, DEFAULT_MAX_CHUNKS_PER_ITEM, streaming=True)
        rounds = -(-chunks // per_round)
        loops = max(rounds, math.ceil(stream_s / DEFAULT_POLL_SECONDS))
    else:
        k = per_item or chunks_per_item(chunks, workers, DEFAULT_MAX_CHUNKS_PER_ITEM)
        per_round = min(chunks, MAX_ITEMS_PER_ROUND * k)
        rounds = -(-chunks // per_round)
        loops = rounds + 1
    items = -(-chunks // k)
    item = item_seconds(k, cpu_chunk_arm, chunk, ratio, lanes, assume)
    gb = memory_mb / 1024
    # Billed: every item's duration, plus one init per container.
    gb_s = items * item * gb + min(workers, items) * assume["cold_start_s"] * gb

    finalize = assume["finalize_fixed_s"] + items / 1000 * assume["finalize_s_per_1000_items"]
    if scenario == "streamed":
        # Left at stream end: the last round's chunks, after up to one poll interval.
        k_last = chunks_per_item(per_round, workers, DEFAULT_MAX_CHUNKS_PER_ITEM) if per_item is None else per_item
        last_items = -(-per_round // k_last)
        after_end = (DEFAULT_POLL_SECONDS + assume["map_start_s"] + -(-last_items // workers) * item_seconds(k_last, cpu_chunk_arm, chunk, ratio, lanes, assume)
                     + assume["cold_start_s"] + finalize)
    else:
        after_end = rounds * assume["map_start_s"] + -(-items // workers) * item + assume["cold_start_s"] + finalize

    p = PRICES
    s3_put = (
        chunks  # agent UploadPart
        + 2 * segments + segments  # Create/CompleteMultipartUpload, segment records
        + 3  # session, stream end, config read is a GET
        + chunks  # worker chunk PUT
        + items  # worker result records
        + loops * 2  # planner: LIST of segment records and of rounds per loop
        + rounds  # round files (create-only PUT)
        + items / 1000 + chunks / 1000  # Finalize LIST results, LIST chunks
        + 2  # manifest + completed event marker
        + chunks / 1000  # agent's check_chunks_listed
    )
    s3_get = (
        chunks  # worker ranged GET of its part
        + items  # Finalize reads each result record
        + rounds  # ItemReader reads each round file
        + loops * 2  # planner reads session and stream end
    )
    if children == "EXPRESS":
        sfn = items * p["sfn_express_request"] + items * item * assume["express_memory_gb"] * p["sfn_express_gb_s"]
    else:
        sfn = items * assume["standard_transitions_per_item"] * p["sfn_standard_transition"]
    parent_transitions = 4 + loops * assume["parent_transitions_per_loop"]  # Prepare, Finalize, end; Plan, Choice, Map|Wait per loop
    coordinator_gb_s = loops * 0.5 * 0.25 + (2.0 + items / 1000 * 1.5) * 1.0  # Plan (256 MB, ~0.5 s) per loop, Finalize (1 GB)
    costs = {
        "lambda compute (worker)": gb_s * p["lambda_arm_gb_s"],
        "lambda requests": (items + loops + 3) * p["lambda_request"],
        "lambda coordinators": coordinator_gb_s * p["lambda_arm_gb_s"],
        "s3 PUT/LIST": s3_put * p["s3_put_class"],
        "s3 GET": s3_get * p["s3_get_class"],
        "step functions children": sfn,
        "step functions parent": parent_transitions * p["sfn_standard_transition"],
        "kms": (1 + min(workers, items) + 1) * p["kms_request"],  # GenerateDataKey, Decrypt per container, Finalize
    }
    return Estimate(workers, scenario, k, items, item, after_end, gb_s, costs)


def run(ctx: Context) -> Section:
    args = ctx.args
    chunk = args.chunk_size
    memory, lanes = worker_spec(ctx.root)
    section = Section(NAME, f"1 TiB on arm64 Lambda ({memory} MB, {lanes} lanes), {chunk // 2**20} MiB chunks, from measured worker CPU")
    notes: list[str] = []
    if args.worker_cpu:
        cpu, ratio = args.worker_cpu
        measured, server = Measured(cpu, float("nan"), float("nan"), ratio, 0), "given with --worker-cpu (not measured)"
    else:
        measured, server = measure(ctx, (memory, lanes), notes)
    arm = args.arm_speed
    assume = dict(ASSUME, arm_speed=arm, agent_mb_s=args.agent_rate)
    cpu_arm = measured.cpu_per_chunk / arm

    def est(workers: int, **kw) -> Estimate:
        kw.setdefault("lanes", lanes)
        kw.setdefault("assume", assume)
        cpu = kw.pop("cpu", cpu_arm)
        return estimate(workers, cpu_chunk_arm=cpu, ratio=measured.ratio, memory_mb=memory, chunk=chunk, **kw)

    rows = []
    results: dict[tuple[int, str], Estimate] = {}
    for workers in (100, 500, 1000):
        for scenario in ("streamed", "staged"):
            e = est(workers, scenario=scenario)
            results[(workers, scenario)] = e
            c = e.costs
            rows.append([
                workers, scenario, e.per_item, e.items, round(e.item_seconds, 2), round(e.after_end, 1), round(e.gb_s),
                round(c["lambda compute (worker)"] + c["lambda requests"] + c["lambda coordinators"], 3),
                round(c["s3 PUT/LIST"] + c["s3 GET"], 3), round(c["step functions children"] + c["step functions parent"], 4),
                round(c["kms"], 5), round(e.total, 3),
            ])
    section.tables.append(Table(
        "1 TiB as the stack runs it: EXPRESS children, items sized by item_sizing.chunks_per_item "
        f"(max {DEFAULT_MAX_CHUNKS_PER_ITEM}, full while streaming)",
        ["workers", "scenario", "chunks/item", "items", "item s", "s after end", "GB-s", "$ lambda", "$ s3", "$ sfn", "$ kms", "$ total/TiB"],
        rows,
    ))

    # The levers at 500 workers: child workflow type x chunks per item x lanes (streamed upload).
    options = []
    for children in ("STANDARD", "EXPRESS"):
        for k in (1, 2, 4, 8, 16):
            for n_lanes in sorted({lanes, 4}):
                if children == "STANDARD" and n_lanes != lanes:
                    continue
                e = est(500, per_item=k, children=children, lanes=n_lanes, scenario="streamed")
                worst = est(500, per_item=k, children=children, lanes=n_lanes, scenario="staged")
                options.append((children, k, n_lanes, e, worst))
    fits = [o for o in options if o[4].after_end <= TIME_TARGET]
    best = min(fits, key=lambda o: o[3].total, default=None)
    section.tables.append(Table(
        "levers at 500 workers: child type x chunks per item (fixed) x worker lanes; $ per TiB streamed; the model's pick is marked",
        ["children", "chunks/item", "lanes", "items", "item s", "s after end (streamed)", "s after end (staged)", "$ lambda",
         "$ sfn children", "$ s3", "$ total/TiB", ""],
        [[ch, k, nl, e.items, round(e.item_seconds, 2), round(e.after_end, 1), round(w.after_end, 1),
          round(e.costs["lambda compute (worker)"] + e.costs["lambda requests"], 3), round(e.costs["step functions children"], 3),
          round(e.costs["s3 PUT/LIST"] + e.costs["s3 GET"], 3), round(e.total, 3), "<- pick" if best and (ch, k, nl) == best[:3] else ""]
         for ch, k, nl, e, w in options],
    ))

    # Chunk size: per-chunk request costs halve with each doubling; CPU per byte stays.
    size_rows = []
    for mib in (64, 128, 256):
        c = mib * 2**20
        for n_lanes in sorted({lanes, 4}):
            e = estimate(500, cpu_chunk_arm=cpu_arm * c / chunk, ratio=measured.ratio, memory_mb=memory, lanes=n_lanes, chunk=c,
                         per_item=8, assume=assume)
            w = estimate(500, cpu_chunk_arm=cpu_arm * c / chunk, ratio=measured.ratio, memory_mb=memory, lanes=n_lanes, chunk=c,
                         per_item=8, scenario="staged", assume=assume)
            size_rows.append([mib, n_lanes, e.items, round(e.item_seconds, 2), round(e.after_end, 1), round(w.after_end, 1),
                              round(e.costs["lambda compute (worker)"], 3), round(e.costs["s3 PUT/LIST"], 3), round(e.total, 3)])
    section.tables.append(Table(
        "chunk size at 500 workers, EXPRESS, 8 chunks per item, streamed (memory per lane grows with the chunk: check it fits 1,769 MB)",
        ["chunk MiB", "lanes", "items", "item s", "s after end (streamed)", "s after end (staged)", "$ lambda compute", "$ s3 PUT/LIST", "$ total/TiB"],
        size_rows,
    ))

    # Sensitivity: Graviton2 speed, and the Lambda's S3 bandwidth per stream (k=8 items, as when staged).
    sens = []
    for speed in (0.6, 0.8, 1.0, 1.2):
        for stream in (60.0, 90.0, 150.0):
            e = est(500, cpu=measured.cpu_per_chunk / speed, per_item=8, assume=dict(assume, arm_speed=speed, lambda_s3_mb_s=stream))
            w = est(500, cpu=measured.cpu_per_chunk / speed, scenario="staged", assume=dict(assume, arm_speed=speed, lambda_s3_mb_s=stream))
            sens.append([speed, stream, round(measured.cpu_per_chunk / speed, 3), round(e.item_seconds, 2),
                         round(w.after_end, 1), round(e.costs["lambda compute (worker)"], 3), round(e.total, 3)])
    section.tables.append(Table(
        "sensitivity at 500 workers, 8 chunks per item: Graviton2 per-core speed vs this machine x S3 MB/s per stream in Lambda",
        ["arm speed", "S3 MB/s/stream", "cpu s/chunk (arm)", "item s", "s after end (staged)", "$ lambda compute", "$ total/TiB"],
        sens,
    ))

    e500 = results[(500, "streamed")]
    section.tables.append(Table(
        "cost breakdown, 1 TiB at 500 workers as the stack runs it (streamed) ($)",
        ["item", "$", "share"],
        [[k, round(v, 4), f"{v / e500.total:.1%}"] for k, v in sorted(e500.costs.items(), key=lambda kv: -kv[1])],
    ))
    worst_cost = max(e.total for e in results.values())
    staged500 = results[(500, "staged")]
    section.tables.append(Table(
        "targets (the stack as built)",
        ["target", "model", "limit", ""],
        [
            ["s after stream end, 500 workers, streamed", round(e500.after_end, 1), f"<= {TIME_TARGET:.0f}",
             "PASS" if e500.after_end <= TIME_TARGET else "MISS"],
            ["s after stream end, 500 workers, all staged (worst case)", round(staged500.after_end, 1), f"<= {TIME_TARGET:.0f}",
             "PASS" if staged500.after_end <= TIME_TARGET else "MISS"],
            ["$ per TiB, 500 workers, streamed", round(e500.total, 3), f"<= {COST_TARGET:.2f}", "PASS" if e500.total <= COST_TARGET else "MISS"],
            ["$ per TiB, most expensive row of the first table", round(worst_cost, 3), f"<= {COST_TARGET:.2f}",
             "PASS" if worst_cost <= COST_TARGET else "MISS"],
        ],
    ))
    section.facts = {
        "worker item CPU per 64 MiB chunk, this machine (process_item: GET + codec + CRC + PUT + result)": round(measured.cpu_per_chunk, 3),
        "of which codec (store_chunk into a null store)": round(measured.codec_per_chunk, 3),
        "worker item wall per chunk here (local server shares the 2 cores; not used)": round(measured.wall_per_chunk, 3),
        "CPU per chunk assumed on arm64": f"{cpu_arm:.3f} s (x86 / {arm})",
        "stored / plaintext": round(measured.ratio, 4),
        "chunks measured": measured.chunks_measured,
        "worker measured against": server,
        "worker memory, lanes (infra/braid_infra/functions.py)": f"{memory} MB, {lanes}",
        "prices": ", ".join(f"{k} ${v:.10g}" for k, v in PRICES.items()),
        "assumptions": ", ".join(f"{k}={v}" for k, v in assume.items()),
    }
    if best:
        ch, k, nl, e, w = best
        notes.append(
            f"the model picks {ch} children, {k} chunks per item, {nl} lanes at 500 workers: ${e.total:.3f}/TiB streamed, "
            f"{e.after_end:.0f} s after stream end ({w.after_end:.0f} s if everything was staged first)"
        )
    notes.append(
        "per-chunk costs that no grouping removes: the agent's UploadPart and the worker's chunk PUT are "
        f"${2 * (TIB // chunk) * PRICES['s3_put_class']:.3f}/TiB together at {chunk // 2**20} MiB chunks; larger chunks halve them"
    )
    notes.append(
        "streamed = the pipeline runs while the agent uploads at --agent-rate: each round holds about one staging segment "
        f"({default_segment_parts(chunk)} chunks), and chunks_per_item sizes items from that round; after stream end only the last "
        f"round waits, after up to one poll ({DEFAULT_POLL_SECONDS} s). staged = every chunk processed after stream end: the upper bound"
    )
    section.notes = notes
    return section
