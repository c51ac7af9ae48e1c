"""pg: PostgreSQL through Braid against pgBackRest 2.45 (and `cp`), one cluster per row set, one run; issue 23's figures.

Rows (`--pg-rows`, default all):

- **archive** (bench_lib/pg_archive.sh): a PostgreSQL 15 cluster as the
  postgres user; the WAL rate `pgbench -c 8 -j 2` makes here; the same
  pgbench with archive_command = `braid wal-push --async` while the count of
  `.ready` files in pg_wal/archive_status is sampled every 0.2 s (the
  archiver's backlog: its max is the issue's "never above 8 segments");
  then for each archive_command (cp to a local directory; pgBackRest
  archive-push with archive-async, zstd 3, aes-256-cbc, process-max 2;
  `braid wal-push --async`; `braid wal-push`) a backlog of --segments
  segments written with archiving paused, drained, with each call's
  latency (p50, p99) from a wrapper around it.
- **pitr** (bench_lib/pg_pitr.py): backup, restore and recovery, Braid and
  pgBackRest interleaved on one cluster (pgbench -i -s --pg-scale), --reps
  pairs each (default 3 here), medians and ratios (pgBackRest's time over
  Braid's: above 1, Braid is faster); recovery replays --wal-size of WAL.

Braid is installed for the postgres user as scripts/e2e-install does
(cached under --workdir, refreshed from this checkout each run). Needs
root, PostgreSQL and pgBackRest (scripts/e2e-databases installs them);
skipped otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
from pathlib import Path

from bench_lib.context import Context, add_option_once, size_arg
from bench_lib.pg_cluster import PgHost
from bench_lib.pg_figures import backlog, paired
from bench_lib.report import Section, Table

NAME = "pg"
HELP = "PostgreSQL: WAL archiving (latency, drain rate, backlog under pgbench), backup, restore --pgdata and recovery vs pgBackRest 2.45"
ORDER = 60
IN_ALL = False
SCRIPT = Path(__file__).resolve().parents[1] / "pg_archive.sh"
ROWS = ("archive", "pitr")
TARGETS = {"recovery": 1.0, "restore": 1.0, "backup": 1.4}  # issue 23, section 6: pgBackRest's time over Braid's


def _rows(text: str) -> list[str]:
    rows = [r.strip() for r in text.split(",") if r.strip()]
    if not rows or any(r not in ROWS for r in rows):
        raise argparse.ArgumentTypeError(f"--pg-rows: a comma-separated list of {', '.join(ROWS)}, got {text!r}")
    return rows


def add_arguments(parser) -> None:
    add_option_once(parser, "--segments", type=int, default=24, help="pg: WAL segments of backlog each archive_command drains (default 24)")
    add_option_once(parser, "--pgbench-seconds", type=int, default=15, help="pg: seconds of pgbench -c 8 -j 2 for the WAL rate and the backlog (default 15)")
    add_option_once(parser, "--wal-size", type=size_arg, default=size_arg("1GiB"), help="pg: WAL the recovery row replays (default 1GiB)")
    add_option_once(parser, "--pg-scale", type=int, default=50, help="pg: pgbench scale of the backup/restore cluster (default 50, ~750 MB)")
    add_option_once(parser, "--pg-rows", type=_rows, default=list(ROWS), help="pg: rows to run, comma-separated: archive,pitr (default both)")
    parser.set_defaults(reps=3)


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


def _archive(ctx: Context, section: Section, braid: Path, pgbin: Path) -> None:
    work = ctx.workdir / "pg-archive"
    shutil.rmtree(work, ignore_errors=True)
    ctx.log(f"pg: archive-rate, {ctx.args.segments} segments per side ...")
    done = subprocess.run(
        ["bash", str(SCRIPT), str(braid), str(pgbin), str(work), str(ctx.args.pgbench_seconds)],
        capture_output=True, text=True, env={**os.environ, "SEGMENTS": str(ctx.args.segments)}, check=True,
    )
    rows = [line.split("\t") for line in done.stdout.splitlines() if "\t" in line]
    pgbench = float(next(r[1] for r in rows if r[0] == "pgbench"))
    load = next(r for r in rows if r[0] == "backlog")  # backlog  side  wal_MB_s  samples(space-separated)
    sides = {r[0]: r for r in rows if r[0] not in ("pgbench", "backlog")}
    table = []
    for side, (_s, calls, drain, p50, p99, seconds) in sides.items():
        table.append([side, int(calls), float(drain), round(float(drain) / pgbench, 1) if pgbench else "", float(p50), float(p99), float(seconds)])
    section.tables.append(Table("archive-rate", ["archive_command", "calls", "drain_MB_s", "x_pgbench_wal_rate", "p50_s", "p99_s", "drain_s"], table, key="archive_rate"))
    summary = backlog(load[3].replace(" ", "\n"))
    section.tables.append(Table(
        f"archive backlog under pgbench -c 8 -j 2 ({ctx.args.pgbench_seconds} s), archive_command = {load[1]}: .ready files every 0.2 s",
        ["archive_command", "pgbench_wal_MB_s", "max_segments", "p99_segments", "mean_segments", "samples"],
        [[load[1], float(load[2]), summary["max_archive_backlog_segments"], summary["p99_archive_backlog_segments"],
          summary["mean_archive_backlog_segments"], summary["archive_backlog_samples"]]], key="archive_backlog",
    ))
    section.facts["pgbench_wal_mb_s"] = pgbench
    section.facts.update(summary)
    section.facts["archive_backlog_pgbench_wal_mb_s"] = float(load[2])
    ours, theirs = sides.get("braid-async"), sides.get("pgbackrest-async")
    if ours and pgbench:
        section.facts["braid_async_drain_over_pgbench_wal_rate"] = round(float(ours[2]) / pgbench, 1)
    if ours and theirs:
        section.facts["braid_async_vs_pgbackrest_drain_ratio"] = round(float(ours[2]) / float(theirs[2]), 3)
        section.facts["braid_async_vs_pgbackrest_p50_ratio"] = round(float(theirs[3]) / float(ours[3]), 3)
    section.notes.append("target (issue 23): wal-push --async drains >= 3x the WAL rate pgbench -c 8 -j 2 makes here, backlog never above 8 segments")
    shutil.rmtree(work, ignore_errors=True)


def _pitr(ctx: Context, section: Section, braid: Path, pgbin: Path) -> None:
    from bench_lib.pg_pitr import measure

    work = ctx.workdir / "pg-pitr"
    shutil.rmtree(work, ignore_errors=True)
    ctx.log(f"pg: backup, restore, recovery ({ctx.reps} reps, pgbench scale {ctx.args.pg_scale}, {ctx.args.wal_size / 2**20:.0f} MiB of WAL) ...")
    figures = measure(PgHost(braid, pgbin, work), ctx.args.pg_scale, ctx.reps, ctx.args.wal_size, ctx.log)
    rows = []
    for row, runs in (("backup", figures.backup), ("restore", figures.restore), ("recovery", figures.recovery)):
        facts = paired(row, runs.braid, runs.pgbackrest)
        section.facts.update(facts)
        if row != "recovery":  # a recovery's work is the server's (a daemon), and its runs include the untimed copy
            section.facts[f"{row}_braid_client_cpu_median_s"] = round(statistics.median(runs.braid_cpu), 2)
            section.facts[f"{row}_pgbackrest_client_cpu_median_s"] = round(statistics.median(runs.pgbackrest_cpu), 2)
        ratio = facts[f"{row}_ratio_median"]
        rows.append([row, facts[f"{row}_braid_median_s"], facts[f"{row}_pgbackrest_median_s"], ratio, facts[f"{row}_ratio_best"],
                     f">= {TARGETS[row]}", "PASS" if ratio >= TARGETS[row] else "MISS",
                     " ".join(f"{s:.2f}" for s in runs.braid), " ".join(f"{s:.2f}" for s in runs.pgbackrest)])
    section.tables.append(Table(
        f"PostgreSQL {figures.postgresql}, {figures.pgbackrest_version}: medians of {ctx.reps} interleaved pairs (ratio: pgBackRest's time / Braid's)",
        ["row", "braid_median_s", "pgbackrest_median_s", "ratio_median", "ratio_best", "target", "", "braid_runs_s", "pgbackrest_runs_s"],
        rows, key="pitr",
    ))
    section.facts.update({
        "pitr_data_directory_bytes_without_pg_wal": figures.cluster_bytes,
        "pitr_braid_stored_bytes_per_backup": figures.braid_backup_bytes,
        "pitr_pgbackrest_stored_bytes_per_backup": figures.pgbackrest_backup_bytes,
        "recovery_wal_bytes": figures.wal_bytes,
        "recovery_wal_segments": figures.segments,
        "pitr_postgresql": figures.postgresql,
        "pitr_pgbackrest_version": figures.pgbackrest_version,
    })
    section.notes.append("backup: braid backup -- pg_basebackup -Ft -D - -X fetch -c fast vs pgbackrest --type=full backup (zstd 3, aes-256-cbc, process-max=2)")
    section.notes.append("restore: braid restore NAME@ID --pgdata DIR vs pgbackrest restore into an empty DIR; recovery: braid wal-fetch "
                         "(prefetch 8) vs pgbackrest archive-get (archive-async=y, process-max=2), start to promotion")
    shutil.rmtree(work, ignore_errors=True)


def run(ctx: Context) -> Section:
    section = Section(NAME, "PostgreSQL: archive_command drain rate, latency and backlog; backup, restore --pgdata and recovery vs pgBackRest")
    pgbins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if os.geteuid() != 0 or not pgbins or shutil.which("pgbackrest") is None:
        section.skipped = "needs root, PostgreSQL and pgBackRest (scripts/e2e-databases installs them)"
        return section
    braid = _braid_for_postgres(ctx)
    if "archive" in ctx.args.pg_rows:
        _archive(ctx, section, braid, pgbins[-1].parent)
    if "pitr" in ctx.args.pg_rows:
        _pitr(ctx, section, braid, pgbins[-1].parent)
    section.notes.append("ratios are of this run only; the machine's load moves each time (see docs/design/pitr-restore.md)")
    return section
