"""`restore --pgdata` of a PostgreSQL chain with `--rebuild in-place` (the default), on synthetic pg_basebackup tars:
INCREMENTAL files truncate and patch blocks in place, files a link lacks are removed, pg_wal and backup_label come from
the newest link; a corrupt INCREMENTAL file or links that do not follow each other stop it with exit 6, DIR untouched.
The same chain on real PostgreSQL 18, compared byte for byte with pg_combinebackup's result: scripts/e2e-incremental."""

from __future__ import annotations

import io
import json
import os
import struct
import tarfile
from pathlib import Path

import pytest

from braid.errors import IntegrityError
from braid.ops.pg_incremental import (
    BLCKSZ,
    MAGIC,
    ChainMismatchError,
    IncrementalFileError,
    check_link,
    header_length,
    parse_header,
    parse_label,
    strip_incremental_lines,
)
from conftest import run_braid

SYSID = 7441234567890123456
FULL_LABEL = b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nCHECKPOINT LOCATION: 0/2000060\nSTART TIMELINE: 1\n"


def _label(start: str, parent: str | None) -> bytes:
    text = f"START WAL LOCATION: {start} (file 000000010000000000000002)\nCHECKPOINT LOCATION: {start}\nBACKUP METHOD: streamed\nSTART TIMELINE: 1\n"
    if parent:
        text += f"INCREMENTAL FROM LSN: {parent}\nINCREMENTAL FROM TLI: 1\n"
    return text.encode()


def _block(tag: int) -> bytes:
    return bytes([tag]) * BLCKSZ


def incremental(blocks: dict[int, bytes], truncation: int) -> bytes:
    """An INCREMENTAL file as PostgreSQL 17+ writes it (header, numbers, padding to BLCKSZ when there are blocks, blocks)."""
    numbers = sorted(blocks)
    head = struct.pack(f"=III{len(numbers)}I", MAGIC, len(numbers), truncation, *numbers)
    head += b"\0" * (header_length(len(numbers)) - len(head))
    return head + b"".join(blocks[n] for n in numbers)


def _manifest(sysid: int = SYSID) -> bytes:
    return json.dumps({"PostgreSQL-Backup-Manifest-Version": 2, "System-Identifier": sysid, "Files": []}).encode()


def _tar(path: Path, members: list[tuple[str, bytes | None]]) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o700
                tar.addfile(info)
                continue
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return path


def _link(label: bytes, files: list[tuple[str, bytes]], wal: bytes, sysid: int = SYSID) -> list[tuple[str, bytes | None]]:
    control = struct.pack("=Q", sysid) + b"\0" * (BLCKSZ - 8)
    return [
        ("backup_label", label), ("global", None), ("global/pg_control", control), ("base", None), ("base/5", None),
        *files, ("pg_wal", None), ("pg_wal/000000010000000000000002", wal), ("backup_manifest", _manifest(sysid)),
    ]


def _chain(repo: Path, tmp_path: Path, links: list[list[tuple[str, bytes | None]]]) -> list[str]:
    refs = []
    for n, members in enumerate(links):
        tar = _tar(tmp_path / f"link{n}.tar", members)
        result = run_braid("backup", "--repo", str(repo), "--name", "pg", *(("--incremental",) if n else ()), "--", "cat", str(tar))
        assert result.code == 0, result.stderr
        refs.append(result.out.strip())
    return refs


def _good_links() -> list[list[tuple[str, bytes | None]]]:
    full = _link(FULL_LABEL, [
        ("base/5/16384", _block(1) + _block(2) + _block(3)),
        ("base/5/16385", _block(9)),  # dropped before the first incremental
        ("base/5/16386", _block(4) + _block(5)),
        ("base/5/16388_fsm", _block(30) + _block(31)),  # sent whole by every link, its size changing
        ("PG_VERSION", b"18\n"),
    ], b"w0" * 4096)
    first = _link(_label("0/4000028", "0/2000028"), [
        ("base/5/INCREMENTAL.16384", incremental({1: _block(11), 3: _block(13)}, truncation=2)),  # block 2 truncated away
        ("base/5/INCREMENTAL.16386", incremental({}, truncation=2)),  # unchanged
        ("base/5/16387", _block(7)),  # a new relation, sent whole
        ("base/5/16388_fsm", _block(32)),
        ("PG_VERSION", b"18\n"),
    ], b"w1" * 4096)
    second = _link(_label("0/6000028", "0/4000028"), [
        ("base/5/INCREMENTAL.16384", incremental({0: _block(20)}, truncation=4)),
        ("base/5/INCREMENTAL.16386", incremental({}, truncation=1)),  # truncated to one block
        ("base/5/INCREMENTAL.16387", incremental({2: _block(22)}, truncation=1)),
        ("base/5/16388_fsm", _block(33) + _block(34) + _block(35)),
        ("PG_VERSION", b"18\n"),
    ], b"w2" * 4096)
    return [full, first, second]


