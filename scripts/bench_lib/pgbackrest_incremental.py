"""The pgBackRest part of `scripts/bench incremental`: a week of pgBackRest 2.45 incrementals beside Braid's.

PostgreSQL 15 from Debian (/usr/lib/postgresql/15/bin; postgresql-15 and
pgbackrest installed with apt-get when missing), run as the postgres user,
pgbench at the same scale, WAL archived by `pgbackrest archive-push`
(pgBackRest's backups need it). pgBackRest as scripts/e2e-databases runs
it: compress-type=zst, compress-level=3, repo1-cipher-type=aes-256-cbc,
process-max=2, start-fast=y, and archive-copy=y so that each backup stores
the WAL that makes it consistent, as Braid's `pg_basebackup -X fetch` does.
A `--type=full` backup, then each day the same contiguous 1% of
pgbench_accounts' rows as the PostgreSQL 18 part changes (changed_range),
a checkpoint and a `--type=incr` backup. A backup's stored bytes are its
`info.repository.delta` in `pgbackrest info --output=json`: the bytes it
added to the repository (compressed, encrypted; files it references from
an earlier backup and its backup.manifest not counted; the table's last
column is du of the backup's directory, manifest included). The WAL
archive (continuous archiving) is neither side's backup and is reported
apart.

pgBackRest's incrementals are file-level: a relation segment (up to 1 GiB)
with one changed row is stored whole. Braid's are PostgreSQL 17+'s
block-level ones, which pgBackRest 2.45 does not take.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench_lib.report import Section, Table

PG15_BIN = Path("/usr/lib/postgresql/15/bin")
PORT = 55493
STANZA = "bench"
SETTINGS = "compress-type=zst, compress-level=3, repo1-cipher-type=aes-256-cbc, process-max=2, start-fast=y, archive-copy=y"
MEASURE = "info.repository.delta of each backup in pgbackrest info --output=json (bytes the backup added to the repository)"
GRANULARITY = "file-level: a relation segment (up to 1 GiB) with one changed row is stored whole"


def changed_range(day: int, days: int, rows: int) -> tuple[int, int]:
    """The aids (first, last) of pgbench_accounts that day `day` (1..days) changes: 1% of `rows`, contiguous, a new place each day."""
    first = day * rows // (days + 2) + 1
    return first, first + rows // 100 - 1


@dataclass(frozen=True)
class StoredBackup:
    """One backup of a stanza as `pgbackrest info --output=json` reports it."""

    label: str
    kind: str  # full | diff | incr
    stored: int  # info.repository.delta: what this backup added to the repository
    database: int  # info.size: the cluster's size at the backup


def stored_backups(info_json: str, stanza: str) -> list[StoredBackup]:
    """The backups of `stanza` in `pgbackrest info --output=json`'s text, oldest first; ValueError if the stanza or a field is missing."""
    doc = json.loads(info_json)
    for entry in doc if isinstance(doc, list) else []:
        if isinstance(entry, dict) and entry.get("name") == stanza:
            try:
                backups = [
                    StoredBackup(str(b["label"]), str(b["type"]), int(b["info"]["repository"]["delta"]), int(b["info"]["size"]))
                    for b in entry["backup"]
                ]
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"pgbackrest info: a backup of stanza {stanza!r} lacks {exc}") from None
            return sorted(backups, key=lambda b: b.label)
    raise ValueError(f"pgbackrest info: no stanza {stanza!r}")


def week_ratios(braid: Sequence[int], pgbackrest: Sequence[int]) -> dict[str, float | int]:
    """The stable `--json` facts comparing the two chains: each list is a full's stored bytes, then its incrementals'.

    `<tool>_incrementals_over_fulls` is the incrementals' total over as many fulls of the same tool (its
    incrementals over its own full); `braid_incrementals_over_pgbackrest_incrementals` is the two totals' ratio.
    """
    if len(braid) < 2 or len(braid) != len(pgbackrest):
        raise ValueError(f"need a full and the same number of incrementals on both sides, got {len(braid)} and {len(pgbackrest)}")
    if min(*braid, *pgbackrest) <= 0:
        raise ValueError("a stored size of 0 bytes: the backup was not measured")
    days = len(braid) - 1
    ours, theirs = sum(braid[1:]), sum(pgbackrest[1:])
    return {
        "pgbackrest_full_stored_bytes": pgbackrest[0],
        "pgbackrest_incrementals_stored_bytes": theirs,
        "braid_full_stored_bytes": braid[0],
        "braid_incrementals_stored_bytes": ours,
        "pgbackrest_first_incremental_over_full": round(pgbackrest[1] / pgbackrest[0], 4),
        "pgbackrest_incrementals_over_fulls": round(theirs / (days * pgbackrest[0]), 4),
        "braid_incrementals_over_fulls": round(ours / (days * braid[0]), 4),
        "braid_incrementals_over_pgbackrest_incrementals": round(ours / theirs, 4),
        "braid_full_over_pgbackrest_full": round(braid[0] / pgbackrest[0], 4),
    }


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[4:10])}...: exit {result.returncode}: {result.stderr.strip()[-400:]}")
    return result


