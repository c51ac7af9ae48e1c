"""link: the agent's upload over a shaped link, as a fraction of the link's rate.

The S3 endpoint (s3proxy; by default over the null-parts store, which
counts and discards multipart data and keeps every other object on tmpfs,
see s3_backend and --link-store) runs inside a network namespace reached
over a veth pair shaped with tc (bench_lib.netns: tbf at the rate; the delay
by netem where the kernel has it, else by the benchmark's user-space delay
line, bench_lib.delay_line; --mtu), created and removed by this
benchmark. One untimed agent upload warms the server's JIT first. Run alone,
the stream is 4 GiB (the issue's), 3 reps. For each link (default 1
and 10 Gbit/s x 1 and 20 ms RTT) it runs, interleaved, the real agent
(`braid backup --no-wait < FILE`, timed to its stream-end event as in
`cloud`) and boto3's multipart upload of the same file, and an empty backup
for the fixed cost. Step Functions is moto on loopback (one
StartExecution, unshaped).

Rows (`--json`: benchmarks.link.tables[0].rows): link_mbit_s, rtt_ms, mtu,
agent and boto3 MB/s (medians), fraction_of_link (the agent's median
throughput over the link's rate; target >= 0.95), where the rest goes
(wire_ceiling: what TCP's payload can be of the rate at the MTU; lead_s,
slow_s, tail_s from the veth's byte counter, see WHERE_TIME_GOES; the
agent's and the server's CPU-seconds per second: near the cores' count
means the host, not the link, is the limit), and the 1 TiB
projection from the measured slope: time = start-up + 1 TiB / (bytes /
(time - start-up)), CPU = (CPU - start-up CPU) per byte x 1 TiB. Each
row also gives rtt_measured_ms (the median TCP connect to the server, one
RTT, before the runs) and delay_late_ms (with the delay line: the most any
packet's release came after its time; delay_late_share, the share of
packets released over 1 ms late; delay_cpu_per_s, the cores it
used while it ran). A link with an RTT that cannot be
made here (no sch_netem, and no iptables or C compiler for the delay line)
is not measured: it is listed under facts.skipped_links (link_mbit_s,
rtt_ms, skipped: why), with no fraction_of_link, and the rates are measured
at rtt_ms 0.

Not in `all`: it needs root, and at 10 Gbit/s a small shared machine is
the limit, not the link.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from bench_lib import s3proxy
from bench_lib.benchmarks.cloud_host import _REFERENCE, _SETUP, BUCKET, STATE_MACHINE, agent_concurrency, reference_concurrency, stream_end_at
from bench_lib.context import Context, add_engine_options, add_option_once, size_arg
from bench_lib.netns import LinkError, ShapedLink, WireMonitor, wire_ceiling
from bench_lib.report import MB, Section, Table
from bench_lib.timing import CommandFailed, Sample, Series, drop_dirty_pages, process_cpu_seconds, run_command, warm_page_cache
from braid.agent.limits import DEFAULT_CONCURRENCY

NAME = "link"
DEFAULT_SIZE, DEFAULT_REPS = "4GiB", 3
HELP = (f"cloud agent over a shaped link (netns + veth + tc, 1/10 Gbit/s x 1/20 ms RTT): fraction of the link's rate"
        f" (here --size defaults to {DEFAULT_SIZE} and --reps to {DEFAULT_REPS})")
ORDER = 35
IN_ALL = False
TARGET = 0.95
TIB = 2**40
STORES = ("null-parts", "tmpfs", "disk")
WARM_PREFIX = "warm"
WARM_BYTES = 1024 * 2**20


def _links(text: str) -> list[tuple[int, float]]:
    """`1000x1,10000x20`: (Mbit/s, RTT ms) pairs."""
    pairs = []
    for item in text.split(","):
        rate, _, rtt = item.partition("x")
        pairs.append((int(rate), float(rtt or 0)))
    return pairs


def add_arguments(parser) -> None:
    if parser.prog.split()[-1] == NAME:  # `scripts/bench link` alone: the issue's 4 GiB stream (not `all`'s common size)
        parser.set_defaults(size=size_arg(DEFAULT_SIZE), reps=DEFAULT_REPS)
    add_engine_options(parser)
    add_option_once(parser, "--concurrency", type=int, default=None, help=f"agent --concurrency (default: the agent's own; boto3 {DEFAULT_CONCURRENCY})")
    add_option_once(parser, "--links", type=_links, default=_links("1000x1,1000x20,10000x1,10000x20"),
                    help="link: RATE_MBITxRTT_MS,... (default 1000x1,1000x20,10000x1,10000x20)")
    add_option_once(parser, "--mtu", type=int, default=1500, help="link: MTU of the veth pair (default 1500, as over the Internet)")
    add_option_once(parser, "--link-store", choices=STORES, default="null-parts",
                    help="link: s3proxy's store: null-parts (multipart data counted and discarded, other objects on tmpfs; default),"
                         " tmpfs (every blob in a directory under /dev/shm) or disk (the work directory)")
    add_option_once(parser, "--link-provider", choices=s3proxy.PROVIDERS, default="filesystem", help="link: s3proxy's blobstore (default filesystem)")


def run(ctx: Context) -> Section:
    section = Section(NAME, "agent upload over a shaped link (median of interleaved reps)")
    missing = [tool for tool in ("ip", "tc", "java") if not shutil.which(tool)]
    if missing:
        section.skipped = f"not on PATH: {', '.join(missing)}"
        return section
    data = ctx.dataset()
    work = ctx.scratch("link")
    # A `timeout` (SIGTERM) must still remove the namespace, the veth pair and the servers: stop as on Ctrl-C.
    previous = signal.signal(signal.SIGTERM, _interrupted)
    blobs = None
    try:
        blobs = _blob_dir(ctx.args.link_store, work)
        with ShapedLink(mtu=ctx.args.mtu, build_dir=ctx.workdir / "delayline") as link:
            s3 = s3proxy.start_s3proxy(ctx.workdir, ctx.log, host=link.ns_ip, wrap=link.wrap, home_name="s3proxy-link",
                                       provider=ctx.args.link_provider, data_dir=blobs, null_parts=ctx.args.link_store == "null-parts")
            sfn = s3proxy.start_moto(work, ctx.venv_bin, "moto-sfn")
            try:
                return _run(ctx, section, work, link, s3, sfn, data)
            finally:
                s3.stop()
                sfn.stop()
    except LinkError as exc:
        section.skipped = str(exc)
        return section
    finally:
        if blobs is not None:
            shutil.rmtree(blobs, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)


def _blob_dir(store: str, work: Path) -> Path:
    """Where s3proxy keeps the run's blobs: the benchmark's own directory under /dev/shm (tmpfs), or under the work directory."""
    if store == "disk":
        return work / "s3proxy-blobs"
    shm = Path("/dev/shm")
    if not _is_tmpfs(shm):
        raise LinkError("--link-store tmpfs: /dev/shm is not a tmpfs here; use --link-store disk")
    return shm / f"braid-bench-link-{os.getpid()}"


def _is_tmpfs(path: Path, mounts: str | None = None) -> bool:
    """Whether `path` is a tmpfs mount point (from /proc/self/mounts unless `mounts` is given)."""
    text = Path("/proc/self/mounts").read_text() if mounts is None else mounts
    return any(fields[1] == str(path) and fields[2] == "tmpfs" for fields in (line.split() for line in text.splitlines()) if len(fields) > 2)


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _run(ctx: Context, section: Section, work: Path, link: ShapedLink, s3: s3proxy.Server, sfn: s3proxy.Server, data) -> Section:
    args = ctx.args
    base = ctx.env(**s3proxy.credentials_env())
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        base.pop(name, None)
    base["AWS_ENDPOINT_URL_S3"], base["AWS_ENDPOINT_URL_SFN"] = s3.endpoint, sfn.endpoint
    env = s3proxy.compat_env(base)
    env["PYTHONPATH"] = os.pathsep.join([str(ctx.root / "scripts"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    links = [(mbit, rtt) for mbit, rtt in args.links]
    no_delay = []  # the links asked for that this kernel cannot make: listed as skipped, never measured under their label
    if not link.can_delay:  # the rates can still be measured, at the veth's own RTT, and say so
        no_delay = [{"link_mbit_s": mbit, "rtt_ms": rtt, "skipped": f"no delay can be made: {link.no_delay}"} for mbit, rtt in links if rtt]
        links = list(dict.fromkeys((mbit, 0.0) for mbit, _ in links))
    prefixes = [f"l{i}r{r}" for i in range(len(links)) for r in range(ctx.reps)] + [f"l{i}e{r}" for i in range(len(links)) for r in range(ctx.reps)]
    prefixes.append(WARM_PREFIX)
    link.shape(10_000, 0)  # set-up over a fast link
    setup = {"sfn": sfn.endpoint, "s3": s3.endpoint, "bucket": BUCKET, "machine": STATE_MACHINE, "prefixes": prefixes}
    proc = subprocess.run([str(ctx.python), "-c", _SETUP, json.dumps(setup)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"link set-up failed: {proc.stderr.strip().splitlines()[-3:]}")
    log, empty = work / "agent.log", work / "empty.bin"
    empty.write_bytes(b"")

    def agent(prefix: str, source: Path, *extra: str, server: list[float] | None = None, wire: list[dict] | None = None,
              rate_bytes_s: float = 1.0) -> Sample:
        log.unlink(missing_ok=True)
        argv = [str(ctx.braid), "backup", "--repo", f"s3://{BUCKET}/{prefix}", "--name", "bench", "--chunk-size", str(args.chunk_size),
                "--level", str(args.level), *agent_concurrency(args), "--no-wait", *extra]
        try:
            with WireMonitor(link.host_if) as trace:
                sample, server_cpu = _with_server_cpu(s3, lambda: run_command(argv, stdin=source, stderr=log, env=env))
        except CommandFailed as exc:
            raise RuntimeError(f"{exc}: {log.read_text(errors='replace').strip().splitlines()[-2:]}") from None
        finally:
            _drop(s3, prefix)
        end = stream_end_at(log)
        if server is not None:  # per second of the timed upload: the --no-wait linger after stream-end asks nothing of it
            server.append(server_cpu / (end - sample.started_at))
        if wire is not None:
            wire.append(trace.between(sample.started_at, end, rate_bytes_s))
            (work / f"wire-{prefix}.json").write_text(json.dumps({"started_at": sample.started_at, "stream_end": end, "samples": trace.samples}))
        return Sample(end - sample.started_at, sample.cpu, sample.max_rss)

    def reference(key: str, server: list[float]) -> Sample:
        argv = [str(ctx.python), "-c", _REFERENCE, str(data.path), BUCKET, f"{key}/data", str(args.chunk_size), str(reference_concurrency(args))]
        try:
            sample, server_cpu = _with_server_cpu(s3, lambda: run_command(argv, stderr=work / "reference.log", env=env))
            server.append(server_cpu / sample.wall)
            return sample
        finally:
            _drop(s3, key)

    _warm_up(ctx, s3, env, data.path, min(data.size, WARM_BYTES), work / "warm.log")
    rows, skipped = [], []
    for index, (mbit, rtt) in enumerate(links):
        try:
            link.shape(mbit, rtt)
        except LinkError as exc:
            skipped.append(f"{mbit} Mbit/s, {rtt:g} ms: {exc}")
            continue
        rtt_measured = link.measured_rtt_ms(urlsplit(s3.endpoint).port or 80)
        ctx.log(f"link: {mbit} Mbit/s, {rtt:g} ms RTT (measured {rtt_measured:g} ms) ...")
        ours, theirs, fixed = Series(), Series(), Series()
        server: dict[str, list[float]] = {"agent": [], "boto3": []}  # the S3 server's CPU-s per second of each run
        wire: list[dict] = []  # where each agent run's time went on the wire
        for rep in range(ctx.reps):
            fixed.add(agent(f"l{index}e{rep}", empty, "--allow-empty"))
            warm_page_cache(data.path)
            if rep % 2:
                theirs.add(reference(f"l{index}ref{rep}", server["boto3"]))
            # the veth's counter counts a GSO packet's headers once: ~TCP payload, whose most is the rate x wire_ceiling
            payload_rate = mbit * 1_000_000 / 8 * wire_ceiling(link.mtu)
            ours.add(agent(f"l{index}r{rep}", data.path, server=server["agent"], wire=wire, rate_bytes_s=payload_rate))
            if not rep % 2:
                theirs.add(reference(f"l{index}ref{rep}", server["boto3"]))
        rows.append(_row(mbit, rtt, data.size, ours, theirs, fixed, server, wire, link.mtu))
        rows[-1]["rtt_measured_ms"] = rtt_measured
        delay = link.end_delay()
        rows[-1]["delay_late_ms"] = round(delay.get("latest_release_us", 0.0) / 1000, 2)
        rows[-1]["delay_late_share"] = round(delay.get("late_1ms", 0.0) / max(delay.get("packets", 0.0), 1.0), 5)
        rows[-1]["delay_cpu_per_s"] = round(delay.get("cpu_s", 0.0) / max(delay.get("seconds", 0.0), 1e-9), 3)
    columns = ["link_mbit_s", "rtt_ms", "rtt_measured_ms", "delay_late_ms", "delay_late_share", "mtu", "agent_mb_s", "boto3_mb_s", "fraction_of_link", "boto3_fraction_of_link", "wire_ceiling", "fraction_of_ceiling",
               "startup_share", "lead_s", "slow_s", "tail_s", "agent_cpu_per_s", "server_cpu_per_s", "boto3_server_cpu_per_s", "delay_cpu_per_s",
               "tib_hours", "tib_cpu_seconds"]
    section.tables.append(Table(f"{format(data.size / 2**20, '.0f')} MiB stream over the shaped link", columns, [[r[c] for c in columns] for r in rows]))
    section.facts = {"netns": link.ns, "s3": s3.endpoint, "s3_backend": s3_backend(s3, args), "delay": link.delay_by or f"none: {link.no_delay}",
                     "cores": ctx.cores, "mtu": link.mtu, "skipped_links": no_delay}
    section.notes = skipped + [
        "fraction_of_link: the agent's median throughput (start to stream-end, start-up included) over the link's rate; "
        "agent_cpu_per_s near the core count means the host, not the link, limits it; the 1 TiB figures use the measured slope "
        "(time and CPU minus the empty backup's).",
    ]
    section.notes.append(WHERE_TIME_GOES)
    if no_delay:
        asked = ", ".join(f"{r['link_mbit_s']} Mbit/s x {r['rtt_ms']:g} ms" for r in no_delay)
        section.notes.append(f"no delay can be made here ({link.no_delay}): the links with an RTT ({asked}) are skipped;"
                             " the rows above are the rates alone at rtt_ms 0 (the veth's own RTT is ~0.05 ms)")
    return section


WHERE_TIME_GOES = (
    "where the rest goes, per agent run (medians): wire_ceiling is the most of the rate TCP's payload can be at this MTU "
    "(the rest is IP/TCP/Ethernet headers); from the host veth's byte counter, sampled every 0.1 s: lead_s, start to the first "
    "busy interval (start-up, the first chunk read); slow_s, seconds in between the link was not carrying payload at "
    "rate x wire_ceiling (the agent or the server not keeping up); tail_s, after the last busy interval to the stream-end "
    "record (completing the multipart uploads: with a store that copies at completion, the server's copy of each segment)."
)


def s3_backend(s3: s3proxy.Server, args) -> str:
    """What served S3 in the namespace, and why a run can measure the link rather than the server."""
    where = "the work directory's disk" if args.link_store == "disk" else "a tmpfs directory (/dev/shm)"
    same = "the same server for the agent and boto3"
    if args.link_store == "null-parts":
        return (f"s3proxy {s3.version} (its HTTP, authorization and multipart handling) over the benchmark's null-parts store "
                f"(scripts/bench_lib/nullparts): every part's body is received and counted, then discarded; other objects (the "
                f"repository's config and records) are kept in a jclouds {args.link_provider} store on {where}; {same}. Why: "
                "s3proxy's own stores hash and write each part and then copy and hash the whole upload again at completion, which "
                "on this small host is what a run measured, not the agent or the link; S3 completes without a copy. The agent's "
                "check after completing (HEAD: the length the server counted equals the bytes sent) still runs.")
    return (f"s3proxy {s3.version}, jclouds {args.link_provider} blobstore on {where}, {same}: every request, signature, "
            "part and completion is served and stored (each part hashed and written, each upload copied and hashed again at "
            "completion: tail_s)")


def _with_server_cpu(s3: s3proxy.Server, run) -> tuple[Sample, float]:
    """`run()`'s sample and the CPU-seconds the S3 server used while it ran."""
    before = process_cpu_seconds(s3.pid)
    sample = run()
    return sample, process_cpu_seconds(s3.pid) - before