def test_in_place_applies_every_link_in_order(repo: Path, tmp_path: Path) -> None:
    refs = _chain(repo, tmp_path, _good_links())
    target = tmp_path / "data"
    result = run_braid("restore", "--repo", str(repo), refs[2], "--pgdata", str(target), "--pg-bin", str(tmp_path / "no-postgres-tools"))
    assert result.code == 0, result.stderr  # in-place is the default and needs no pg_combinebackup
    assert (target / "base/5/16384").read_bytes() == _block(20) + _block(11) + bytes(BLCKSZ) + _block(13)
    assert (target / "base/5/16386").read_bytes() == _block(4)
    assert (target / "base/5/16387").read_bytes() == _block(7) + bytes(BLCKSZ) + _block(22)
    assert (target / "base/5/16388_fsm").read_bytes() == _block(33) + _block(34) + _block(35)
    assert not (target / "base/5/16385").exists() and not list(target.rglob("INCREMENTAL.*"))
    assert (target / "pg_wal/000000010000000000000002").read_bytes() == b"w2" * 4096
    assert (target / "backup_label").read_bytes() == _label("0/6000028", None)  # without INCREMENTAL FROM, as pg_combinebackup
    assert not (target / "backup_manifest").exists() and (target / "recovery.signal").exists()
    assert not list(tmp_path.glob(".data.braid-chain-*"))
    middle = tmp_path / "middle"
    assert run_braid("restore", "--repo", str(repo), refs[1], "--pgdata", str(middle), "--rebuild", "in-place").code == 0
    assert (middle / "base/5/16384").read_bytes() == _block(1) + _block(11) + bytes(BLCKSZ) + _block(13)
    assert (middle / "pg_wal/000000010000000000000002").read_bytes() == b"w1" * 4096
    assert (middle / "base/5/16388_fsm").read_bytes() == _block(32)


@pytest.mark.parametrize("decoders", ["shared", "per-link"])
def test_link_decoders_policy_and_its_off_switch_rebuild_the_same_tree(repo: Path, tmp_path: Path, decoders: str) -> None:
    refs = _chain(repo, tmp_path, _good_links())
    target = tmp_path / "data"
    result = run_braid("restore", "--repo", str(repo), refs[2], "--pgdata", str(target), "--link-decoders", decoders)
    assert result.code == 0, result.stderr
    assert (target / "base/5/16384").read_bytes() == _block(20) + _block(11) + bytes(BLCKSZ) + _block(13)
    assert (target / "base/5/16387").read_bytes() == _block(7) + bytes(BLCKSZ) + _block(22)
    assert (target / "pg_wal/000000010000000000000002").read_bytes() == b"w2" * 4096
    result = run_braid("restore", "--repo", str(repo), refs[2], "--pgdata", str(tmp_path / "other"), "--link-decoders", "some")
    assert result.code == 2 and "invalid choice: 'some'" in result.stderr, result.stderr


def test_in_place_replaces_an_empty_existing_dir(repo: Path, tmp_path: Path) -> None:
    refs = _chain(repo, tmp_path, _good_links()[:2])
    target = tmp_path / "data"
    target.mkdir(mode=0o755)
    result = run_braid("restore", "--repo", str(repo), refs[1], "--pgdata", str(target))
    assert result.code == 0, result.stderr
    assert (target / "base/5/16387").read_bytes() == _block(7) and os.stat(target).st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (struct.pack("=III", 0xDEADBEEF, 0, 2), "has bad incremental magic number 0xdeadbeef (PostgreSQL writes 0xd3ae1f0d)"),
        (incremental({1: _block(11)}, truncation=2)[:-100], "is 16284 bytes, but its header (1 blocks) makes it 16384: truncated or corrupt"),
        (struct.pack("=II", MAGIC, 0), "is truncated: 8 bytes, shorter than the 12-byte header"),
        (struct.pack("=III", MAGIC, 0, 200000), "has truncation block length 200000, more than a segment's 131072 blocks"),
        (incremental({140000: _block(1)}, truncation=2), "names block 140000, past a segment's 131072 blocks"),
    ],
)
def test_a_corrupt_incremental_file_is_exit_6_and_writes_nothing(repo: Path, tmp_path: Path, content: bytes, message: str) -> None:
    links = _good_links()[:2]
    links[1] = [(name, content if name == "base/5/INCREMENTAL.16384" else data) for name, data in links[1]]
    refs = _chain(repo, tmp_path, links)
    target = tmp_path / "data"
    result = run_braid("restore", "--repo", str(repo), refs[1], "--pgdata", str(target))
    assert result.code == 6, result.stderr
    assert f"base/5/INCREMENTAL.16384 of link 1 ({refs[1]}) {message}" in result.stderr
    assert not target.exists() and not list(tmp_path.glob(".data.braid-chain-*"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("lsn", "was taken from LSN 0/3000028, but its parent starts at 0/2000028: not built on that backup"),
        ("sysid", "its global/pg_control names system identifier 42, but the chain's full has 7441234567890123456: another cluster"),
        ("full", "is a full backup (its backup_label has no INCREMENTAL FROM LSN), but only the first link should be"),
        ("missing", "changes a file its parent does not have"),
    ],
)
def test_links_that_do_not_follow_each_other_are_exit_6(repo: Path, tmp_path: Path, change: str, message: str) -> None:
    links = _good_links()[:2]
    files: list[tuple[str, bytes]] = [("base/5/INCREMENTAL.16384", incremental({1: _block(11)}, truncation=2))]
    label = _label("0/4000028", "0/3000028" if change == "lsn" else "0/2000028")
    if change == "full":
        label = _label("0/4000028", None)
    if change == "missing":
        files = [("base/5/INCREMENTAL.99999", incremental({}, truncation=1))]
    links[1] = _link(label, files, b"w1", sysid=42 if change == "sysid" else SYSID)
    refs = _chain(repo, tmp_path, links)
    target = tmp_path / "data"
    target.mkdir()
    result = run_braid("restore", "--repo", str(repo), refs[1], "--pgdata", str(target))
    assert result.code == 6, result.stderr
    assert message in result.stderr and f"link 1 ({refs[1]})" in result.stderr
    assert list(target.iterdir()) == [] and not list(tmp_path.glob(".data.braid-chain-*"))


