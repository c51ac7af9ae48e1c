"""pack-memory: the cloud worker's peak memory by chunks per pack (braid.contract.CHUNKS_PER_PACK).

The worker keeps each pack's frames in the buffers its parts were read
into until the pack's one PUT (braid.pipeline.item_flow: up to two packs
besides what it reads ahead), so memory grows with chunks per pack: this
runs the real worker (braid.pipeline.worker.process_item, the stack's
lanes) on one item of
--per-item 64 MiB chunks for each k, in a fresh process each, and reports
the process's peak RSS over its RSS just before the item (interpreter,
imports and the synthetic source chunk excluded). The store is synthetic:
each ranged GET returns a fresh copy of one source chunk (as a GET response
is a fresh buffer) and each PUT reads its body once through the CRC, as S3
would, keeping nothing. Two sources: incompressible bytes (the worst case:
frames as large as the chunks) and the bench data set's first chunk.

The figure to compare is the worker's memory (braid.contract.WORKER_MEMORY_MB)
less the Lambda runtime's own (~70 MB): the pick must fit with both sources.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench_lib.context import Context, add_option_once
from bench_lib.report import Section, Table

NAME = "pack-memory"
HELP = "the cloud worker's peak memory per chunks-per-pack (3, 5, 6, 8), real process_item, 64 MiB chunks"
ORDER = 65
IN_ALL = False

CHILD = r"""
import json, os, resource, sys, time
from braid import contract
from braid.format.checksum import crc64nvme, encode_crc64nvme
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.staging import MapItem, segment_key
from braid.format.staging.rounds import pack_sizes
from braid.pipeline.worker import ChunkLanes, process_item

doc = json.loads(sys.argv[1])
chunk, count, k, source = doc["chunk"], doc["per_item"], doc["k"], doc["source"]
if source == "random":
    data = os.urandom(chunk)
else:
    with open(source, "rb") as handle:
        data = handle.read(chunk)
crc = encode_crc64nvme(crc64nvme(data))


class SyntheticStore:
    url = "synthetic://"

    def get_range(self, key, start, length):
        at = start % chunk  # the segment is the source chunk over and over
        return bytes(memoryview(data)[at : at + length])  # a fresh buffer, as a GET response is

    def get_range_into(self, key, start, length, buffer):
        at = start % chunk
        view = memoryview(buffer)[:length]  # into the worker's buffer, as S3Store reads a ranged GET
        view[:] = memoryview(data)[at : at + length]
        return view

    def put(self, key, body, *, checksum=None, create_only=False, durable=True, replacing=None):
        crc64nvme(body)

    def put_pieces(self, key, pieces, *, checksum=None, create_only=False):
        value = 0
        for piece in pieces:
            value = crc64nvme(piece, value)

    def head(self, key):
        return None

    def list(self, prefix):
        return iter(())

    def delete(self, keys):
        pass

    def sync(self, keys):
        pass

    def get(self, key):
        raise KeyError(key)


ref = BackupRef.new("bench")
item = MapItem(segment_key(ref, 0, 0), 0, 0, 0, chunk * count, chunk, 1, count, 0, (crc,) * count, packs=tuple(pack_sizes(count, k)))
lanes = ChunkLanes(contract.DEFAULT_WORKER_LANES)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cpu0, wall0 = time.process_time(), time.perf_counter()
outcome = process_item(SyntheticStore(), ref, item, key=DataKey(bytes(32)), level=3, lanes=lanes, chunks_per_pack=k)
cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_mb": before / 1024, "peak_mb": peak / 1024, "cpu": cpu, "wall": wall, "ratio": outcome.ratio}))
"""


def add_arguments(parser) -> None:
    add_option_once(parser, "--per-item", type=int, default=16, help="pack-memory: chunks in the item (default 16, the streaming item)")
    add_option_once(parser, "--packs", default="3,5,6,8", help="pack-memory: comma-separated chunks-per-pack values (default 3,5,6,8)")


def run(ctx: Context) -> Section:
    from braid import contract

    args = ctx.args
    chunk = 64 * 2**20
    section = Section(NAME, f"worker peak memory by chunks per pack: one item of {args.per_item} x 64 MiB chunks, {contract.DEFAULT_WORKER_LANES} lanes")
    rows = []
    for source, label in (("random", "incompressible"), (str(ctx.dataset().path), "bench data")):
        for k in [int(v) for v in str(args.packs).split(",")]:
            ctx.log(f"pack-memory: {label}, {k} chunks per pack ...")
            doc = {"chunk": chunk, "per_item": args.per_item, "k": k, "source": source}
            done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(doc)], capture_output=True, text=True, check=True)
            found = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append([label, k, round(found["peak_mb"] - found["before_mb"]), round(found["peak_mb"]), round(found["cpu"], 2), round(found["ratio"], 3)])
    section.tables.append(Table("peak RSS of process_item (MB)", ["source", "chunks_per_pack", "item_peak_mb", "process_peak_mb", "cpu_s", "stored_ratio"], rows))
    section.facts["worker_memory_mb"] = contract.WORKER_MEMORY_MB
    section.facts["chunks_per_pack"] = contract.CHUNKS_PER_PACK
    section.notes.append(
        "item_peak_mb: the item's own peak over the process before it (the process's includes the interpreter, imports and the"
        " 64 MiB source chunk); the worker holds the chunks it reads ahead, the encoders' buffers and up to two packs' frames until their PUTs"
    )
    return section
