"""A PostgreSQL cluster and pgBackRest run as the postgres user, for scripts/bench pg (root only).

Everything lives under one work directory the postgres user owns: the
cluster, its Unix socket (listen_addresses is empty, so the port only names
the socket), pgBackRest's repository, spool and configuration, Braid's
repository and key.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

from bench_lib.pg_figures import recovery_ended

PORT = 54351
STANZA = "bench"


class PgHost:
    """Commands as the postgres user, with Braid (`braid`), PostgreSQL (`pgbin`) and pgBackRest on PATH."""

    def __init__(self, braid: Path, pgbin: Path, work: Path) -> None:
        self.braid, self.pgbin, self.work = braid, pgbin, work
        self.data = work / "data"
        self.repo, self.key = work / "braid-repo", work / "master.key"
        self.conf = work / "pgbackrest.conf"
        work.mkdir(parents=True, exist_ok=True)
        for sub in ("pgbr/repo", "pgbr/log", "pgbr/lock", "spool", "runs"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        subprocess.run(["chown", "-R", "postgres:", str(work)], check=True)
        work.chmod(0o755)
        (work / "spool").chmod(0o700)

    def env(self) -> list[str]:
        return ["env", "-i", f"HOME={self.work}", f"PATH={self.braid.parent}:{self.pgbin}:/usr/bin:/bin", "LANG=C.UTF-8",
                f"PGHOST={self.work}", f"PGPORT={PORT}", "PGUSER=postgres", f"BRAID_REPO={self.repo}", f"BRAID_KEY_FILE={self.key}"]

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["runuser", "-u", "postgres", "--", *self.env(), *argv], capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)[:160]}: exit {done.returncode}: {done.stderr.strip()[-400:]}")
        return done

    def timed(self, *argv: str) -> float:
        """Seconds `argv` took (it must exit 0)."""
        started = time.perf_counter()
        self.run(*argv)
        return time.perf_counter() - started

    def psql(self, sql: str) -> str:
        return self.run("psql", "-At", "-c", sql, "postgres").stdout.strip()

    def pgbackrest(self, *argv: str) -> list[str]:
        return ["pgbackrest", f"--config={self.conf}", f"--stanza={STANZA}", *argv]

    def braid_push(self) -> str:
        return f"{self.braid} wal-push --name pg --async --spool {self.work / 'spool'} %p"

    def pgbackrest_push(self) -> str:
        return " ".join(self.pgbackrest("archive-push", "%p"))

    def setup(self) -> None:
        """initdb, the cluster started with pgBackRest's archive-push as archive_command, the stanza, Braid's repository."""
        self.conf.write_text(
            f"[global]\nrepo1-path={self.work / 'pgbr/repo'}\nrepo1-cipher-type=aes-256-cbc\nrepo1-cipher-pass={secrets.token_hex(32)}\n"
            f"compress-type=zst\ncompress-level=3\nprocess-max=2\nstart-fast=y\narchive-async=y\nspool-path={self.work / 'pgbr/spool'}\n"
            f"log-path={self.work / 'pgbr/log'}\nlock-path={self.work / 'pgbr/lock'}\nlog-level-console=warn\nlog-level-file=off\n\n"
            f"[{STANZA}]\npg1-path={self.data}\npg1-socket-path={self.work}\npg1-port={PORT}\n"
        )
        subprocess.run(["chown", "postgres:", str(self.conf)], check=True)
        self.conf.chmod(0o600)
        self.run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"port = {PORT}\nlisten_addresses = ''\nunix_socket_directories = '{self.work}'\narchive_mode = on\n"
                       f"archive_command = '{self.pgbackrest_push()}'\nmax_wal_size = 4GB\nsynchronous_commit = off\n")
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.work / "server.log"), "-w", "start")
        self.run(*self.pgbackrest("stanza-create"))
        self.run("braid", "init", "--repo", str(self.repo), "--key-file", str(self.key))

    def set_archive_command(self, command: str) -> None:
        self.psql(f"ALTER SYSTEM SET archive_command = '{command}'")
        self.psql("SELECT pg_reload_conf()")

    def switch_and_wait_archived(self, timeout: float = 1800) -> str:
        """Close the current segment and wait until PostgreSQL reports it archived; its name."""
        segment = self.psql("SELECT pg_walfile_name(pg_current_wal_lsn())")
        self.psql("SELECT pg_switch_wal()")
        deadline = time.monotonic() + timeout
        while self.psql(f"SELECT coalesce(last_archived_wal >= '{segment}', false) FROM pg_stat_archiver") != "t":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{segment} not archived within {timeout:.0f} s: {self.psql('SELECT * FROM pg_stat_archiver')}")
            time.sleep(0.2)
        return segment

    def stop(self, data: Path, mode: str = "fast") -> None:
        if (data / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(data), "-m", mode, "-w", "stop", check=False)

    def stop_pushers(self) -> None:
        """End the `wal-push --async` pushers this run's archive_command started (their lock files hold their pids)."""
        for lock in (self.work / "spool").glob("*/pusher.lock"):
            text = lock.read_text().strip() if lock.exists() else ""
            if text.isdigit():
                try:
                    os.kill(int(text), signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def recover(self, data: Path, log: Path, timeout: float) -> tuple[float, str]:
        """Start the server on `data` (archive_mode off), wait until recovery ended; the seconds it took and the server log."""
        started = time.perf_counter()
        self.run("pg_ctl", "-D", str(data), "-o", "-c archive_mode=off", "-l", str(log), "start")
        deadline = time.monotonic() + timeout
        text = ""
        while not recovery_ended(text):
            if time.monotonic() > deadline or "FATAL" in text or "PANIC" in text:
                self.stop(data, "immediate")
                raise RuntimeError(f"recovery of {data} did not end: {text.strip()[-600:]}")
            time.sleep(0.05)
            text = log.read_text(errors="replace") if log.exists() else ""
        return time.perf_counter() - started, text
