"""The restore_command `restore --pgdata` writes: a sh fast path serves a spooled segment without Python, else wal-fetch runs."""

from __future__ import annotations

import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from braid.ops.recovery import fetch_spool, restore_command
from braid.ops.wal_prefetch import remove_spool
from conftest import BRAID, run_braid
from support.residents import stop_residents
from wal_segments import write_segment

SEGMENTS = [f"0000000100000000000000{n:02X}" for n in range(1, 7)]
ODD = "it's a %f 100% \"odd\" $dir"


def postgres_runs(command: str, file_name: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """What PostgreSQL does with restore_command: %f, %p and %% replaced, RECOVERYXLOG removed, then /bin/sh -c in the data directory."""
    dest = cwd / "pg_wal" / "RECOVERYXLOG"
    dest.unlink(missing_ok=True)
    line, i = [], 0
    while i < len(command):
        if command[i] == "%" and i + 1 < len(command):
            line.append({"f": file_name, "p": "pg_wal/RECOVERYXLOG", "%": "%"}.get(command[i + 1], command[i : i + 2]))
            i += 2
        else:
            line.append(command[i])
            i += 1
    return subprocess.run(["/bin/sh", "-c", "".join(line)], cwd=cwd, capture_output=True, text=True, timeout=120)


def stub(directory: Path, code: int) -> Path:
    """A stand-in for braid that records its arguments, one a line, and exits `code`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "braid"
    path.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done >"$(dirname "$0")/called"\nexit {code}\n')
    path.chmod(0o755)
    return path


def test_every_path_reaches_wal_fetch_intact_through_postgres_and_sh(tmp_path: Path) -> None:
    root = tmp_path / ODD / "pg_wal" / ".braid-prefetch"
    spool = root / "fetch-pg"
    spool.mkdir(parents=True)
    (tmp_path / ODD / "pg_wal").chmod(0o700)
    braid = stub(tmp_path / ODD / "bin", 0)
    command = restore_command([str(braid)], f"/srv/{ODD}", "pg", f"/etc/{ODD}", (str(root), str(spool)))
    assert postgres_runs(command, SEGMENTS[0], tmp_path / ODD).returncode == 0
    assert (braid.parent / "called").read_text().splitlines() == [
        "wal-fetch", "--repo", f"/srv/{ODD}", "--name", "pg", "--key-file", f"/etc/{ODD}", "--spool", str(root),
        SEGMENTS[0], "pg_wal/RECOVERYXLOG",
    ]
    # The plain form is unchanged: `braid wal-fetch --repo R --name NAME %f %p`.
    assert restore_command(["/usr/bin/braid"], "/srv/r", "pg", None) == "/usr/bin/braid wal-fetch --repo /srv/r --name pg %f %p"


@pytest.fixture
def pgdata(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "data dir's"
    (directory / "pg_wal").mkdir(parents=True, mode=0o700)
    yield directory
    stop_residents(tmp_path.rglob("prefetch.lock"))  # wherever the data directory was moved to


def wait_for(condition: object) -> None:
    while not condition():  # type: ignore[operator]
        time.sleep(0.05)


def test_a_moved_data_directory_keeps_its_fast_path_and_the_prefetcher_follows(tmp_path: Path, repo: Path, pgdata: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in SEGMENTS:
        assert run_braid("wal-push", "--repo", str(repo), "--name", "pg", str(write_segment(source, name))).code == 0
    spool = fetch_spool(str(pgdata), str(repo), "pg")
    assert spool is not None and spool[0] == "pg_wal/.braid-prefetch" and spool[1].startswith("pg_wal/.braid-prefetch/fetch-pg-")
    real = restore_command([str(BRAID)], str(repo), "pg", None, spool)
    failing = stub(tmp_path / "no braid", 99)  # called only when the fast path does not serve
    fast = restore_command([str(failing)], str(repo), "pg", None, spool)
    assert str(pgdata) not in real

    # Restored, then moved into place (as DBAs do), into a directory whose name needs quoting.
    moved = tmp_path / ODD / "main"
    moved.parent.mkdir()
    pgdata.rename(moved)
    box, dest = moved / spool[1], moved / "pg_wal" / "RECOVERYXLOG"

    # Nothing spooled yet: wal-fetch runs, serves the segment and starts the prefetcher in the moved directory.
    assert postgres_runs(real, SEGMENTS[0], moved).returncode == 0
    assert dest.read_bytes() == (source / SEGMENTS[0]).read_bytes()
    wait_for(lambda: all((box / name).exists() for name in SEGMENTS[1:4]))
    assert not pgdata.exists()  # nothing was written to the old place

    # Spooled: sh serves it (the stub is never run), writes the position, leaves nothing of it in the spool.
    done = postgres_runs(fast, SEGMENTS[1], moved)
    assert (done.returncode, done.stderr) == (0, "")
    assert not (failing.parent / "called").exists()
    assert dest.read_bytes() == (source / SEGMENTS[1]).read_bytes()
    assert (box / "position").read_text().strip() == SEGMENTS[1] and not (box / SEGMENTS[1]).exists()
    assert [p.name for p in box.iterdir() if p.name.startswith(".position")] == []
    # The prefetcher learned the position from the fast path: it fetches further ahead.
    wait_for(lambda: (box / SEGMENTS[4]).exists())

    # Moved again while the prefetcher runs (the server stopped, the directory renamed, started again): the fast
    # path serves from the new place, and the prefetcher, which names the spool relative to its working
    # directory, follows the move and drops the segment left behind there.
    again = tmp_path / "renamed"
    moved.rename(again)
    box, dest = again / spool[1], again / "pg_wal" / "RECOVERYXLOG"
    assert postgres_runs(fast, SEGMENTS[3], again).returncode == 0
    assert dest.read_bytes() == (source / SEGMENTS[3]).read_bytes()
    wait_for(lambda: not (box / SEGMENTS[2]).exists())
    assert not (failing.parent / "called").exists() and not moved.exists()

    # Not spooled: the fallback runs wal-fetch (here the stub, with the same arguments).
    assert postgres_runs(fast, "00000002.history", again).returncode == 99
    assert (failing.parent / "called").read_text().splitlines()[-2:] == ["00000002.history", "pg_wal/RECOVERYXLOG"]

    # No request for a while (recovery ended, or paused): the prefetcher's idle exit removes the spool, the
    # segments it fetched ahead with it, and the emptied .braid-prefetch; pg_wal keeps what else is there.
    (again / "pg_wal" / "archive_status").mkdir()
    wait_for(lambda: not (again / "pg_wal" / ".braid-prefetch").exists())
    assert sorted(p.name for p in (again / "pg_wal").iterdir()) == ["archive_status"]

    # Recovery resumes later: the fast path misses (the stub is called) ...
    (failing.parent / "called").unlink()
    assert postgres_runs(fast, SEGMENTS[5], again).returncode == 99
    assert (failing.parent / "called").read_text().splitlines()[-2:] == [SEGMENTS[5], "pg_wal/RECOVERYXLOG"]
    # ... and wal-fetch fetches the segment, making the same spool again.
    assert postgres_runs(real, SEGMENTS[5], again).returncode == 0
    assert dest.read_bytes() == (source / SEGMENTS[5]).read_bytes()
    assert (box / "position").read_text().strip() == SEGMENTS[5]
    # The real one exits 1 for a file not in the archive, with nothing at DEST.
    missing = postgres_runs(real, "0000000100000000000000FE", again)
    assert missing.returncode == 1 and "not in the WAL archive" in missing.stderr
    assert not dest.exists()


def test_the_idle_cleanup_removes_only_braids_own_files(tmp_path: Path) -> None:
    root = tmp_path / "pg_wal" / ".braid-prefetch"
    spool = root / "fetch-pg-0badc0de"
    spool.mkdir(parents=True)
    ours = [SEGMENTS[0], "position", ".position.4242", "identity", "prefetch.log", "prefetch.lock", f".{SEGMENTS[1]}.braid-x1y2z3"]
    for name in [*ours, "notes.txt", ".position"]:
        (spool / name).write_text(name)
    remove_spool(spool)
    assert sorted(p.name for p in spool.iterdir()) == [".position", "notes.txt"]  # not Braid's: kept, and so is the directory
    (spool / "notes.txt").unlink()
    (spool / ".position").unlink()
    remove_spool(spool)
    assert not root.exists() and (tmp_path / "pg_wal").is_dir()
    # A root of the user's (--spool DIR) is left in place, even empty.
    mine = tmp_path / "mine" / "fetch-pg-0badc0de"
    mine.mkdir(parents=True)
    remove_spool(mine)
    assert not mine.exists() and mine.parent.is_dir()
    remove_spool(mine)  # already gone: nothing to do


def test_print_restore_command_makes_the_spool_and_prints_what_restore_pgdata_writes(repo: Path, pgdata: Path) -> None:
    result = run_braid("wal-fetch", "--repo", str(repo), "--name", "pg", "--print-restore-command", str(pgdata))
    assert (result.code, result.stderr) == (0, "")
    root = pgdata / "pg_wal" / ".braid-prefetch"
    box = next(root.glob("fetch-pg-*"))
    assert stat.S_IMODE(root.stat().st_mode) == stat.S_IMODE(box.stat().st_mode) == 0o700
    spool = ("pg_wal/.braid-prefetch", f"pg_wal/.braid-prefetch/{box.name}")
    assert result.stdout.decode().strip() == restore_command([str(BRAID)], str(repo), "pg", None, spool)


def test_print_restore_command_without_pg_wal_prints_the_plain_form(repo: Path, tmp_path: Path) -> None:
    result = run_braid("wal-fetch", "--repo", str(repo), "--name", "pg", "--print-restore-command", str(tmp_path))
    assert result.stdout.decode().strip() == restore_command([str(BRAID)], str(repo), "pg", None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--print-restore-command", "/nonexistent/data"], "/nonexistent/data is not a directory"),
        (["--print-restore-command", "/tmp", "000000010000000000000001", "x"], "takes no WALFILE DEST"),
        ([], "needs WALFILE DEST"),
    ],
)
def test_wal_fetch_usage_errors(repo: Path, args: list[str], message: str) -> None:
    result = run_braid("wal-fetch", "--repo", str(repo), "--name", "pg", *args)
    assert result.code == 2 and message in result.stderr and result.stdout == b""
