"""scripts/bench pg's backup, restore and recovery rows: Braid against pgBackRest 2.45 on one PostgreSQL cluster, one run.

One cluster (pgbench -i -s SCALE), pgBackRest configured as
scripts/e2e-databases does (zstd 3, aes-256-cbc, process-max=2) plus
archive-async=y for its archive-push and archive-get.

- **Backup**, REPS interleaved pairs (the first side alternates):
  `braid backup --name pg -- pg_basebackup -Ft -D - -X fetch -c fast`
  (docs/databases.md) against `pgbackrest --type=full backup`.
- **Restore**, REPS interleaved pairs of the last backup of each:
  `braid restore pg@ID --pgdata DIR` against `pgbackrest restore` into an
  empty DIR; each directory removed after its run (not timed).
- **Recovery.** archive_command becomes `braid wal-push --async ... &&
  pgbackrest archive-push ...` (each tool archives every segment into its
  own repository), one base backup is taken (`pg_basebackup -Fp -X none`,
  a plain copy both sides start from), then WAL_SIZE of WAL is written by
  pgbench (a script of 1000-row range updates of pgbench_accounts), the
  last segment is switched and archived, and the cluster stops. Each rep
  copies the base backup (not timed) twice, writes recovery.signal and
  one restore_command (Braid's from `braid wal-fetch --print-restore-command
  DATA`, the form `restore --pgdata` writes: a sh fast path over a fresh
  spool in DATA/pg_wal, else `braid wal-fetch` with its default prefetch;
  `pgbackrest archive-get` with archive-async=y and a fresh
  spool), starts the server with archive_mode off and times until the log
  says recovery ended and it promoted (`database system is ready to
  accept connections`). Each run must have replayed to the end of the
  WAL written (`redo done at` in its log), or the bench fails.

Each backup and restore run also gives the CPU seconds (user + system) of
the commands it started, from getrusage(RUSAGE_CHILDREN): the client
side only (pg_basebackup's walsender and the server are not counted).
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench_lib.pg_cluster import PgHost
from bench_lib.pg_figures import lsn, redo_done

# pgbench's WAL: 1000-row range updates (each a few hundred KB of WAL: heap updates and full-page images).
UPDATE_SCRIPT = "\\set a random(1, {last})\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid BETWEEN :a AND :a + 999;\n"


@dataclass
class Runs:
    """Seconds of each side's runs, in the order they ran, and the CPU seconds of the commands each run started."""

    braid: list[float] = field(default_factory=list)
    pgbackrest: list[float] = field(default_factory=list)
    braid_cpu: list[float] = field(default_factory=list)
    pgbackrest_cpu: list[float] = field(default_factory=list)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the commands run as postgres, through runuser, waited for
    return usage.ru_utime + usage.ru_stime


@dataclass
class PitrFigures:
    backup: Runs
    restore: Runs
    recovery: Runs
    cluster_bytes: int
    wal_bytes: int
    segments: int
    braid_backup_bytes: int
    pgbackrest_backup_bytes: int
    postgresql: str
    pgbackrest_version: str


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _remove(host: PgHost, path: Path) -> None:
    host.stop(path, "immediate")
    shutil.rmtree(path, ignore_errors=True)


def _interleaved(reps: int, braid: Callable[[int], float], pgbackrest: Callable[[int], float], log: Callable[[str], None], what: str) -> Runs:
    runs = Runs()
    for rep in range(reps):
        order = [("braid", braid, runs.braid, runs.braid_cpu), ("pgbackrest", pgbackrest, runs.pgbackrest, runs.pgbackrest_cpu)]
        for side, fn, into, cpu in order if rep % 2 == 0 else order[::-1]:
            before = _children_cpu()
            into.append(fn(rep))
            cpu.append(_children_cpu() - before)
            log(f"pg: {what} {rep + 1}/{reps} {side}: {into[-1]:.2f} s, {cpu[-1]:.2f} s of client CPU")
    return runs


def _backups(host: PgHost, reps: int, log: Callable[[str], None]) -> tuple[Runs, str]:
    ids: list[str] = []

    def braid(rep: int) -> float:
        started = time.perf_counter()
        done = host.run("braid", "backup", "--name", "pg", "--", "pg_basebackup", "-Ft", "-D", "-", "-X", "fetch", "-c", "fast")
        ids.append(done.stdout.strip().splitlines()[-1])
        if not ids[-1].startswith("pg@"):
            raise RuntimeError(f"braid backup printed {done.stdout.strip()[-200:]!r}, not pg@ID")
        return time.perf_counter() - started

    runs = _interleaved(reps, braid, lambda rep: host.timed(*host.pgbackrest("--type=full", "backup")), log, "backup")
    return runs, ids[-1]


def _restores(host: PgHost, reps: int, backup_id: str, log: Callable[[str], None]) -> Runs:
    runs_dir = host.work / "runs"

    def braid(rep: int) -> float:
        target = runs_dir / f"braid-{rep}"
        seconds = host.timed("braid", "restore", "--quiet", backup_id, "--pgdata", str(target))
        if not (target / "global" / "pg_control").exists():
            raise RuntimeError(f"braid restore --pgdata left no global/pg_control in {target}")
        _remove(host, target)
        return seconds

    def pgbackrest(rep: int) -> float:
        target = runs_dir / f"pgbackrest-{rep}"
        host.run("install", "-d", "-m", "0700", str(target))
        seconds = host.timed(*host.pgbackrest(f"--pg1-path={target}", "restore"))
        if not (target / "global" / "pg_control").exists():
            raise RuntimeError(f"pgbackrest restore left no global/pg_control in {target}")
        _remove(host, target)
        return seconds

    return _interleaved(reps, braid, pgbackrest, log, "restore")


