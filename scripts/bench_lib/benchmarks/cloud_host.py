"""cloud: the agent's host cost and upload throughput against a local S3-compatible server.

Ours: the real agent, `braid backup --repo s3://BUCKET/runN --name bench
--concurrency C --chunk-size S --no-wait < FILE`, as a child process: it
opens the repository (its config names a state machine), writes the staging
session, uploads every chunk as a multipart part with its CRC64NVME,
completes the segment(s) with the combined full-object checksum, writes the
segment records and the stream-end record, and calls StartExecution. S3 is
s3proxy on loopback (filesystem blobstore; --s3-server moto for moto's
server); Step Functions is a moto server holding a one-state machine with
execution off, so nothing runs behind the agent and only the agent's own work
is measured. CPU is the agent process's rusage (wait4), not the servers'.

Host cost: the agent's CPU seconds per GiB vs `zstd -3 -T1 -c FILE` on the
same data (CPU of each child). Target: agent/zstd <= 0.15. Start-up
(interpreter, boto3, repository config, StartExecution) is a fixed cost per
backup; the empty-stream row measures it, and the marginal figure leaves it
out.

Throughput: the agent's wall time vs a plain boto3 multipart upload of the
same file to the same server: `upload_fileobj` with TransferConfig at the
same part size and concurrency, in a child process, with the same wire
settings as the agent's client (unsigned payload, no extra checksum
trailers), so the comparison is like for like. Target: ours/boto3 >= 0.95.
The agent's side is timed from its start to its `stream-end` progress event
(the upload is staged); with --no-wait it then lingers up to 3 s poking a
sleeping pipeline (braid.agent.wake.LINGER_SECONDS), reported apart as the
whole-process comparison and `linger_seconds_median`.

`--json` gives, under facts.per_size[SIZE], the issue's figures by name:
upload_ratio_median, host_cpu_ratio (whole process minus start-up, medians,
vs zstd -3 -T1), startup_cpu_seconds (median of --reps empty-stream runs),
peak_rss_mib, host_cpu_seconds_per_tib (the marginal slope x 1,024) and
tib_projection (hours to stage 1 TiB at 1 and 10 Gbit/s from the measured
slope, host CPU-seconds per TiB). `--transports http,https` adds the same
over s3proxy's TLS endpoint (key "SIZE https"), `--pipes N` the agent with N
inputs against N boto3 uploads at once (key "SIZE pipesN"; see
bench_lib.cloud_runs). One size a run: `--size 8GiB` for the largest row.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

from bench_lib import cloud_runs, s3proxy
from bench_lib.context import Context, add_engine_options, add_option_once
from bench_lib.report import MB, Comparison, Section, Table
from bench_lib.timing import CommandFailed, Sample, Series, drop_dirty_pages, run_command, warm_page_cache
from braid.agent.limits import DEFAULT_CONCURRENCY
from braid.cli.sizes import format_size

NAME = "cloud"
HELP = "cloud agent (braid backup to s3://, staging upload) vs zstd -3 -T1 (host CPU) and boto3 multipart (throughput)"
ORDER = 30
IN_ALL = True
HOST_TARGET = 0.15  # agent CPU / zstd -3 -T1 CPU, at most
THROUGHPUT_TARGET = 0.95  # agent / boto3 throughput, at least
BUCKET = "braid-bench"
STATE_MACHINE = "braid-bench-pipeline"

# The reference: plain boto3, no braid import. argv: FILE BUCKET KEY PART_SIZE CONCURRENCY
_REFERENCE = r"""
import sys, boto3
from botocore.config import Config
from boto3.s3.transfer import TransferConfig
path, bucket, key, part, conc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
client = boto3.client("s3", config=Config(
    max_pool_connections=max(64, conc + 8), request_checksum_calculation="when_required",
    response_checksum_validation="when_supported", s3={"payload_signing_enabled": False}))
transfer = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=conc,
                          use_threads=True, preferred_transfer_client="classic")
with open(path, "rb") as handle:
    client.upload_fileobj(handle, bucket, key, Config=transfer)
