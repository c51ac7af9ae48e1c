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


# -- the in-place rebuild against reconstruct.c ------------------------------------------------------------------------
# What pg_combinebackup makes of one relation file of a chain, transcribed from PostgreSQL 18's
# src/bin/pg_combinebackup/reconstruct.c (reconstruct_from_incremental_file, find_reconstructed_block_length,
# write_reconstructed_file). A link's version of the file is ("full", bytes) or ("inc", {block: bytes}, truncation).


Version = tuple[str, bytes] | tuple[str, dict[int, bytes], int]


def _reconstruct(versions: list[Version]) -> bytes:
    newest = versions[-1]
    if newest[0] == "full":
        return newest[1]  # a file the newest backup holds whole is copied
    _, latest, truncation = newest
    length = max([truncation, *(b + 1 for b in latest)])  # find_reconstructed_block_length
    source: dict[int, bytes] = dict(latest)  # every block of the newest incremental file
    for older in reversed(versions[:-1]):  # then back through the older links, newest first
        if older[0] == "full":  # a full file: every block below the newest's truncation length it has; then stop
            data = older[1]
            for b in range(truncation):
                if b not in source and b < len(data) // BLCKSZ:
                    source[b] = data[b * BLCKSZ:(b + 1) * BLCKSZ]
            break
        for b, block in older[1].items():  # an incremental file: the blocks still needed below the NEWEST's truncation length
            if b < truncation and b not in source:
                source[b] = block
    return b"".join(source.get(b, bytes(BLCKSZ)) for b in range(length))  # a block no link has: zeros


def _looks_past_a_truncation(versions: list[Version], b: int) -> bool:
    """The documented difference: block `b` is below the newest link's truncation length and not in it, and walking back
    from the newest, a link whose truncation length dropped `b` (and that lacks it) comes before any link that has it."""
    newest = versions[-1]
    if newest[0] == "full" or b in newest[1] or b >= newest[2]:
        return False
    for older in reversed(versions[:-1]):
        if older[0] == "full":
            return False
        if b in older[1]:
            return False
        if b >= older[2]:
            return True
    return False


def _tar_bytes(members: list[tuple[str, bytes | None]], tmp_path: Path, n: int) -> bytes:
    return _tar(tmp_path / f"inproc{n}.tar", members).read_bytes()


def _members(version: Version) -> tuple[str, bytes]:
    if version[0] == "full":
        return ("base/5/16400", version[1])
    return ("base/5/INCREMENTAL.16400", incremental(version[1], truncation=version[2]))


def _chain_links(versions: list[Version]) -> list[list[tuple[str, bytes | None]]]:
    labels = [FULL_LABEL] + [_label(f"0/{2 * n + 4:X}000028", f"0/{2 * n + 2:X}000028") for n in range(len(versions) - 1)]
    return [_link(label, [_members(v)], b"w") for label, v in zip(labels, versions, strict=True)]