def _installed(log: Callable[[str], None]) -> bool:
    """PostgreSQL 15 and pgBackRest, from Debian with apt-get when missing (as scripts/e2e-databases installs them)."""
    if (PG15_BIN / "initdb").exists() and shutil.which("pgbackrest") is not None:
        return True
    log("pgBackRest: installing postgresql-15 and pgbackrest from Debian")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql-15", "pgbackrest"]):
        if subprocess.run(argv, capture_output=True, env=env).returncode != 0:
            return False
    return (PG15_BIN / "initdb").exists() and shutil.which("pgbackrest") is not None


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(work: Path, scale: int, days: int, braid_chain: Sequence[int], log: Callable[[str], None], section: Section) -> None:
    """Add pgBackRest's week (a table, facts, notes) to `section`; a note instead if PostgreSQL 15 or pgBackRest is missing.

    `braid_chain` is Braid's full's stored bytes, then its `days` incrementals'.
    """
    if not _installed(log):
        section.notes.append(f"pgBackRest: {PG15_BIN} or pgbackrest is missing and apt-get could not install postgresql-15 pgbackrest; not measured")
        return
    w = work / "pgbr"
    shutil.rmtree(w, ignore_errors=True)
    for sub in ("", "repo", "log", "lock", "home"):
        (w / sub).mkdir(exist_ok=True)
    shutil.chown(w, "postgres")
    _run(["chown", "-R", "postgres:", str(w)])
    conf, data = w / "pgbackrest.conf", w / "data"
    conf.write_text(
        f"[global]\nrepo1-path={w / 'repo'}\nrepo1-cipher-type=aes-256-cbc\nrepo1-cipher-pass={secrets.token_hex(32)}\n"
        "compress-type=zst\ncompress-level=3\nprocess-max=2\nstart-fast=y\narchive-copy=y\n"
        f"log-path={w / 'log'}\nlock-path={w / 'lock'}\nlog-level-console=warn\nlog-level-file=off\n\n"
        f"[{STANZA}]\npg1-path={data}\npg1-socket-path={w}\npg1-port={PORT}\n"
    )
    shutil.chown(conf, "postgres")
    conf.chmod(0o600)
    env = ["env", "-i", f"HOME={w / 'home'}", f"PATH={PG15_BIN}:/usr/bin:/bin", "LANG=C.UTF-8", f"PGHOST={w}", f"PGPORT={PORT}", "PGUSER=postgres"]

    def as_pg(*argv: str) -> subprocess.CompletedProcess[str]:
        return _run(["runuser", "-u", "postgres", "--", *env, *argv])

    def psql(sql: str) -> str:
        return as_pg("psql", "-At", "-c", sql, "postgres").stdout.strip()

    pgbr = ["pgbackrest", f"--config={conf}", f"--stanza={STANZA}"]
    as_pg("initdb", "-D", str(data), "-U", "postgres", "--auth=trust")
    with open(data / "postgresql.conf", "a") as pg_conf:
        pg_conf.write(f"port = {PORT}\nlisten_addresses = ''\nunix_socket_directories = '{w}'\nmax_wal_size = 4GB\n"
                      f"archive_mode = on\narchive_command = 'pgbackrest --config={conf} --stanza={STANZA} archive-push %p'\n")
    as_pg("pg_ctl", "-D", str(data), "-l", str(w / "server.log"), "-w", "start")
    seconds: list[float] = []
    try:
        version = psql("show server_version").split()[0]
        as_pg(*pgbr, "stanza-create")
        log(f"pgBackRest: PostgreSQL {version}, pgbench -i -s {scale}")
        as_pg("pgbench", "-i", "-q", "-s", str(scale), "postgres")
        rows = scale * 100_000

        def backup(kind: str) -> None:
            started = time.monotonic()
            as_pg(*pgbr, f"--type={kind}", "backup")
            seconds.append(time.monotonic() - started)

        log("pgBackRest: full backup")
        backup("full")
        for day in range(1, days + 1):
            first, last = changed_range(day, days, rows)
            psql(f"update pgbench_accounts set abalance = abalance + {day} where aid between {first} and {last}")
            psql("checkpoint")
            log(f"pgBackRest: incremental {day}")
            backup("incr")
        backups = stored_backups(as_pg(*pgbr, "--output=json", "info").stdout, STANZA)
        pgbr_version = as_pg("pgbackrest", "version").stdout.strip()
    finally:
        subprocess.run(["runuser", "-u", "postgres", "--", *env, "pg_ctl", "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
    if [b.kind for b in backups] != ["full"] + ["incr"] * days:
        raise RuntimeError(f"pgbackrest info lists {[b.kind for b in backups]}, want a full and {days} incr")
    archive = _du(w / "repo" / "archive")
    full = backups[0].stored
    section.tables.append(Table(
        f"{pgbr_version} on PostgreSQL {version}: a full and {days} incrementals (file-level)",
        ["backup", "kind", "stored bytes", "of the full", "backup s", "directory (du)"],
        [[b.label, b.kind, b.stored, round(b.stored / full, 4), round(s, 2), _du(w / "repo" / "backup" / STANZA / b.label)]
         for b, s in zip(backups, seconds, strict=True)],
    ))
    section.facts.update(week_ratios(braid_chain, [b.stored for b in backups]))
    section.facts.update({
        "pgbackrest_version": pgbr_version,
        "pgbackrest_postgresql": version,
        "pgbackrest_settings": SETTINGS,
        "pgbackrest_stored_bytes_are": MEASURE,
        "pgbackrest_granularity": GRANULARITY,
        "pgbackrest_wal_archive_bytes": archive,
    })
    section.notes.append(f"pgBackRest's incrementals are {GRANULARITY}; Braid's (PostgreSQL 18, pg_basebackup --incremental) are block-level")
    section.notes.append(f"pgBackRest: {SETTINGS}; stored bytes: {MEASURE}; its WAL archive ({archive} bytes, du of repo/archive) is not counted")
    shutil.rmtree(w / "data", ignore_errors=True)