def _warm_up(ctx: Context, s3: s3proxy.Server, env: dict[str, str], source: Path, length: int, log: Path) -> None:
    """One untimed agent upload of the data set's first `length` bytes (over the set-up's fast link) before any timed run.

    s3proxy's JVM runs its request, hashing and file paths interpreted until
    the JIT compiles them: the first upload after start measured 30-40 MB/s
    for its first five seconds, the same upload warm the link's rate. A real
    S3 endpoint is warm; the agent and boto3 then both meet a warm server.
    """
    argv = [str(ctx.braid), "backup", "--repo", f"s3://{BUCKET}/{WARM_PREFIX}", "--name", "warm", "--chunk-size", str(ctx.args.chunk_size),
            "--level", str(ctx.args.level), "--no-wait"]
    with open(log, "wb") as err, subprocess.Popen(["head", "-c", str(length), str(source)], stdout=subprocess.PIPE) as head:
        proc = subprocess.run(argv, stdin=head.stdout, stdout=subprocess.DEVNULL, stderr=err, env=env)
    _drop(s3, WARM_PREFIX)
    if proc.returncode != 0:
        raise RuntimeError(f"link warm-up upload failed ({proc.returncode}): {log.read_text(errors='replace').strip().splitlines()[-2:]}")


def _drop(s3: s3proxy.Server, prefix: str) -> None:
    """What one run stored, outside the timing."""
    if s3.data_dir is not None:
        shutil.rmtree(s3.data_dir / BUCKET / prefix, ignore_errors=True)
    drop_dirty_pages()