def _apply_in_place(tmp_path: Path, versions: list[Version]) -> bytes:
    """The file as braid.ops.pg_apply rebuilds it: each link's tar applied, oldest first, onto one tree (in process)."""
    from braid.ops.pg_apply import ApplyTarget, ChainState

    tree = tmp_path / "tree"
    state = ChainState(len(versions))
    for position, members in enumerate(_chain_links(versions)):
        output = ApplyTarget(f"link {position}", str(tree), position=position, backup=f"pg@{position}", state=state, writers=1).open()
        assert output is not None
        output.write(memoryview(_tar_bytes(members, tmp_path, position)))
        output.finish()
    data = (tree / "base/5/16400").read_bytes()
    for path in sorted(tree.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    tree.rmdir()
    return data


def _blocks(data: bytes) -> list[bytes]:
    return [data[i:i + BLCKSZ] for i in range(0, len(data), BLCKSZ)]


def test_in_place_zeroes_a_block_pg_combinebackup_looks_back_for_past_a_truncation(repo: Path, tmp_path: Path) -> None:
    """docs/design/incremental-chains.md: a block below the newest link's truncation length that the newest links lack.
    pg_combinebackup takes it from an older link, also past a link whose truncation length dropped it; applied in order
    it is zero (what the server's file held: the block came back after that truncation, and no WAL wrote it since)."""
    full = ("full", _block(1) + _block(2) + _block(3) + _block(4))
    changed = ("inc", {2: _block(12)}, 4)  # block 2 changed
    truncated = ("inc", {}, 2)  # the relation truncated to 2 blocks: blocks 2 and 3 gone
    regrown = ("inc", {0: _block(20)}, 4)  # 4 blocks again; blocks 2 and 3 not WAL-logged since: never written
    versions: list[Version] = [full, changed, truncated, regrown]
    links = _chain_links(versions)
    refs = _chain(repo, tmp_path, links)
    target = tmp_path / "data"
    result = run_braid("restore", "--repo", str(repo), refs[-1], "--pgdata", str(target))
    assert result.code == 0, result.stderr
    rebuilt = (target / "base/5/16400").read_bytes()
    assert _blocks(rebuilt) == [_block(20), _block(2), bytes(BLCKSZ), bytes(BLCKSZ)]
    # pg_combinebackup's: block 2 from the first incremental, block 3 from the full, each past the truncation
    assert _blocks(_reconstruct(versions)) == [_block(20), _block(2), _block(12), _block(4)]
    assert [b for b in range(4) if _looks_past_a_truncation(versions, b)] == [2, 3]
    # Every link before it rebuilds as pg_combinebackup would: the difference needs a truncation between two links.
    for n in range(1, 3):
        middle = tmp_path / f"middle{n}"
        assert run_braid("restore", "--repo", str(repo), refs[n], "--pgdata", str(middle)).code == 0
        assert (middle / "base/5/16400").read_bytes() == _reconstruct(versions[:n + 1])
    assert _apply_in_place(tmp_path, versions) == rebuilt  # the in-process rebuild below is the CLI's


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        # a block in the newest link: the newest link's, whatever the older links hold
        ([("full", _block(1) + _block(2)), ("inc", {1: _block(11)}, 2), ("inc", {1: _block(21)}, 2)], [_block(1), _block(21)]),
        # a block only in the full, no truncation in between (the truncation lengths only grow): the full's
        ([("full", _block(1) + _block(2)), ("inc", {0: _block(10)}, 2), ("inc", {2: _block(22)}, 3)], [_block(10), _block(2), _block(22)]),
        # a block in an older incremental, no truncation in between: that link's
        ([("full", _block(1) + _block(2)), ("inc", {1: _block(11)}, 2), ("inc", {}, 2)], [_block(1), _block(11)]),
        # past the newest link's truncation length, below one of its blocks: zero, though older links have it
        ([("full", _block(1) + _block(2) + _block(3)), ("inc", {1: _block(11)}, 3), ("inc", {2: _block(22)}, 1)], [_block(1), bytes(BLCKSZ), _block(22)]),
        # a file an intermediate link sent whole (a new relation of that number): nothing older is looked at
        ([("full", _block(1) + _block(2)), ("full", _block(5)), ("inc", {}, 2)], [_block(5), bytes(BLCKSZ)]),
        # truncated by the newest link itself: cut, nothing looked up past it
        ([("full", _block(1) + _block(2) + _block(3)), ("inc", {2: _block(12)}, 3), ("inc", {}, 1)], [_block(1)]),
    ],
    ids=["in-the-newest", "only-in-the-full", "in-an-older-link", "past-the-newest-truncation", "sent-whole-between", "newest-truncates"],
)
def test_in_place_matches_reconstruct_c_in_every_other_case(tmp_path: Path, versions: list[Version], expected: list[bytes]) -> None:
    assert _blocks(_reconstruct(versions)) == expected  # the transcription, on cases read off reconstruct.c by hand
    assert not any(_looks_past_a_truncation(versions, b) for b in range(len(expected)))
    assert _blocks(_apply_in_place(tmp_path, versions)) == expected


def test_in_place_differs_from_reconstruct_c_only_past_a_truncation_in_between(tmp_path: Path) -> None:
    """Random chains of one relation file (a full, then 1 to 4 links, each an INCREMENTAL file of random blocks and
    truncation length, sometimes the file whole): every block equals pg_combinebackup's, but for the documented
    corner, where it is zero; the file's length always equals."""
    import random

    rng = random.Random(24)
    corners = 0
    for _ in range(150):
        versions: list[Version] = [("full", b"".join(_block(rng.randrange(1, 200)) for _ in range(rng.randrange(1, 6))))]
        for _ in range(rng.randrange(1, 5)):
            if rng.random() < 0.1:
                versions.append(("full", b"".join(_block(rng.randrange(1, 200)) for _ in range(rng.randrange(1, 6)))))
                continue
            blocks = {b: _block(rng.randrange(1, 200)) for b in rng.sample(range(7), rng.randrange(0, 4))}
            versions.append(("inc", blocks, rng.randrange(0, 7)))
        ours, theirs = _blocks(_apply_in_place(tmp_path, versions)), _blocks(_reconstruct(versions))
        assert len(ours) == len(theirs), versions
        for b, (mine, pg) in enumerate(zip(ours, theirs, strict=True)):
            if _looks_past_a_truncation(versions, b):
                assert mine == bytes(BLCKSZ), (versions, b)
                corners += pg != mine
            else:
                assert mine == pg, (versions, b)
    assert corners > 10  # the corner was met, and there it differed
