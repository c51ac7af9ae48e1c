"""The push tar parser (braid.format.tar_stream) and the stream capture built on it (braid.engine.capture).

Archives are written by the stdlib's tarfile in ustar, GNU and pax forms and
fed in pieces of awkward sizes (1 byte, 511, 513, a prime), so headers,
extended records and member data all straddle piece boundaries.
"""

from __future__ import annotations

import io
import random
import tarfile

import pytest

from braid.engine.capture import CAPTURED, StreamCapture, merge_captures
from braid.format.pg_backup import format_lsn, parse_backup_label, parse_lsn, wal_file_name
from braid.format.tar_stream import TarFormatError, TarMember, TarStream, looks_like_tar

LABEL = (
    b"START WAL LOCATION: 0/9000028 (file 000000010000000000000009)\n"
    b"CHECKPOINT LOCATION: 0/9000060\nBACKUP METHOD: streamed\nBACKUP FROM: primary\n"
    b"START TIME: 2026-11-28 08:12:41 UTC\nLABEL: nightly\nSTART TIMELINE: 1\n"
)
PG_MANIFEST = b'{ "PostgreSQL-Backup-Manifest-Version": 1,\n"Files": [],\n"WAL-Ranges": [\n{ "Timeline": 1, "Start-LSN": "0/9000028", "End-LSN": "0/A000000" }\n]}'
CONTROL = (7441122334455667788).to_bytes(8, "little") + (1300).to_bytes(4, "little") + bytes(8180)


def make_tar(members: list[tuple[str, bytes]], fmt: int = tarfile.USTAR_FORMAT, dirs: tuple[str, ...] = ()) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as archive:
        for name in dirs:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o700
            archive.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o600
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


class Collect:
    def __init__(self) -> None:
        self.members: list[TarMember] = []
        self.data: dict[str, bytearray] = {}
        self.closed: list[str] = []

    def open(self, member: TarMember) -> Collect.File:
        self.members.append(member)
        self.data[member.name] = bytearray()
        return Collect.File(self, member.name)

    class File:
        def __init__(self, owner: Collect, name: str) -> None:
            self.owner, self.name = owner, name

        def write(self, data: memoryview) -> None:
            self.owner.data[self.name] += data

        def close(self) -> None:
            self.owner.closed.append(self.name)


def feed(raw: bytes, sizes: list[int], consumer: object) -> None:
    for start, size in pieces(len(raw), sizes):
        consumer.feed(memoryview(raw)[start : start + size])  # type: ignore[attr-defined]


def pieces(total: int, sizes: list[int]) -> list[tuple[int, int]]:
    out, pos, i = [], 0, 0
    while pos < total:
        size = sizes[i % len(sizes)]
        out.append((pos, min(size, total - pos)))
        pos += size
        i += 1
    return out


LONG = "base/" + "/".join(["a-rather-long-directory-name"] * 6) + "/16384_vm"  # over 100 and 155 bytes: needs pax or GNU


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("sizes", [[1], [511, 513], [7919], [1 << 20]])
def test_members_and_bytes_survive_any_piece_boundaries(fmt: int, sizes: list[int]) -> None:
    rng = random.Random(fmt * 31 + sizes[0])
    members = [("backup_label", LABEL), ("empty", b""), ("base/1/1259", rng.randbytes(20_000)), ("exact", rng.randbytes(1024))]
    if fmt != tarfile.USTAR_FORMAT:
        members.append((LONG, rng.randbytes(777)))
    else:
        members.append(("prefix/" * 20 + "x", b"ustar prefix field"))  # 140 bytes: name + prefix
    raw = make_tar(members, fmt, dirs=("base", "pg_wal"))
    got = Collect()
    parser = TarStream(got.open)
    feed(raw, sizes, parser)
    parser.end()
    assert parser.ended
    regular = [m for m in got.members if m.kind == "0"]
    assert [(m.name, m.size) for m in regular] == [(n, len(d)) for n, d in members]
    assert {n: bytes(got.data[n]) for n, _ in members} == dict(members)
    assert got.closed[-len(members) :] == [n for n, _ in members]
    assert [m.name.rstrip("/") for m in got.members if m.kind == "5"] == ["base", "pg_wal"]