def _row(mbit: int, rtt: float, size: int, ours: Series, theirs: Series, fixed: Series, server: dict[str, list[float]],
         wire: list[dict], mtu: int) -> dict:
    link_bytes_s = mbit * 1_000_000 / 8
    wall, cpu = ours.median_wall, ours.median_cpu
    startup_wall, startup_cpu = fixed.median_wall, fixed.median_cpu
    slope = max(wall - startup_wall, 1e-6) / size  # seconds per byte past the fixed cost
    return {
        "link_mbit_s": mbit,
        "rtt_ms": rtt,
        "agent_mb_s": round(size / wall / MB, 1),
        "boto3_mb_s": round(size / theirs.median_wall / MB, 1),
        "fraction_of_link": round(size / wall / link_bytes_s, 3),
        "boto3_fraction_of_link": round(size / theirs.median_wall / link_bytes_s, 3),
        "wire_ceiling": round(wire_ceiling(mtu), 3),
        "fraction_of_ceiling": round(size / wall / link_bytes_s / wire_ceiling(mtu), 3),
        "mtu": mtu,
        "startup_share": round(startup_wall / wall, 3),
        **{key: round(statistics.median(run[key] for run in wire), 2) for key in ("lead_s", "slow_s", "tail_s")},
        "agent_cpu_per_s": round(cpu / wall, 2),
        "server_cpu_per_s": round(statistics.median(server["agent"]), 2),
        "boto3_server_cpu_per_s": round(statistics.median(server["boto3"]), 2),
        "tib_hours": round((startup_wall + slope * TIB) / 3600, 2),
        "tib_cpu_seconds": round(max(cpu - startup_cpu, 0) / size * TIB, 0),
        "samples": [round(s.wall, 3) for s in ours.samples],
    }
