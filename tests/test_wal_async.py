"""`braid wal-push --async`: the resident pusher looks ahead, and back-pressure is one clear failing line."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from braid.format.layout import wal_key
from braid.format.wal import WalFile
from conftest import run_braid
from support.residents import stop_residents
from wal_segments import segment_bytes, write_segment

SEGMENTS = [f"0000000100000000000000{n:02X}" for n in range(1, 7)]


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Path]:
    """The pusher's spool; whatever pusher serves it is stopped at the end (it would idle out after a minute)."""
    path = tmp_path / "spool"
    yield path
    stop_residents(path.glob("*/pusher.lock"))


def pg_wal(tmp_path: Path, names: list[str]) -> Path:
    wal = tmp_path / "pg_wal"
    (wal / "archive_status").mkdir(parents=True)
    for name in names:
        write_segment(wal, name)
        (wal / "archive_status" / f"{name}.ready").touch()
    return wal


def push_async(repo: Path, path: Path, spool: Path, *extra: str) -> tuple[int, str]:
    result = run_braid("wal-push", "--repo", str(repo), "--name", "pg", "--async", "--spool", str(spool), *extra, str(path))
    return result.code, result.stderr


def test_the_pusher_looks_ahead_and_each_later_call_finds_its_file_stored(tmp_path: Path, repo: Path, spool: Path) -> None:
    wal = pg_wal(tmp_path, SEGMENTS)
    assert push_async(repo, wal / SEGMENTS[0], spool) == (0, "")
    archived = [repo / wal_key("pg", WalFile.parse(name)) for name in SEGMENTS]
    while not all(path.exists() for path in archived):  # the pusher stores the other ready files without being asked
        time.sleep(0.05)
    ok = next(spool.glob("push-*")) / "ok"
    for name in SEGMENTS[1:]:
        while not (ok / name).exists():
            time.sleep(0.05)
        assert push_async(repo, wal / name, spool) == (0, "")
        assert not (ok / name).exists()  # consumed by the call it answered
        (wal / "archive_status" / f"{name}.ready").rename(wal / "archive_status" / f"{name}.done")
    for name in SEGMENTS:
        dest = tmp_path / f"fetched-{name}"
        assert run_braid("wal-fetch", "--repo", str(repo), "--name", "pg", "--prefetch", "0", name, str(dest)).code == 0
        assert dest.read_bytes() == (wal / name).read_bytes()


def test_a_file_the_pusher_cannot_store_fails_its_call_with_one_line(tmp_path: Path, repo: Path, spool: Path) -> None:
    wal = pg_wal(tmp_path, SEGMENTS[:1])
    assert push_async(repo, wal / SEGMENTS[0], spool)[0] == 0
    (wal / SEGMENTS[0]).write_bytes(segment_bytes(SEGMENTS[0], seed=5))  # other bytes under an archived name
    code, err = push_async(repo, wal / SEGMENTS[0], spool)
    assert code == 7 and "could not archive" in err and "different content" in err and err.count("\n") == 1


def test_a_pusher_that_does_not_keep_up_fails_the_call_never_reports_it_stored(tmp_path: Path, repo: Path, spool: Path) -> None:
    wal = tmp_path / "pg_wal"
    wal.mkdir()
    stuck = wal / SEGMENTS[0]
    os.mkfifo(stuck)  # the pusher's read of it waits for a writer: it cannot keep up
    code, err = push_async(repo, stuck, spool, "--archive-timeout", "1")
    assert code == 7 and f"has not archived {SEGMENTS[0]} within 1 s" in err and "PostgreSQL will retry" in err
    assert not (repo / wal_key("pg", WalFile.parse(SEGMENTS[0]))).exists()
    with open(stuck, "wb"):
        pass  # let the pusher's read end (it fails on the empty file)


def test_a_pusher_that_cannot_start_says_why(tmp_path: Path, repo: Path, spool: Path) -> None:
    wal = pg_wal(tmp_path, SEGMENTS[:1])
    code, err = push_async(repo, wal / SEGMENTS[0], spool, "--key-file", str(tmp_path / "missing.key"))
    assert code == 7 and "stopped before archiving" in err and "missing.key" in err and err.count("\n") == 1


def test_a_spool_others_can_read_is_refused(tmp_path: Path, repo: Path, spool: Path) -> None:
    wal = pg_wal(tmp_path, SEGMENTS[:1])
    spool.mkdir(mode=0o755)
    spool.chmod(0o755)
    code, err = push_async(repo, wal / SEGMENTS[0], spool)
    assert code == 5 and "is not private" in err
