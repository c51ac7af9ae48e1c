"""upload-timeline: one agent upload and one boto3 upload of the data set, every request timed, side by side.

Not a throughput figure (`cloud` is): one run of each against the same
s3proxy as `cloud`, with the benchmark-only tracer
(bench_lib/s3compat/braid_bench_timeline.py, BRAID_BENCH_TIMELINE) writing
each HTTP request's start, end of body, answer and connection, and in the
agent each read, buffer wait, chunk hand-over and part task. The summary
(bench_lib.timeline) says where each side waits: time to its first part,
parts in flight over time, gaps on a connection, the server's answer time
after a part's last byte. The raw records stay in the work directory
(upload-timeline/agent.jsonl, boto3.jsonl) and `--json` carries every part.
"""

from __future__ import annotations

import json
import os
import subprocess

from bench_lib import s3proxy, timeline
from bench_lib.benchmarks import cloud_host
from bench_lib.context import Context
from bench_lib.report import Section, Table
from bench_lib.timing import drop_dirty_pages, run_command, warm_page_cache

NAME = "upload-timeline"
HELP = "one agent and one boto3 upload against s3proxy, each UploadPart timed (where the agent waits)"
ORDER = 31
IN_ALL = False



def add_arguments(parser) -> None:
    cloud_host.add_arguments(parser)
    parser.add_argument("--boto3-first", action="store_true", help="upload-timeline: run boto3's upload before the agent's")


def run(ctx: Context) -> Section:
    args = ctx.args
    data = ctx.dataset()
    section = Section(NAME, f"per-request upload timeline, {format(data.size / 2**20, '.0f')} MiB")
    work = ctx.scratch(NAME)
    notes: list[str] = []
    s3, sfn = cloud_host._servers(ctx, work, notes)
    try:
        transport = args.transports[0]
        env = _env(ctx, s3, sfn, transport)
        setup = {"sfn": sfn.endpoint, "s3": s3.endpoint, "bucket": cloud_host.BUCKET, "machine": cloud_host.STATE_MACHINE, "prefixes": ["tl"]}
        proc = subprocess.run([str(ctx.python), "-c", cloud_host._SETUP, json.dumps(setup)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"set-up failed: {proc.stderr.strip().splitlines()[-3:]}")
        sides = []
        for name in ("boto3", "agent") if args.boto3_first else ("agent", "boto3"):
            trace = work / f"{name}.jsonl"
            trace.unlink(missing_ok=True)
            log = work / f"{name}.log"
            log.unlink(missing_ok=True)
            warm_page_cache(data.path)
            traced = {**env, "BRAID_BENCH_TIMELINE": str(trace)}
            if name == "agent":
                argv = [str(ctx.braid), "backup", "--repo", f"s3://{cloud_host.BUCKET}/tl", "--name", "bench", "--chunk-size", str(args.chunk_size),
                        "--level", str(args.level), *cloud_host.agent_concurrency(args), "--no-wait"]
                sample = run_command(argv, stdin=data.path, stderr=log, env=traced)
                end = cloud_host.stream_end_at(log)
            else:
                argv = [str(ctx.python), "-c", cloud_host._REFERENCE, str(data.path), cloud_host.BUCKET, "tl-ref/data", str(args.chunk_size), str(cloud_host.reference_concurrency(args))]
                sample = run_command(argv, stderr=log, env=traced)
                end = sample.started_at + sample.wall
            drop_dirty_pages()
            sides.append(timeline.Side.load(name, trace, sample.started_at, end))
            ctx.log(f"{NAME}: {name} {sample.wall:.2f} s wall, {sample.cpu:.2f} CPU-s, load {os.getloadavg()[0]:.1f}")
    finally:
        s3.stop()
        sfn.stop()
    sides.sort(key=lambda side: side.name)
    summaries = [timeline.summary(side) for side in sides]
    keys = [k for k in summaries[0] if k not in ("side", "in_flight_every_quarter_s")]
    section.tables.append(Table(f"where each side waits ({transport})", ["figure", *[s["side"] for s in summaries]],
                                [[k, *[_cell(s.get(k)) for s in summaries]] for k in keys], key="summary"))
    section.tables.append(Table("every UploadPart (seconds from the process start)", ["side", "start", "body sent", "answer", "MiB", "port", "thread"],
                                [row for side in sides for row in timeline.part_rows(side)], key="parts"))
    section.facts = {"summaries": summaries, "load_average": os.getloadavg()[0], "transport": transport}
    section.notes = notes + [f"raw records: {work}/agent.jsonl, {work}/boto3.jsonl"]
    return section


def _cell(value: object) -> object:
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def _env(ctx: Context, s3: s3proxy.Server, sfn: s3proxy.Server, transport: str) -> dict[str, str]:
    env = cloud_host.agent_env(ctx, s3, sfn)
    # The tracer is loaded by s3compat's sitecustomize, on the path whichever the server.
    env["PYTHONPATH"] = os.pathsep.join([str(s3proxy.COMPAT_DIR), env["PYTHONPATH"]])
    if transport == "https":
        if s3.secure_endpoint is None or s3.ca_bundle is None:
            raise RuntimeError(f"{s3.kind} has no TLS endpoint here")
        env["AWS_ENDPOINT_URL_S3"], env["AWS_CA_BUNDLE"] = s3.secure_endpoint, str(s3.ca_bundle)
    return env

