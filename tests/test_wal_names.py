"""WAL file names, LSNs and the archive layout (braid.format.wal), and which ranges are whole (braid.ops.wal)."""

from __future__ import annotations

from pathlib import Path

import pytest

from braid.adapters.local.store import LocalStore
from braid.errors import IntegrityError, UsageError
from braid.format.layout import wal_file_of_key, wal_key
from braid.format.wal import BACKUP, HISTORY, PARTIAL, SEGMENT, WalFile, format_lsn, parse_lsn, segment_before, segment_name, segment_of
from braid.ops.wal import ArchiveInfo, read_archive_info, record_archive_info, wal_range_present

MIB = 1024 * 1024


def test_lsn_text_round_trips_as_postgresql_spells_it() -> None:
    assert parse_lsn("0/3000028") == 0x3000028
    assert parse_lsn("1A/FF") == (0x1A << 32) | 0xFF
    assert format_lsn(parse_lsn("16/B374D848")) == "16/B374D848"
    assert parse_lsn(42) == 42
    for bad in ("3000028", "0/", "x/1", "0/123456789", "-1/0"):
        with pytest.raises(UsageError, match="invalid LSN"):
            parse_lsn(bad)


def test_segment_names_match_postgresql_at_16_mib_and_other_sizes() -> None:
    # pg_walfile_name('0/3000028') on timeline 1 with 16 MiB segments
    assert segment_name(1, segment_of(0x3000028)) == "000000010000000000000003"
    # 4 GiB of WAL is 256 segments: segment 256 is the next "log"
    assert segment_name(2, 0x100) == "000000020000000100000000"
    assert segment_name(1, segment_of(parse_lsn("1/FF000000"))) == "0000000100000001000000FF"
    # 64 MiB segments: 64 per 4 GiB
    assert segment_name(1, segment_of(parse_lsn("1/4000000"), 64 * MIB), 64 * MIB) == "000000010000000100000001"
    with pytest.raises(UsageError, match="power of two"):
        segment_name(1, 0, 3 * MIB)


def test_a_stop_on_a_segment_boundary_needs_nothing_of_the_next_segment() -> None:
    assert segment_before(parse_lsn("0/4000000")) == 3
    assert segment_before(parse_lsn("0/4000001")) == 4


def test_file_kinds_and_their_keys() -> None:
    cases = {
        "000000010000000000000003": (SEGMENT, 1, "000000010000000000000003", "wal/pg/0000000100000000/000000010000000000000003"),
        "000000020000000000000003.partial": (PARTIAL, 2, "000000020000000000000003", "wal/pg/0000000200000000/000000020000000000000003.partial"),
        "000000010000000000000002.00000028.backup": (BACKUP, 1, "000000010000000000000002", "wal/pg/0000000100000000/000000010000000000000002.00000028.backup"),
        "00000002.history": (HISTORY, 2, None, "wal/pg/history/00000002.history"),
    }
    for name, (kind, timeline, segment, key) in cases.items():
        file = WalFile.parse(name)
        assert (file.kind, file.timeline, file.segment) == (kind, timeline, segment)
        assert wal_key("pg", file) == key
        assert wal_file_of_key("pg", key) == file
    assert WalFile.parse("0000000100000001000000FF").segno() == 0x1FF
    for bad in ("00000001000000000000000", "000000010000000000000003.gz", "00000000.history", "000000000000000000000001", "../x", "0000000100000000000000ab"):
        with pytest.raises(UsageError, match="not a WAL file name"):
            WalFile.parse(bad)
    # a key in the wrong directory, or not a WAL file, is no archived file
    assert wal_file_of_key("pg", "wal/pg/0000000100000001/000000010000000000000003") is None
    assert wal_file_of_key("pg", "wal/pg/archive.json") is None


def _archive(store: LocalStore, *names: str) -> None:
    for name in names:
        store.put(wal_key("pg", WalFile.parse(name)), b"x")


def test_wal_range_present_names_every_missing_segment_in_order(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    _archive(store, "000000010000000000000002", "000000010000000000000004", "000000010000000000000005.partial", "000000020000000000000003")
    # 0/2000028 .. 0/5000100 needs segments 2, 3, 4, 5 on timeline 1: 3 is only on timeline 2, 5 only partial
    assert wal_range_present(store, "pg", 1, "0/2000028", "0/5000100") == ["000000010000000000000003", "000000010000000000000005"]
    assert wal_range_present(store, "pg", 1, "0/2000028", "0/2000100") == []
    assert wal_range_present(store, "pg", 1, "0/2000028", "0/3000000") == []  # the stop is the first byte of segment 3
    assert wal_range_present(store, "pg", 2, 0x3000000, 0x3FFFFFF) == []
    assert wal_range_present(store, "other", 1, "0/0", "0/1") == ["000000010000000000000000"]


def test_wal_range_present_reads_the_recorded_segment_size(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    record_archive_info(store, ArchiveInfo("pg", 7, 64 * MIB))
    _archive(store, "000000010000000000000001")  # 64 MiB segment 1: 0/4000000 .. 0/7FFFFFF
    assert wal_range_present(store, "pg", 1, "0/4000028", "0/7000000") == []
    assert wal_range_present(store, "pg", 1, "0/4000028", "0/8000001") == ["000000010000000000000002"]


def test_archive_info_is_create_only_and_checked(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert read_archive_info(store, "pg") is None
    first = record_archive_info(store, ArchiveInfo("pg", 7, 16 * MIB))
    assert record_archive_info(store, ArchiveInfo("pg", 8, 16 * MIB)) == first  # the first one stays
    assert read_archive_info(store, "pg") == first
    store.put("wal/pg/archive.json", b'{"format": "braid-wal-archive", "version": 1, "name": "pg", "system_identifier": "7", "segment_size": 5}')
    with pytest.raises(IntegrityError, match="not a valid WAL archive record"):
        read_archive_info(store, "pg")
