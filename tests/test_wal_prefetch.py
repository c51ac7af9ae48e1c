"""`wal-fetch`'s prefetch: the next segments wait, verified, in a private spool; the spool is emptied at the archive's end."""

from __future__ import annotations

import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from braid.format.layout import wal_key
from braid.format.wal import WalFile
from conftest import BRAID, run_braid
from support.residents import stop_residents
from wal_segments import write_segment

SEGMENTS = [f"0000000100000000000000{n:02X}" for n in range(1, 7)]


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "spool"
    yield path
    stop_residents(path.glob("*/prefetch.lock"))


def fetch(repo: Path, name: str, dest: Path, spool: Path) -> tuple[int, str]:
    result = run_braid("wal-fetch", "--repo", str(repo), "--name", "pg", "--prefetch", "3", "--spool", str(spool), name, str(dest))
    return result.code, result.stderr


def test_the_next_segments_are_prefetched_verified_and_served_from_the_spool(tmp_path: Path, repo: Path, spool: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in SEGMENTS:
        assert run_braid("wal-push", "--repo", str(repo), "--name", "pg", str(write_segment(source, name))).code == 0
    pg_wal = tmp_path / "pg_wal"
    pg_wal.mkdir()
    dest = pg_wal / "RECOVERYXLOG"
    assert fetch(repo, SEGMENTS[0], dest, spool) == (0, "")
    assert dest.read_bytes() == (source / SEGMENTS[0]).read_bytes()
    box = next(spool.glob("fetch-*"))
    assert stat.S_IMODE(spool.stat().st_mode) == 0o700 and stat.S_IMODE(box.stat().st_mode) == 0o700
    while not all((box / name).exists() for name in SEGMENTS[1:4]):  # three ahead, and no more
        time.sleep(0.05)
    assert not (box / SEGMENTS[4]).exists()
    assert all(stat.S_IMODE((box / name).stat().st_mode) == 0o600 for name in SEGMENTS[1:4])
    # Served from the spool: the archive no longer has it, the fetch still succeeds with the right bytes.
    (repo / wal_key("pg", WalFile.parse(SEGMENTS[1]))).unlink()
    assert fetch(repo, SEGMENTS[1], dest, spool) == (0, "")
    assert dest.read_bytes() == (source / SEGMENTS[1]).read_bytes()
    assert not (box / SEGMENTS[1]).exists()
    # Asking for a later segment drops the ones before it; the end of the archive empties the spool.
    while not (box / SEGMENTS[4]).exists():
        time.sleep(0.05)
    assert fetch(repo, "0000000100000000000000FE", dest, spool)[0] == 1
    assert [p.name for p in box.iterdir() if len(p.name) == 24] == []
    assert dest.read_bytes() == (source / SEGMENTS[1]).read_bytes()  # a failed fetch leaves DEST as it was


def test_a_spool_others_can_read_is_not_used_and_the_fetch_goes_on(tmp_path: Path, repo: Path, spool: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    assert run_braid("wal-push", "--repo", str(repo), "--name", "pg", str(write_segment(source, SEGMENTS[0]))).code == 0
    spool.mkdir(mode=0o777)
    spool.chmod(0o777)
    code, err = fetch(repo, SEGMENTS[0], tmp_path / "out", spool)
    assert code == 0 and "warning: no prefetch" in err and "is not private" in err
    assert (tmp_path / "out").read_bytes() == (source / SEGMENTS[0]).read_bytes()


def test_a_failing_prefetcher_drops_its_segments_and_keeps_its_log(tmp_path: Path, repo: Path, spool: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in SEGMENTS:
        assert run_braid("wal-push", "--repo", str(repo), "--name", "pg", str(write_segment(source, name))).code == 0
    stored = repo / wal_key("pg", WalFile.parse(SEGMENTS[3]))
    damaged = bytearray(stored.read_bytes())
    damaged[-1] ^= 1
    stored.write_bytes(bytes(damaged))
    assert fetch(repo, SEGMENTS[0], tmp_path / "out", spool) == (0, "")
    box = next(spool.glob("fetch-*"))
    log = box / "prefetch.log"
    while "braid wal-fetch prefetch: error:" not in log.read_text():  # it fetched 1 and 2, then 3 failed its check
        time.sleep(0.05)
    assert [p.name for p in box.iterdir() if len(p.name) == 24] == []  # nothing it spooled outlives it
    assert SEGMENTS[3] in log.read_text()
    # The next request fetches for itself; the damaged segment is refused with its own message (exit 6, not 1).
    assert fetch(repo, SEGMENTS[1], tmp_path / "out", spool) == (0, "")
    assert (tmp_path / "out").read_bytes() == (source / SEGMENTS[1]).read_bytes()
    code, err = fetch(repo, SEGMENTS[3], tmp_path / "out", spool)
    assert code >= 2 and SEGMENTS[3] in err


def test_a_spool_removed_between_its_making_and_the_position_is_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from braid.ops import wal_prefetch

    root = tmp_path / "pg_wal" / ".braid-prefetch"
    root.parent.mkdir()
    noted = wal_prefetch.note_position
    removals: list[Path] = []

    def racing(spool: Path, file_name: str) -> None:  # an idle prefetcher's cleanup runs just before the first note
        if not removals:
            removals.append(spool)
            wal_prefetch.remove_spool(spool)
            assert not root.exists()
        noted(spool, file_name)

    monkeypatch.setattr(wal_prefetch, "note_position", racing)
    box = wal_prefetch.open_spool(str(root), "/srv/repo", "pg", root.parent, SEGMENTS[0])
    assert removals == [box] and (box / "position").read_text() == SEGMENTS[0] and (box / "identity").exists()


def test_a_relative_spool_outside_a_data_directory_is_not_made_and_the_fetch_goes_on(tmp_path: Path, repo: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    assert run_braid("wal-push", "--repo", str(repo), "--name", "pg", str(write_segment(source, SEGMENTS[0]))).code == 0
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    result = subprocess.run(
        [str(BRAID), "wal-fetch", "--repo", str(repo), "--name", "pg", "--spool", "pg_wal/.braid-prefetch", SEGMENTS[0], str(tmp_path / "out")],
        cwd=elsewhere, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0 and (tmp_path / "out").read_bytes() == (source / SEGMENTS[0]).read_bytes()
    assert f"warning: no prefetch: cannot make the spool {elsewhere}/pg_wal/.braid-prefetch: No such file or directory" in result.stderr
    assert list(elsewhere.iterdir()) == []  # no pg_wal made where restore_command does not run


def test_the_prefetcher_never_imports_from_the_data_directory(tmp_path: Path, repo: Path, spool: Path) -> None:
    """PostgreSQL runs restore_command in the data directory: the prefetcher started there (`python -P -m ...`)
    imports Braid's own modules, never a `braid` package lying in that directory."""
    source = tmp_path / "source"
    source.mkdir()
    for name in SEGMENTS[:3]:
        assert run_braid("wal-push", "--repo", str(repo), "--name", "pg", str(write_segment(source, name))).code == 0
    data = tmp_path / "data"
    (data / "pg_wal").mkdir(parents=True)
    marker = tmp_path / "shadow-imported"
    for package in (data / "braid", data / "braid" / "cli"):
        package.mkdir()
        (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit(3)\n")
    argv = [str(BRAID), "wal-fetch", "--repo", str(repo), "--name", "pg", "--prefetch", "2", "--spool", str(spool), SEGMENTS[0], "pg_wal/RECOVERYXLOG"]
    done = subprocess.run(argv, cwd=data, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    box = next(spool.glob("fetch-*"))
    while not (marker.exists() or all((box / name).exists() for name in SEGMENTS[1:3])):  # the prefetcher ran, one way or the other
        time.sleep(0.05)
    assert not marker.exists()
