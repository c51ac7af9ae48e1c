"""catalog: `braid list` and `braid show` on a repository of many 1 TiB backups.

The repository is made synthetically, not by running backups: for each
backup the real format code seals a real manifest (braid.format.manifest,
under a data key from a real master-key file), its catalog summary and
`published` log marker (braid.ops.catalog.write_summary), exactly as a
finalizer writes them. Backups are spread over --names names, one an hour
back from two days ago, plus --recent backups published in the last hour
(which a snapshot does not fold in yet, so every `list` reads their log
markers, summaries and manifest HEADs: the steady state of a busy
repository).

Manifest sizes: the backup `show` reads is a full 1 TiB manifest (16,384
chunk entries of 64 MiB). The others are valid manifests of 1 TiB with
--chunks-per-backup entries each (larger chunks), because writing 10,000
manifests of 3 MB each (30 GB) is not possible here; `list` never reads a
manifest of a backup whose summary checks, and that is what is measured.
`list_cold_seconds` is the first snapshot's build: no snapshot yet, so every
manifest is listed and every summary read, in parallel, and the snapshot
written (locally by the first `braid list`; on S3 by the stack's scheduled
maintenance, since hosts only read an s3:// catalog: here `read_catalog` in
the benchmark's process); `list_seconds` is the median of the warm runs.

Both are the real CLI as a user runs it (`braid list --repo ... --json`, a
child process, interpreter start-up included), on a local directory and on
moto's S3 server (`--targets`). Target: `list` under 2 s at 10,000 backups.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench_lib import s3proxy
from bench_lib.context import Context, add_option_once
from bench_lib.report import Section, Table

NAME = "catalog"
HELP = "braid list / show on a repository of --backups synthetic 1 TiB backups (local and moto S3)"
ORDER = 50
IN_ALL = False  # minutes of set-up (30,000 objects on moto's server); run it on its own
TARGET_SECONDS = 2.0
TIB = 2**40
FULL_CHUNK = 64 * 2**20
BUCKET = "braid-bench-catalog"


def add_arguments(parser) -> None:
    add_option_once(parser, "--backups", type=int, default=10_000, help="catalog: backups in the repository (default 10,000)")
    add_option_once(parser, "--names", type=int, default=10, help="catalog: backup names they are spread over (default 10)")
    add_option_once(parser, "--recent", type=int, default=24, help="catalog: of them, published in the last hour (default 24)")
    add_option_once(parser, "--chunks-per-backup", type=int, default=64, help="catalog: chunk entries of the manifests list never reads (default 64)")
    add_option_once(parser, "--targets", default="local,s3", help="catalog: comma-separated, of local and s3 (default both)")


def _usage(stored: int):
    """What a cloud backup of 1 TiB in 64 MiB chunks records (braid.format.usage): every manifest carries one, so every summary does."""
    from braid.format.usage import FunctionUse, Usage

    chunks, items, segments, plans = TIB // FULL_CHUNK, TIB // FULL_CHUNK // 16, TIB // FULL_CHUNK // 256, 120
    return Usage(
        requests={
            "s3:UploadPart": chunks, "s3:CreateMultipartUpload": segments, "s3:CompleteMultipartUpload": segments,
            "s3:PutObject": chunks + items + 2 * segments + 60, "s3:GetObject": chunks + items + 4 * plans, "s3:HeadObject": 3,
            "s3:ListObjectsV2": 3 * plans, "s3:DeleteObjects": 80, "s3:AbortMultipartUpload": 0,
            "kms:GenerateDataKey": 1, "kms:Decrypt": 500, "stepfunctions:StartExecution": 1,
        },
        functions={
            "prepare": FunctionUse(1, 0.412, 0.103), "plan": FunctionUse(plans, 3600.0, 900.0),
            "worker": FunctionUse(items, 9000.123, 15547.3), "finalize": FunctionUse(1, 31.5, 54.4),
        },
        transitions=3 * plans + 3, express_requests=items, express_gb_seconds=562.5, staged_bytes=TIB, stored_bytes=stored,
    )


def _manifest(repository_id: str, ref, key, wrapped, created: datetime, chunks: int):
    from braid.format.algorithms import algorithms
    from braid.format.checksum import tagged_checksum
    from braid.format.manifest import ChunkEntry, InputEntry, Manifest
    from braid.format.timestamps import format_timestamp

    chunk_size = -(-TIB // chunks)
    entries = []
    offset = 0
    for index in range(chunks):
        length = min(chunk_size, TIB - offset)
        stored = length * 2 // 5
        entries.append(ChunkEntry(index, 0, offset, length, stored, tagged_checksum(index), os.urandom(16), "zstd"))
        offset += length
    mac = key.input_mac(0, TIB, [e.mac for e in entries])
    return Manifest(
        repository=repository_id,
        backup=str(ref),
        created=format_timestamp(created),
        completed=format_timestamp(created + timedelta(minutes=40)),
        chunk_size=chunk_size,
        key=wrapped,
        inputs=(InputEntry(0, "stdout of pg_basebackup", TIB, mac, tuple(entries)),),
        algorithms=algorithms(3),
        timings={"total_seconds": 2400.0},
        engine="local",
        stats={},
        usage=_usage(sum(e.stored_length for e in entries)),
    )


def _populate(ctx: Context, store, key_file: Path, count: int, names: int, recent: int, per_backup: int) -> str:
    """Write `count` backups; returns the NAME@ID `show` reads (the one with a full manifest)."""
    from braid.adapters.local.keys import LocalKeyFile
    from braid.format.ids import BackupRef
    from braid.format.keys import encryption_context
    from braid.format.layout import log_marker_key, manifest_key, summary_key
    from braid.format.repository import Repository, RepositoryConfig
    from braid.format.summary import BackupSummary, catalog_stamp
    from braid.format.timestamps import utc_now

    keys = LocalKeyFile.create(key_file)
    repository = Repository.create(store, RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, utc_now()))
    now = datetime.now(UTC)
    plan = []
    for i in range(count):
        if i < count - recent:
            started = now - timedelta(days=2) - timedelta(hours=count - recent - i)
        else:
            started = now - timedelta(minutes=50) + timedelta(seconds=i - (count - recent))
        plan.append((BackupRef.new(f"db{i % names:02d}", started), started))
    shown = plan[count - recent - 1][0] if count > recent else plan[-1][0]

    def write(item) -> None:
        ref, started = item
        key, wrapped = keys.generate_data_key(encryption_context(repository.config.id, str(ref)))
        manifest = _manifest(repository.config.id, ref, key, wrapped, started, 16_384 if ref == shown else per_backup)
        published = started + timedelta(minutes=40)
        # What write_summary and finalize_backup write, with the marker stamped when the backup published.
        store.put(summary_key(ref), BackupSummary.of(manifest).seal(key), durable=False)
        store.put(log_marker_key(catalog_stamp(min(published, now)), ref, "published"), b"", durable=False)
        store.put(manifest_key(ref), manifest.seal(key), create_only=True, durable=False)

    done = 0
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in pool.map(write, plan):
            done += 1
            if done % 1000 == 0:
                ctx.log(f"catalog: {done}/{count} backups written")
    return str(shown)


def _time_cli(ctx: Context, env: dict[str, str], *args: str, expect_failure: bool = False) -> tuple[float, bytes]:
    started = time.perf_counter()
    proc = subprocess.run([str(ctx.python), "-m", "braid.cli", *args], env=env, capture_output=True, check=False)
    seconds = time.perf_counter() - started
    if (proc.returncode != 0) != expect_failure:
        raise RuntimeError(f"braid {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode().strip()[-400:]}")
    return seconds, proc.stdout


def _measure(ctx: Context, env: dict[str, str], url: str, shown: str, count: int) -> dict[str, float]:
    from braid.cli.compose import open_repository
    from braid.ops.catalog import read_catalog

    if url.startswith("s3://"):
        # Hosts only read an s3:// catalog; the stack's scheduled maintenance writes its snapshot, as here.
        started = time.perf_counter()
        read_catalog(open_repository(url))
        cold = time.perf_counter() - started
        out = _time_cli(ctx, env, "list", "--repo", url, "--json")[1]
    else:
        cold, out = _time_cli(ctx, env, "list", "--repo", url, "--json")
    listed = json.loads(out)
    if len(listed) != count or any("error" in row for row in listed):
        raise RuntimeError(f"list showed {len(listed)} backups ({sum('error' in r for r in listed)} unreadable), expected {count}")
    reps = max(3, ctx.reps)
    warm = [_time_cli(ctx, env, "list", "--repo", url, "--json")[0] for _ in range(reps)]
    show = [_time_cli(ctx, env, "show", "--repo", url, shown, "--json")[0] for _ in range(reps)]
    # What the catalog itself costs, without the interpreter and imports (boto3 alone takes ~1 s on a loaded 2-core VM).
    repository = open_repository(url)
    inner = []
    for _ in range(reps):
        started = time.perf_counter()
        read_catalog(repository, write=False)
        inner.append(time.perf_counter() - started)
    startup = [_time_cli(ctx, env, "show", "--repo", url, "nosuch@latest", "--json", expect_failure=True)[0] for _ in range(reps)]
    return {
        "list_cold_seconds": cold,
        "list_seconds": statistics.median(warm),
        "show_seconds": statistics.median(show),
        "catalog_read_seconds": statistics.median(inner),
        "startup_seconds": statistics.median(startup),
    }


def run(ctx: Context) -> Section:
    args = ctx.args
    count, names, recent = args.backups, max(1, args.names), min(args.recent, args.backups)
    section = Section(NAME, f"list and show at {count:,} backups of 1 TiB over {names} names ({recent} published in the last hour)")
    work = ctx.scratch("catalog")
    env = ctx.env(PYTHONPATH=os.pathsep.join(p for p in (str(ctx.root / "layers" / "braid"), os.environ.get("PYTHONPATH", "")) if p))
    env.update(XDG_CONFIG_HOME=str(work / "config"))
    results: dict[str, dict[str, float]] = {}
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    for target in targets:
        run_dir = work / f"{target}-{os.getpid()}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        try:
            if target == "local":
                from braid.adapters.local.store import LocalStore

                ctx.log(f"catalog: writing {count} backups to a local repository ...")
                started = time.perf_counter()
                shown = _populate(ctx, LocalStore(run_dir / "repo"), run_dir / "master.key", count, names, recent, args.chunks_per_backup)
                ctx.log(f"catalog: local repository written in {time.perf_counter() - started:.0f} s")
                results[target] = _measure(ctx, env, str(run_dir / "repo"), shown, count)
            elif target == "s3":
                results[target] = _run_s3(ctx, env, run_dir, count, names, recent, args.chunks_per_backup)
            else:
                section.notes.append(f"unknown target {target!r} ignored (use local, s3)")
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
    rows = []
    for target, figures in results.items():
        verdict = "PASS" if figures["list_seconds"] < TARGET_SECONDS else "MISS"
        rows.append(
            [
                target,
                round(figures["list_cold_seconds"], 3),
                round(figures["list_seconds"], 3),
                round(figures["show_seconds"], 3),
                round(figures["catalog_read_seconds"], 3),
                round(figures["startup_seconds"], 3),
                verdict,
            ]
        )
    columns = ["repository", "list (cold)", "list", "show", "catalog read", "start-up", f"list < {TARGET_SECONDS:.0f} s"]
    section.tables.append(Table("seconds, real CLI (median of warm runs)", columns, rows))
    section.facts = {
        "backups": count,
        "list_seconds": {t: round(f["list_seconds"], 3) for t, f in results.items()},
        "show_seconds": {t: round(f["show_seconds"], 3) for t, f in results.items()},
        "list_cold_seconds": {t: round(f["list_cold_seconds"], 3) for t, f in results.items()},
        "catalog_read_seconds": {t: round(f["catalog_read_seconds"], 3) for t, f in results.items()},
        "startup_seconds": {t: round(f["startup_seconds"], 3) for t, f in results.items()},
    }
    section.notes.append("catalog read: read_catalog in the benchmark's process (no interpreter start-up, no imports)")
    section.notes.append("start-up: 'braid show NAME@latest' of a name with no backup: interpreter, imports, config, one LIST")
    section.notes.append(
        "cold: building the first snapshot (every manifest listed, every summary read, in parallel): locally the first"
        " 'braid list' does it, on S3 the stack's scheduled maintenance (hosts only read), here read_catalog in-process"
    )
    return section


def _run_s3(ctx: Context, env: dict[str, str], run_dir: Path, count: int, names: int, recent: int, per_backup: int) -> dict[str, float]:
    server = s3proxy.start_moto(run_dir, ctx.venv_bin, "moto-s3")
    try:
        s3_env = {**env, **s3proxy.credentials_env(), "AWS_ENDPOINT_URL": server.endpoint}
        os.environ.update({k: v for k, v in s3_env.items() if k.startswith("AWS_")})
        from braid.adapters.aws.clients import s3_client
        from braid.adapters.aws.s3 import S3Store

        client = s3_client(concurrency=16, endpoint_url=server.endpoint)
        client.create_bucket(Bucket=BUCKET)
        ctx.log(f"catalog: writing {count} backups to moto's S3 server ...")
        started = time.perf_counter()
        shown = _populate(ctx, S3Store(client, BUCKET, "repo"), run_dir / "master.key", count, names, recent, per_backup)
        ctx.log(f"catalog: S3 repository written in {time.perf_counter() - started:.0f} s")
        return _measure(ctx, s3_env, f"s3://{BUCKET}/repo", shown, count)
    finally:
        server.stop()