def test_pax_size_and_path_override_the_header() -> None:
    raw = make_tar([(LONG, b"x" * 3000)], tarfile.PAX_FORMAT)
    got = Collect()
    parser = TarStream(got.open)
    feed(raw, [100], parser)
    parser.end()
    assert got.members[0].name == LONG and bytes(got.data[LONG]) == b"x" * 3000


def test_a_truncated_archive_and_a_corrupt_header_are_refused() -> None:
    raw = make_tar([("a", b"1" * 5000)])
    parser = TarStream(Collect().open)
    parser.feed(raw[:3000])
    with pytest.raises(TarFormatError, match="ends inside a member"):
        parser.end()
    bad = bytearray(raw)
    bad[10] ^= 0xFF  # inside the first header's name
    with pytest.raises(TarFormatError, match="bad tar header checksum"):
        TarStream(Collect().open).feed(bytes(bad))


def test_only_tar_streams_are_recognised() -> None:
    assert looks_like_tar(make_tar([("a", b"1")])[:512])
    assert not looks_like_tar(b"-- PostgreSQL database dump\n" + bytes(600))
    assert not looks_like_tar(bytes(1024))


def pg_stream() -> bytes:
    return make_tar(
        [("backup_label", LABEL), ("PG_VERSION", b"15\n"), ("global/pg_control", CONTROL), ("base/1/1", bytes(70_000)), ("backup_manifest", PG_MANIFEST)],
        dirs=("base", "global"),
    )


@pytest.mark.parametrize("sizes", [[1], [512], [333, 4096], [1 << 22]])
def test_capture_reads_a_base_backups_wal_position_at_any_boundaries(sizes: list[int]) -> None:
    capture = StreamCapture("stdin")
    feed(pg_stream(), sizes, capture)
    capture.end()
    result = merge_captures({0: capture})
    assert result.notes == []
    assert result.backup_manifest == PG_MANIFEST
    assert result.wal is not None
    assert result.wal.to_json() == {
        "start_lsn": "0/9000028",
        "stop_lsn": "0/A000000",
        "timeline": 1,
        "system_identifier": 7441122334455667788,
        "pg_version": 15,
        "start_wal": "000000010000000000000009",
        "stop_wal": "000000010000000000000009",  # the end is on a segment boundary: only the segment before is needed
        "checkpoint_lsn": "0/9000060",
        "label": "nightly",
        "start_time": "2026-11-28 08:12:41 UTC",
    }


def test_capture_of_other_streams_records_nothing_and_never_fails() -> None:
    plain = StreamCapture("dump.sql")
    plain.feed(memoryview(b"-- PostgreSQL database dump\n" * 100))
    plain.end()
    tar_without_label = StreamCapture("files.tar")
    tar_without_label.feed(memoryview(make_tar([("PG_VERSION", b"15\n")])))
    tar_without_label.end()
    truncated = StreamCapture("cut.tar")
    truncated.feed(memoryview(pg_stream()[:2000]))
    truncated.end()
    result = merge_captures({0: plain, 1: tar_without_label, 2: truncated})
    assert result.wal is None and result.backup_manifest is None
    assert [n for n in result.notes] == [truncated.note] and "cut.tar" in str(truncated.note)


def test_capture_holds_bounded_memory_and_skips_an_oversized_member(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(CAPTURED, "backup_manifest", 100)
    capture = StreamCapture("stdin")
    feed(pg_stream(), [4096], capture)
    capture.end()
    assert "backup_manifest" not in capture.members and "larger than 100 bytes" in str(capture.note)
    result = merge_captures({0: capture})
    assert result.wal is not None and result.wal.start_lsn == parse_lsn("0/9000028") and result.wal.stop_lsn is None


def test_lsn_and_segment_names() -> None:
    assert format_lsn(parse_lsn("16/B374D848")) == "16/B374D848"
    assert wal_file_name(2, parse_lsn("16/B374D848")) == "0000000200000016000000B3"
    assert wal_file_name(1, parse_lsn("0/2000028"), 1 << 30) == "000000010000000000000000"
    with pytest.raises(ValueError):
        parse_lsn("12345")
    assert parse_backup_label("START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\n")["start_wal"] == "000000010000000000000002"
