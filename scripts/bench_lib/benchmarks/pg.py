"""pg: PostgreSQL's WAL archive through Braid against pgBackRest and `cp`, one cluster, one run (archive-rate row).

bench_lib/pg_archive.sh runs a PostgreSQL 15 cluster as the postgres user,
measures the WAL rate `pgbench -c 8 -j 2` makes here, then for each
archive_command (cp to a local directory; pgBackRest 2.45 archive-push with
archive-async, zstd 3, aes-256-cbc, process-max 2; `braid wal-push --async`;
`braid wal-push`) writes a backlog of --segments segments with archiving
paused and times how fast the command drains it, with each call's latency
(p50, p99) from a wrapper around it. Braid is installed for the postgres
user as scripts/e2e-install does (cached under --workdir, refreshed from
this checkout each run). Needs root, PostgreSQL and pgBackRest (scripts/e2e-databases
installs them); skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from bench_lib.context import Context, add_option_once
from bench_lib.report import Section, Table

NAME = "pg"
HELP = "PostgreSQL WAL archiving: wal-push --async vs pgBackRest async archive-push vs cp (latency p50/p99, drain rate)"
ORDER = 60
IN_ALL = False
SCRIPT = Path(__file__).resolve().parents[1] / "pg_archive.sh"


def add_arguments(parser) -> None:
    add_option_once(parser, "--segments", type=int, default=24, help="pg: WAL segments of backlog each archive_command drains (default 24)")
    add_option_once(parser, "--pgbench-seconds", type=int, default=15, help="pg: seconds of pgbench -c 8 -j 2 for the WAL rate (default 15)")


def _braid_for_postgres(ctx: Context) -> Path:
    """Braid installed where the postgres user can run it: scripts/e2e-install's venv, refreshed with this checkout."""
    prefix = ctx.workdir / "pg-braid"
    if not (prefix / "bin" / "braid").exists():
        subprocess.run([str(ctx.root / "scripts" / "e2e-install"), "--prefix", str(prefix), "--keep"], check=True, capture_output=True)
    subprocess.run([str(prefix / "bin" / "pip"), "install", "-q", "--no-deps", "--force-reinstall", str(ctx.root)], check=True, capture_output=True)
    subprocess.run(["chmod", "-R", "a+rX", str(prefix)], check=True)
    for parent in [prefix, *prefix.parents]:
        if parent == Path("/"):
            break
        if not os.stat(parent).st_mode & 0o001:
            raise RuntimeError(f"{parent} is not searchable by the postgres user: give a --workdir it can reach")
    return prefix / "bin" / "braid"


def run(ctx: Context) -> Section:
    section = Section(NAME, "archive_command: drain rate of a backlog and per-call latency, one PostgreSQL cluster")
    pgbins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if os.geteuid() != 0 or not pgbins or shutil.which("pgbackrest") is None:
        section.skipped = "needs root, PostgreSQL and pgBackRest (scripts/e2e-databases installs them)"
        return section
    braid = _braid_for_postgres(ctx)
    work = ctx.workdir / "pg-archive"
    shutil.rmtree(work, ignore_errors=True)
    ctx.log(f"pg: archive-rate, {ctx.args.segments} segments per side ...")
    done = subprocess.run(
        ["bash", str(SCRIPT), str(braid), str(pgbins[-1].parent), str(work), str(ctx.args.pgbench_seconds)],
        capture_output=True, text=True, env={**os.environ, "SEGMENTS": str(ctx.args.segments)}, check=True,
    )
    rows = [line.split("\t") for line in done.stdout.splitlines() if "\t" in line]
    pgbench = float(next(r[1] for r in rows if r[0] == "pgbench"))
    sides = {r[0]: r for r in rows if r[0] != "pgbench"}
    table = []
    for side, (_s, calls, drain, p50, p99, seconds) in sides.items():
        table.append([side, int(calls), float(drain), round(float(drain) / pgbench, 1) if pgbench else "", float(p50), float(p99), float(seconds)])
    section.tables.append(Table("archive-rate", ["archive_command", "calls", "drain_MB_s", "x_pgbench_wal_rate", "p50_s", "p99_s", "drain_s"], table))
    section.facts["pgbench_wal_mb_s"] = pgbench
    ours, theirs = sides.get("braid-async"), sides.get("pgbackrest-async")
    if ours and theirs:
        section.facts["braid_async_vs_pgbackrest_drain_ratio"] = round(float(ours[2]) / float(theirs[2]), 3)
        section.facts["braid_async_vs_pgbackrest_p50_ratio"] = round(float(theirs[3]) / float(ours[3]), 3)
    section.notes.append("target (issue 23): wal-push --async drains >= 3x the WAL rate pgbench -c 8 -j 2 makes here; ratios are of this run only")
    shutil.rmtree(work, ignore_errors=True)
    return section
