"""`braid wal-push` and `braid wal-fetch` through the CLI, on a directory repository (docs/format.md, WAL archive)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from braid.adapters.local.store import LocalStore
from braid.format.digests import sha256
from braid.format.layout import wal_key
from braid.format.wal import WalFile
from conftest import BRAID, run_braid
from wal_segments import SYSID, segment_bytes, write_segment

SEG = "000000010000000000000003"
MARKER = b"BRAID-WAL-PLAINTEXT-MARKER"


def push(repo: Path, path: Path, *extra: str) -> tuple[int, str]:
    result = run_braid("wal-push", "--repo", str(repo), "--name", "pg", *extra, str(path))
    return result.code, result.stderr


def fetch(repo: Path, name: str, dest: Path, *extra: str) -> tuple[int, str]:
    result = run_braid("wal-fetch", "--repo", str(repo), "--name", "pg", "--prefetch", "0", *extra, name, str(dest))
    return result.code, result.stderr


def repository_bytes(repo: Path) -> bytes:
    return b"".join(p.read_bytes() for p in repo.rglob("*") if p.is_file())


def test_a_pushed_segment_is_stored_encrypted_and_fetched_verified(tmp_path: Path, repo: Path) -> None:
    wal = tmp_path / "pg_wal"
    wal.mkdir()
    path = write_segment(wal, SEG, marker=MARKER)
    assert push(repo, path) == (0, "")
    stored = repo / wal_key("pg", WalFile.parse(SEG))
    assert stored.is_file() and stored.stat().st_size < path.stat().st_size // 4  # compressed
    assert MARKER not in repository_bytes(repo)  # encrypted: no plaintext WAL in the repository
    assert b'"system_identifier": "%d"' % SYSID in (repo / "wal/pg/archive.json").read_bytes()
    dest = tmp_path / "RECOVERYXLOG"
    assert fetch(repo, SEG, dest) == (0, "")
    assert dest.read_bytes() == path.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".RECOVERYXLOG")]  # no temporary file left


def test_a_duplicate_push_is_accepted_and_a_conflicting_one_refused(tmp_path: Path, repo: Path) -> None:
    path = write_segment(tmp_path, SEG)
    assert push(repo, path)[0] == 0
    stored = repo / wal_key("pg", WalFile.parse(SEG))
    before = stored.read_bytes()
    assert push(repo, path) == (0, "")  # PostgreSQL pushes again after a crash
    original = path.read_bytes()
    other = segment_bytes(SEG, seed=1)
    path.write_bytes(other)
    code, err = push(repo, path)
    assert code == 7
    assert f"archived sha256:{sha256(original).hex()}" in err and f"pushed sha256:{sha256(other).hex()}" in err
    assert "nothing was overwritten" in err and err.count("\n") == 1
    assert stored.read_bytes() == before


def test_history_partial_and_backup_files_and_a_second_timeline_archive_side_by_side(tmp_path: Path, repo: Path) -> None:
    files = {
        SEG: segment_bytes(SEG),
        "000000020000000000000003": segment_bytes("000000020000000000000003"),  # the same segment number on timeline 2
        "000000010000000000000003.partial": segment_bytes(SEG, seed=2),
        "000000010000000000000003.00000028.backup": b"START WAL LOCATION: 0/3000028 (file 000000010000000000000003)\n",
        "00000002.history": b"1\t0/3000060\tno recovery target specified\n",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        assert push(repo, tmp_path / name) == (0, ""), name
    for name, data in files.items():
        dest = tmp_path / f"fetched-{name}"
        assert fetch(repo, name, dest) == (0, "")
        assert dest.read_bytes() == data, name


def test_wal_fetch_exit_codes(tmp_path: Path, repo: Path) -> None:
    path = write_segment(tmp_path, SEG)
    assert push(repo, path)[0] == 0
    dest = tmp_path / "out"
    code, err = fetch(repo, "0000000100000000000000FE", dest)
    assert code == 1 and "not in the WAL archive" in err and not dest.exists()
    assert fetch(repo, "00000009.history", dest)[0] == 1
    assert fetch(repo, "not-a-wal-file", dest)[0] == 2
    code, err = fetch(tmp_path / "nowhere", SEG, dest)
    assert code == 3 and "does not exist" in err
    # damage the archived copy: exit 6 (never 1: recovery must not end as if the archive ended), DEST untouched
    stored = repo / wal_key("pg", WalFile.parse(SEG))
    raw = bytearray(stored.read_bytes())
    raw[-40] ^= 1
    stored.write_bytes(bytes(raw))
    dest.write_bytes(b"old")
    code, err = fetch(repo, SEG, dest)
    assert code == 6 and "failed authentication" in err and err.count("\n") == 1
    assert dest.read_bytes() == b"old"


def test_an_archived_file_copied_to_another_name_does_not_fetch(tmp_path: Path, repo: Path) -> None:
    assert push(repo, write_segment(tmp_path, SEG))[0] == 0
    store = LocalStore(repo)
    other = "000000010000000000000004"
    store.put(wal_key("pg", WalFile.parse(other)), store.get(wal_key("pg", WalFile.parse(SEG))))
    code, err = fetch(repo, other, tmp_path / "out")
    assert code == 6 and "moved or copied" in err


def test_wal_push_refuses_what_is_not_a_segment_of_this_cluster(tmp_path: Path, repo: Path) -> None:
    assert push(repo, write_segment(tmp_path, SEG))[0] == 0
    foreign = write_segment(tmp_path, "000000010000000000000004", sysid=SYSID + 1)
    code, err = push(repo, foreign)
    assert code == 6 and f"system identifier {SYSID + 1}" in err and "new --name" in err
    short = tmp_path / "000000010000000000000005"
    short.write_bytes(segment_bytes("000000010000000000000005")[: 1 << 19])
    code, err = push(repo, short)
    assert code == 5 and "not a whole segment" in err
    renamed = tmp_path / "000000010000000000000006"
    renamed.write_bytes(segment_bytes("000000010000000000000005"))
    code, err = push(repo, renamed)
    assert code == 5 and "renamed or recycled" in err
    code, err = push(repo, tmp_path / "000000010000000000000007")
    assert code == 5 and "not found" in err
    code, err = push(repo, tmp_path / "pg_control")
    assert code == 2 and "not a WAL file name" in err
    nameless = run_braid("wal-push", "--repo", str(repo), str(tmp_path / SEG))
    assert nameless.code == 2 and "needs --name" in nameless.stderr


def test_wal_push_killed_mid_store_leaves_nothing_partial_and_the_retry_succeeds(tmp_path: Path, repo: Path) -> None:
    path = write_segment(tmp_path, SEG)
    directory = repo / wal_key("pg", WalFile.parse(SEG))
    proc = subprocess.Popen([str(BRAID), "wal-push", "--repo", str(repo), "--name", "pg", str(path)], stderr=subprocess.PIPE)
    # Kill it once its store has begun (a temporary file beside the archived name), or wherever it is when it ends.
    while proc.poll() is None and not (directory.parent.is_dir() and any(p.name.startswith(".tmp-") for p in directory.parent.iterdir())):
        pass
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()  # type: ignore[union-attr]
    # Whatever the kill left, the archive holds the whole file or nothing under its name.
    if directory.exists():
        assert fetch(repo, SEG, tmp_path / "check") == (0, "")
        assert (tmp_path / "check").read_bytes() == path.read_bytes()
    else:
        assert fetch(repo, SEG, tmp_path / "check")[0] == 1
    assert push(repo, path) == (0, "")
    assert fetch(repo, SEG, tmp_path / "after") == (0, "") and (tmp_path / "after").read_bytes() == path.read_bytes()


def test_wal_push_level(tmp_path: Path, repo: Path) -> None:
    path = write_segment(tmp_path, SEG)
    assert push(repo, path, "--level", "1") == (0, "")
    assert fetch(repo, SEG, tmp_path / "out") == (0, "") and (tmp_path / "out").read_bytes() == path.read_bytes()