"""

# Set-up inside a child with the compat shim: bucket, repository config, state machine.
_SETUP = r"""
import json, sys, boto3
from braid.adapters.aws.clients import s3_client
from braid.adapters.aws.s3 import S3Store
from braid.format.repository import Repository, RepositoryConfig
doc = json.loads(sys.argv[1])
sfn = boto3.client("stepfunctions", endpoint_url=doc["sfn"])
arn = sfn.create_state_machine(
    name=doc["machine"], roleArn="arn:aws:iam::123456789012:role/braid-bench",
    definition=json.dumps({"StartAt": "Noop", "States": {"Noop": {"Type": "Pass", "End": True}}}))["stateMachineArn"]
client = s3_client(endpoint_url=doc["s3"])
try:
    client.create_bucket(Bucket=doc["bucket"])
except client.exceptions.BucketAlreadyOwnedByYou:
    pass
for prefix in doc["prefixes"]:
    store = S3Store(client, doc["bucket"], prefix)
    config = RepositoryConfig.new({"type": "kms", "key_id": "arn:aws:kms:us-east-1:123456789012:key/braid-bench"},
                                  "2025-01-01T00:00:00Z", {"state_machine_arn": arn, "region": "us-east-1"})
    Repository.create(store, config)
print(arn)
"""


def add_arguments(parser) -> None:
    add_engine_options(parser)
    add_option_once(
        parser, "--concurrency", type=int, default=None,
        help=f"cloud: agent --concurrency and boto3 max_concurrency (default: none given to the agent, its default for the inputs, "
             f"{DEFAULT_CONCURRENCY} with one; boto3 {DEFAULT_CONCURRENCY})",
    )
    add_option_once(
        parser, "--s3-server", choices=("s3proxy", "moto"), default="s3proxy",
        help="cloud: the local S3-compatible server (default s3proxy, falling back to moto if it cannot start)",
    )
    add_option_once(
        parser, "--transports", type=cloud_runs.transports_arg, default=["http"],
        help="cloud: http, https or http,https (s3proxy's TLS endpoint, a throwaway self-signed certificate both sides trust"
             " through AWS_CA_BUNDLE); each gets its own figures (default http)",
    )
    add_option_once(
        parser, "--pipes", type=int, default=1,
        help="cloud: also run the agent with N inputs (the data set N times) against N boto3 uploads in parallel (default 1: not run)",
    )


def _servers(ctx: Context, work: Path, notes: list[str]) -> tuple[s3proxy.Server, s3proxy.Server]:
    sfn = s3proxy.start_moto(work, ctx.venv_bin, "moto-sfn")
    if ctx.args.s3_server == "moto":
        return s3proxy.start_moto(work, ctx.venv_bin, "moto-s3"), sfn
    try:
        return s3proxy.start_s3proxy(ctx.workdir, ctx.log, tls="https" in ctx.args.transports), sfn
    except s3proxy.ServerError as exc:
        notes.append(f"s3proxy could not be used ({exc}); fell back to moto's server: throughput figures are moto-bound (~100 MB/s)")
        ctx.log(f"cloud: s3proxy unavailable ({exc}); using moto")
        return s3proxy.start_moto(work, ctx.venv_bin, "moto-s3"), sfn


def stream_end_at(log: Path) -> float:
    """Epoch seconds of the agent's `stream-end` progress event (its JSON lines on stderr): the upload is staged."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"stream-end"' in line:
            event = json.loads(line)
            if event.get("event") == "stream-end":
                return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()
    raise RuntimeError(f"no stream-end event in {log}")


def _remove(server: s3proxy.Server, env: dict[str, str], ctx: Context, prefix: str) -> None:
    """Drop what one run stored, outside the timing, so the disk and the server's index stay small."""
    if server.kind == "s3proxy" and server.data_dir is not None:
        shutil.rmtree(server.data_dir / BUCKET / prefix, ignore_errors=True)
        return
    script = (
        "import sys, boto3\n"
        "b = boto3.resource('s3', endpoint_url=sys.argv[1]).Bucket(sys.argv[2])\n"
        "b.objects.filter(Prefix=sys.argv[3] + '/').delete()\n"
        "for u in b.multipart_uploads.filter(Prefix=sys.argv[3] + '/'): u.abort()\n"
    )
    subprocess.run([str(ctx.python), "-c", script, server.endpoint, BUCKET, prefix], env=env, check=True, capture_output=True)


