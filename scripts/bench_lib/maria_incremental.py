"""The MariaDB part of `scripts/bench incremental`: an incremental after 1% change, over the full (issue 24: <= 15%).

MariaDB 10.11 (Debian's mariadbd and mariadb-backup), run as the mysql user:
a table of --maria-rows rows (id, v, 200 characters of MD5 hex: compresses
about 2:1, not to nothing), `braid backup -- mariadb-backup --backup
--stream=xbstream`, 1% of the rows updated (contiguous ids), then `braid
backup --incremental -- ... --incremental-lsn={parent_lsn}`, each backup after
a checkpoint (dirty pages flushed), as the PostgreSQL part checkpoints. Reported: each
one's stored bytes and the incremental's over the full's. The e2e
(scripts/e2e-incremental) restores such a chain; this only measures it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench_lib.report import Section, Table

_PAD = "CONCAT(" + ", ".join(f"MD5(seq + {k})" for k in range(6)) + ", LEFT(MD5(seq + 6), 8))"  # 200 hex characters


def _number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    if found is None:
        raise RuntimeError(f"SHOW ENGINE INNODB STATUS has no {pattern!r}")
    return int(found.group(1))


def measure(work: Path, braid: Path, rows: int, log: Callable[[str], None], section: Section) -> None:
    """Add the MariaDB figure to `section` (a note instead if MariaDB is not installed)."""
    if not (shutil.which("mariadbd") or Path("/usr/sbin/mariadbd").exists()) or not shutil.which("mariadb-backup"):
        section.notes.append("MariaDB: mariadbd or mariadb-backup is not installed; its figure was not measured")
        return
    m = work / "maria"
    for sub in ("", "sock", "home", "tmp"):
        (m / sub).mkdir(exist_ok=True)
    subprocess.run(["chown", "-R", "mysql:", str(m)], check=True)
    env = ["env", "-i", f"HOME={m / 'home'}", "PATH=/usr/bin:/bin:/usr/sbin:/sbin", "LANG=C.UTF-8", f"BRAID_KEY_FILE={m / 'home' / 'master.key'}"]

    def as_mysql(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["runuser", "-u", "mysql", "--", *env, *argv], capture_output=True, text=True)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:4])}...: exit {result.returncode}: {result.stderr.strip()[-400:]}")
        return result

    sock = str(m / "sock" / "live.sock")

    def sql(statement: str) -> str:
        return as_mysql("mariadb", f"--socket={sock}", "-N", "-B", "-e", statement).stdout.strip()

    def checkpoint() -> None:
        """Every dirty page flushed and the checkpoint past the current LSN, as PostgreSQL's bench part runs CHECKPOINT:
        otherwise mariadb-backup copies the redo since an old checkpoint (the table's load) into every backup."""
        status = sql("SHOW ENGINE INNODB STATUS")
        target = _number(r"Log sequence number\s+(\d+)", status)
        sql("SET GLOBAL innodb_max_dirty_pages_pct_lwm = 0; SET GLOBAL innodb_max_dirty_pages_pct = 0")
        for _ in range(3000):
            done = _number(r"Last checkpoint at\s+(\d+)", sql("SHOW ENGINE INNODB STATUS"))
            if done >= target:
                return
            time.sleep(0.1)
        raise RuntimeError(f"MariaDB's checkpoint did not reach LSN {target} in 300 s")

    as_mysql("mariadb-install-db", "--no-defaults", f"--datadir={m / 'data'}", "--user=mysql", "--auth-root-authentication-method=socket")
    server = subprocess.Popen(
        ["runuser", "-u", "mysql", "--", *env, "mariadbd", "--no-defaults", f"--datadir={m / 'data'}", f"--socket={sock}", "--skip-networking",
         f"--pid-file={m / 'live.pid'}", f"--log-error={m / 'live.err'}", "--innodb-buffer-pool-size=256M"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            if as_mysql("mariadb-admin", f"--socket={sock}", "ping", check=False).returncode == 0:
                break
            if server.poll() is not None:
                raise RuntimeError(f"mariadbd exited {server.returncode}")
            time.sleep(0.2)
        log(f"MariaDB: a table of {rows} rows")
        sql("CREATE DATABASE shop; CREATE TABLE shop.t (id INT PRIMARY KEY, v INT, pad CHAR(200)) ENGINE=InnoDB")
        sql(f"USE shop; INSERT INTO t SELECT seq, 0, {_PAD} FROM seq_1_to_{rows}")
        table = (m / "data" / "shop" / "t.ibd").stat().st_size
        repo = m / "repo"
        as_mysql(str(braid), "init", "--repo", str(repo))
        mb = ["mariadb-backup", "--backup", "--stream=xbstream", f"--socket={sock}", f"--datadir={m / 'data'}", f"--target-dir={m / 'tmp'}"]

        def backup(*extra: str) -> tuple[int, int]:
            out = as_mysql(str(braid), "backup", "--repo", str(repo), "--name", "maria", "--json", *extra).stdout.strip().splitlines()[-1]
            doc = json.loads(out)
            return int(doc["stored_bytes"]), int(doc["plaintext_bytes"])

        checkpoint()
        log("MariaDB: full backup")
        full_stored, full_plain = backup("--", *mb)
        first = rows // 3
        sql(f"UPDATE shop.t SET v = v + 1 WHERE id BETWEEN {first} AND {first + rows // 100 - 1}")
        checkpoint()
        log("MariaDB: incremental after 1% of the rows changed")
        inc_stored, inc_plain = backup("--incremental", "--", *mb, "--incremental-lsn={parent_lsn}")
    finally:
        pid = m / "live.pid"
        if pid.exists():
            subprocess.run(["kill", pid.read_text().strip()], check=False)
        else:
            server.terminate()
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
    ratio = inc_stored / full_stored
    section.tables.append(Table(
        "MariaDB 10.11: a full and an incremental after 1% of the rows changed",
        ["backup", "stored bytes", "stream bytes", "of the full (stored)"],
        [["full", full_stored, full_plain, 1.0], ["incremental", inc_stored, inc_plain, round(ratio, 4)]],
    ))
    section.facts.update({"maria_rows": rows, "maria_table_bytes": table, "maria_incremental_over_full": round(ratio, 4)})
    section.notes.append(f"issue target: a MariaDB incremental after 1% change <= 0.15 of the full (got {ratio:.4f}, table {table} bytes)")