def test_the_off_switch_runs_pg_combinebackup(repo: Path, tmp_path: Path) -> None:
    refs = _chain(repo, tmp_path, _good_links()[:2])
    target = tmp_path / "data"
    result = run_braid("restore", "--repo", str(repo), refs[1], "--pgdata", str(target), "--rebuild", "pg_combinebackup", "--pg-bin", str(tmp_path / "none"))
    assert result.code == 2 and "pg_combinebackup was not found in --pg-bin" in result.stderr, result.stderr
    result = run_braid("restore", "--repo", str(repo), refs[1], "--pgdata", str(target), "--rebuild", "sideways")
    assert result.code == 2 and "invalid choice: 'sideways'" in result.stderr, result.stderr
    assert not target.exists()


def test_in_place_needs_the_work_dir_on_dirs_file_system(repo: Path, tmp_path: Path) -> None:
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system to put the work directory on")
    refs = _chain(repo, tmp_path, _good_links()[:2])
    work = other / f"braid-test-work-{os.getpid()}-{tmp_path.name}"
    result = run_braid("restore", "--repo", str(repo), refs[1], "--pgdata", str(tmp_path / "data"), "--rebuild", "in-place", "--work-dir", str(work))
    assert result.code == 2 and "--rebuild in-place builds the data directory in --work-dir" in result.stderr, result.stderr
    assert not work.exists() and not (tmp_path / "data").exists()


def test_parse_header_reads_postgresqls_layout() -> None:
    data = incremental({7: _block(1), 3: _block(2)}, truncation=5)
    header = parse_header(data, "f", len(data))
    assert header.blocks == (3, 7) and header.truncation_block_length == 5 and header.length == BLCKSZ and header.block_length == 8
    empty = incremental({}, truncation=9)
    assert len(empty) == 12 and parse_header(empty, "f", 12).block_length == 9
    with pytest.raises(IncrementalFileError, match="f is truncated inside its header"):
        parse_header(data[:14], "f", len(data))
    assert issubclass(IncrementalFileError, IntegrityError) and IncrementalFileError.exit_code == 6


def test_labels_chain_as_pg_combinebackup_checks() -> None:
    full, inc = parse_label(FULL_LABEL, "full"), parse_label(_label("0/4000028", "0/2000028"), "inc")
    check_link(0, full, None, "full")
    check_link(1, inc, full, "inc")
    with pytest.raises(ChainMismatchError, match="a chain starts with a full"):
        check_link(0, inc, None, "inc")
    with pytest.raises(ChainMismatchError, match="without the other"):
        parse_label(FULL_LABEL + b"INCREMENTAL FROM LSN: 0/1\n", "x")
    with pytest.raises(ChainMismatchError, match="no START TIMELINE"):
        parse_label(b"START WAL LOCATION: 0/1 (file x)\n", "x")
    assert strip_incremental_lines(inc.text) == _label("0/4000028", None)


@pytest.mark.parametrize("bad", [1, 2])
def test_a_corrupt_link_in_a_longer_chain_stops_every_link(repo: Path, tmp_path: Path, bad: int) -> None:
    links = _good_links()  # links are read two at a time: a failure before or after the one being applied stops both
    links[bad] = [(name, b"\0" * 12 if name == "base/5/INCREMENTAL.16384" else data) for name, data in links[bad]]
    refs = _chain(repo, tmp_path, links)
    target = tmp_path / "data"
    result = run_braid("restore", "--repo", str(repo), refs[2], "--pgdata", str(target))
    assert result.code == 6, result.stderr
    assert f"base/5/INCREMENTAL.16384 of link {bad} ({refs[bad]}) has bad incremental magic number 0x0" in result.stderr
    assert not target.exists() and not list(tmp_path.glob(".data.braid-chain-*"))