def agent_concurrency(args) -> list[str]:
    """The agent's --concurrency flag: none unless the run names one, so the agent runs at its defaults (issue 27)."""
    return [] if args.concurrency is None else ["--concurrency", str(args.concurrency)]


def reference_concurrency(args) -> int:
    """boto3's max_concurrency: the run's --concurrency, else the agent's default for one input."""
    return args.concurrency or DEFAULT_CONCURRENCY


def run(ctx: Context) -> Section:
    args = ctx.args
    ctx.dataset()  # generate (or find) the data set before the servers start
    chunk = args.chunk_size
    section = Section(NAME, f"cloud agent staging upload, {chunk // 2**20} MiB parts, concurrency {args.concurrency or 'default'}")
    if not shutil.which("zstd"):
        section.skipped = "zstd is not on PATH"
        return section
    work = ctx.scratch("cloud")
    notes: list[str] = []
    s3, sfn = _servers(ctx, work, notes)
    try:
        return _run(ctx, section, work, s3, sfn, notes)
    finally:
        s3.stop()
        sfn.stop()


def agent_env(ctx: Context, s3: s3proxy.Server, sfn: s3proxy.Server) -> dict[str, str]:
    """The agent's and boto3's environment against the bench's S3 and Step Functions servers (s3proxy's shim when it is one)."""
    base = ctx.env(**s3proxy.credentials_env())
    base.pop("AWS_ENDPOINT_URL", None)
    base.pop("AWS_PROFILE", None)
    base["AWS_ENDPOINT_URL_S3"] = s3.endpoint
    base["AWS_ENDPOINT_URL_SFN"] = sfn.endpoint
    env = s3proxy.compat_env(base) if s3.kind == "s3proxy" else base
    env["PYTHONPATH"] = os.pathsep.join([str(ctx.root / "scripts"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _run(ctx: Context, section: Section, work: Path, s3: s3proxy.Server, sfn: s3proxy.Server, notes: list[str]) -> Section:
    args = ctx.args
    data = ctx.dataset()
    env = agent_env(ctx, s3, sfn)
    runs = cloud_runs.variants(args.transports, max(1, args.pipes))
    if s3.secure_endpoint is None and any(v.transport == "https" for v in runs):
        notes.append(f"https skipped: {s3.kind} has no TLS endpoint here")
        runs = [v for v in runs if v.transport == "http"]
    prefixes = [f"{v.prefix}{kind}{i}" for v in runs for kind in ("run", "empty") for i in range(ctx.reps)]
    setup = {"sfn": sfn.endpoint, "s3": s3.endpoint, "bucket": BUCKET, "machine": STATE_MACHINE, "prefixes": prefixes}
    proc = subprocess.run([str(ctx.python), "-c", _SETUP, json.dumps(setup)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"cloud set-up failed: {proc.stderr.strip().splitlines()[-3:]}")
    server = f"{s3.kind} {s3.version}".strip()
    per_size: dict[str, dict] = {}
    section.facts = {"per_size": per_size, "S3 server": f"{server} at {s3.endpoint} (Step Functions: moto, execution off)"}
    for variant in runs:
        venv = dict(env)
        if variant.transport == "https":
            assert s3.secure_endpoint is not None and s3.ca_bundle is not None
            venv["AWS_ENDPOINT_URL_S3"], venv["AWS_CA_BUNDLE"] = s3.secure_endpoint, str(s3.ca_bundle)
        per_size[variant.key(format_size(data.size))] = _measure(ctx, section, work, s3, venv, variant, server)
    if s3.kind == "s3proxy":
        notes.append(
            "s3proxy 2.6.0 answers 501 to the checksum headers on CreateMultipartUpload/HEAD/GET and 500 to per-part "
            "ChecksumCRC64NVME in CompleteMultipartUpload; a benchmark-only botocore hook (scripts/bench_lib/s3compat) drops "
            "those in the child processes. It accepts but does not verify CRC64NVME on UploadPart/PUT and ignores If-None-Match."
        )
    chunks = -(-data.size // args.chunk_size)
    if chunks < 2 * reference_concurrency(args):
        notes.append(f"only {chunks} parts for concurrency {reference_concurrency(args)}: start-up and the last part's tail weigh more; use a larger --size")
    section.notes = notes
    return section


def _measure(ctx: Context, section: Section, work: Path, s3: s3proxy.Server, env: dict[str, str], variant: cloud_runs.Variant, server: str) -> dict:
    """One variant's interleaved reps (agent, boto3, zstd): its comparisons and host table into `section`, its figures returned."""
    args = ctx.args
    data = ctx.dataset()
    chunk, conc, pipes = args.chunk_size, reference_concurrency(args), variant.pipes
    braid = str(ctx.braid)
    log = work / "agent.log"
    empty = work / "empty.bin"
    empty.write_bytes(b"")
    label = f" [{variant.name}]" if variant.name else ""
    files = cloud_runs.input_files(data.path, work, pipes)  # distinct files: the agent refuses one file named twice
    inputs = [arg for path in files for arg in ("--input", str(path))] if pipes > 1 else []

    def agent_argv(prefix: str) -> list[str]:
        return [braid, "backup", "--repo", f"s3://{BUCKET}/{variant.prefix}{prefix}", "--name", "bench", "--chunk-size", str(chunk),
                "--level", str(args.level), *agent_concurrency(args), "--no-wait"]

    agent, reference, zstd, startup = Series(), Series(), Series(), Series()
    staged = Series()  # the agent's wall until its stream-end record was written: the upload, without --no-wait's linger
    zstd_argv = ["zstd", f"-{args.level}", "-T1", "-q", "-c", str(data.path)]

    def run_agent(rep: int) -> None:
        log.unlink(missing_ok=True)
        try:
            for path in files:
                warm_page_cache(path)
            sample = agent.add(run_command([*agent_argv(f"run{rep}"), *inputs], stdin=None if inputs else data.path, stderr=log, env=env))
            staged.add(Sample(stream_end_at(log) - sample.started_at, sample.cpu, sample.max_rss))
        except CommandFailed as exc:
            raise RuntimeError(f"{exc}: {log.read_text(errors='replace').strip().splitlines()[-2:]}") from None
        finally:
            _remove(s3, env, ctx, f"{variant.prefix}run{rep}")
            drop_dirty_pages()

    def run_reference(rep: int) -> None:
        keys = [f"{variant.prefix}ref{rep}/data{p}" for p in range(pipes)]
        argvs = [[str(ctx.python), "-c", _REFERENCE, str(path), BUCKET, key, str(chunk), str(conc)] for path, key in zip(files, keys, strict=True)]
        try:
            for path in files:
                warm_page_cache(path)
            reference.add(run_command(argvs[0] if pipes == 1 else cloud_runs.parallel_argv(argvs), stderr=work / "reference.log", env=env))
        finally:
            _remove(s3, env, ctx, f"{variant.prefix}ref{rep}")
            drop_dirty_pages()

    ctx.log(f"cloud{label}: S3 = {s3.kind} at {env['AWS_ENDPOINT_URL_S3']}, Step Functions = moto at {env['AWS_ENDPOINT_URL_SFN']}")
    ctx.log(f"cloud{label}: agent start-up (empty stream) ...")
    startup_staged = Series()  # an empty backup's wall to its stream-end: the fixed part of `staged`
    for rep in range(ctx.reps):  # a handful: it is the figure `wal-push` pays per segment
        log.unlink(missing_ok=True)
        sample = startup.add(run_command([*agent_argv(f"empty{rep}"), "--allow-empty"], stdin=empty, stderr=log, env=env))
        startup_staged.add(Sample(stream_end_at(log) - sample.started_at, sample.cpu, sample.max_rss))
    for rep in range(ctx.reps):
        ctx.log(f"cloud{label}: repetition {rep + 1}/{ctx.reps} ...")
        sides = [lambda rep=rep: run_agent(rep), lambda rep=rep: run_reference(rep), lambda: (warm_page_cache(data.path), zstd.add(run_command(zstd_argv)))]
        sides = sides[rep % 3 :] + sides[: rep % 3]
        for side in sides:
            side()

    cloud_runs.remove_copies(files)
    nbytes = data.size * pipes
    gib = nbytes / 2**30
    zstd_best, zstd_median = zstd.best_cpu * pipes, zstd.median_cpu * pipes  # zstd over the same bytes: the file once per input
    ratio = agent.best_cpu / zstd_best
    wire = f"{variant.transport.upper()}, {pipes} input(s)" if variant.name else ""
    section.comparisons += [
        Comparison(
            f"upload throughput (until the stream-end record){label}",
            f"braid backup --repo s3://... {' '.join(agent_concurrency(args)) or '(default --concurrency)'} --no-wait{' --input FILE' * pipes if pipes > 1 else ' < FILE'} ({server}), until stream-end",
            f"boto3 upload_fileobj, TransferConfig {chunk // 2**20} MiB x {conc} threads, {pipes} at once, same server {wire}".rstrip(),
            nbytes, staged, reference, THROUGHPUT_TARGET,
        ),
        Comparison(f"whole agent process (with --no-wait's wake linger){label}", "braid backup (as above), to exit", "boto3 (as above)",
                   nbytes, agent, reference, None),
    ]
    section.tables.append(
        Table(
            f"host cost{label}: CPU seconds per GiB of the agent process (best of reps) vs zstd -3 -T1 on the same data",
            ["what", "cpu s/GiB", "cpu s/GiB (med)", "vs zstd -3 -T1", "target", ""],
            [
                ["braid backup (agent), whole process", round(agent.best_cpu / gib, 3), round(agent.median_cpu / gib, 3), round(ratio, 3),
                 f"<= {HOST_TARGET:.2f}", "PASS" if ratio <= HOST_TARGET else "MISS"],
                ["  of which start-up (empty stream, s per backup)", round(startup.best_cpu, 3), round(startup.median_cpu, 3), "",
                 "<= 0.25", "PASS" if startup.median_cpu <= 0.25 else "MISS"],
                ["braid backup, marginal (start-up left out)", round((agent.best_cpu - startup.best_cpu) / gib, 3), "",
                 round((agent.best_cpu - startup.best_cpu) / zstd_best, 3), "", ""],
                ["boto3 upload_fileobj (reference upload)", round(reference.best_cpu / gib, 3), round(reference.median_cpu / gib, 3),
                 round(reference.best_cpu / zstd_best, 3), "", ""],
                [" ".join(zstd_argv[:-1]) + " FILE", round(zstd_best / gib, 3), round(zstd_median / gib, 3), 1.0, "", ""],
            ],
        )
    )
    # The figures for this size, by name (acceptance 18 reads them): medians of interleaved reps.
    return {
        "upload_ratio_median": round(reference.median_wall / staged.median_wall, 3),
        "upload_ratio_best": round(reference.best_wall / staged.best_wall, 3),
        "process_ratio_median": round(reference.median_wall / agent.median_wall, 3),  # with the linger after the stream-end
        "linger_seconds_median": round(agent.median_wall - staged.median_wall, 2),
        "host_cpu_ratio": round((agent.median_cpu - startup.median_cpu) / zstd_median, 3),  # minus start-up, vs zstd -3 -T1, same bytes
        "host_cpu_ratio_whole": round(agent.median_cpu / zstd_median, 3),
        "startup_cpu_seconds": round(startup.median_cpu, 3),
        "peak_rss_mib": round(agent.max_rss / 1024, 1),
        "boto3_peak_rss_mib": round(reference.max_rss / 1024, 1),  # with --pipes, the largest of the parallel uploads
        "agent_mb_s_median": round(nbytes / staged.median_wall / MB, 1),
        "boto3_mb_s_median": round(nbytes / reference.median_wall / MB, 1),
        "host_cpu_seconds_per_tib": round((agent.median_cpu - startup.median_cpu) / gib * 1024, 1),
        "tib_projection": cloud_runs.projection(nbytes, staged.median_wall, agent.median_cpu, startup_staged.median_wall, startup.median_cpu),
        "staged_seconds": [round(s.wall, 2) for s in staged.samples],
        "boto3_seconds": [round(s.wall, 2) for s in reference.samples],
    }