def _write_wal(host: PgHost, scale: int, wal_size: int, log: Callable[[str], None]) -> tuple[int, int]:
    """pgbench range updates until WAL_SIZE of WAL is written; (end position, bytes written)."""
    script = host.work / "updates.sql"
    script.write_text(UPDATE_SCRIPT.format(last=scale * 100_000 - 999))
    start = lsn(host.psql("SELECT pg_current_wal_lsn()"))
    written = 0
    while written < wal_size:
        host.run("pgbench", "-n", "-c", "4", "-j", "2", "-t", "100", "-f", str(script), "postgres")
        written = lsn(host.psql("SELECT pg_current_wal_lsn()")) - start
        log(f"pg: recovery: {written / 2**20:.0f} MiB of WAL written")
    return start + written, written


def _recoveries(host: PgHost, base: Path, end: int, reps: int, timeout: float, log: Callable[[str], None]) -> Runs:
    runs_dir = host.work / "runs"

    def side(name: str, restore_command: Callable[[Path, Path], str]) -> Callable[[int], float]:
        def one(rep: int) -> float:
            data, spool = runs_dir / f"recover-{name}-{rep}", runs_dir / f"spool-{name}-{rep}"
            host.run("cp", "-a", str(base), str(data))
            host.run("install", "-d", "-m", "0700", str(spool))
            with open(data / "postgresql.auto.conf", "a") as conf:
                conf.write("restore_command = '" + restore_command(data, spool).replace("'", "''") + "'\n")
            (data / "recovery.signal").touch()
            subprocess.run(["chown", "postgres:", str(data / "recovery.signal")], check=True)
            try:
                seconds, text = host.recover(data, runs_dir / f"recover-{name}-{rep}.log", timeout)
            finally:
                host.stop(data, "immediate")
            shutil.copy(runs_dir / f"recover-{name}-{rep}.log", host.work.parent / f"pg-pitr-recover-{name}-{rep}.log")
            done = redo_done(text)
            if done is None or done < end:
                raise RuntimeError(f"{name}'s recovery stopped at {done} before the WAL's end {end}: {text.strip()[-400:]}")
            shutil.rmtree(data, ignore_errors=True)
            shutil.rmtree(spool, ignore_errors=True)
            return seconds
        return one

    def braid_command(data: Path, spool: Path) -> str:  # what restore --pgdata writes: its spool in DATA/pg_wal, a sh fast path
        return host.run(str(host.braid), "wal-fetch", "--name", "pg", "--print-restore-command", str(data)).stdout.strip()

    braid = side("braid", braid_command)
    pgbackrest = side("pgbackrest", lambda data, spool: " ".join(host.pgbackrest(f"--pg1-path={data}", f"--spool-path={spool}", "archive-get", "%f", '"%p"')))
    return _interleaved(reps, braid, pgbackrest, log, "recovery")


def measure(host: PgHost, scale: int, reps: int, wal_size: int, log: Callable[[str], None]) -> PitrFigures:
    """All three rows on one new cluster; the cluster and its copies are stopped at the end."""
    try:
        host.setup()
        log(f"pg: pgbench -i -s {scale}")
        host.run("pgbench", "-i", "-q", "-s", str(scale), "postgres")
        host.psql("CHECKPOINT")
        cluster = _du(host.data) - _du(host.data / "pg_wal")  # what both tools copy (pg_basebackup -X fetch adds only the backup's WAL)
        backup, backup_id = _backups(host, reps, log)
        braid_bytes = _du(host.repo / "data") // reps  # each rep's backup is a full one
        pgbr_bytes = _du(host.work / "pgbr" / "repo" / "backup") // reps
        restore = _restores(host, reps, backup_id, log)
        host.set_archive_command(f"{host.braid_push()} && {host.pgbackrest_push()}")
        host.switch_and_wait_archived()
        base = host.work / "base"
        log("pg: recovery: base backup (pg_basebackup -Fp -X none)")
        host.run("pg_basebackup", "-D", str(base), "-Fp", "-X", "none", "-c", "fast")
        end, written = _write_wal(host, scale, wal_size, log)
        last = host.switch_and_wait_archived()
        log(f"pg: recovery: WAL archived by both up to {last}")
        host.stop(host.data)
        host.stop_pushers()
        recovery = _recoveries(host, base, end, reps, timeout=max(600.0, wal_size / 2**20 * 3), log=log)
        version = host.run("postgres", "--version").stdout.split()[2]  # postgres (PostgreSQL) 15.18 (Debian ...)
        pgbr_version = host.run("pgbackrest", "version").stdout.strip()
    finally:
        host.stop(host.data, "immediate")
        host.stop_pushers()
    return PitrFigures(backup, restore, recovery, cluster, written, -(-written // (16 * 2**20)), braid_bytes, pgbr_bytes, version, pgbr_version)
