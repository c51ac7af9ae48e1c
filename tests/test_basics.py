"""Sizes, backup references, the repository layout, timestamps, and the local key file."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from braid.adapters.local.keys import LocalKeyFile
from braid.cli.sizes import DEFAULT_CHUNK_DIRECTORY, DEFAULT_CHUNK_S3, default_chunk_size, format_size, parse_size
from braid.errors import KeyAccessError, UsageError
from braid.format.ids import BackupRef
from braid.format.keys import canonical_context, encryption_context
from braid.format.layout import DATA, STAGING, chunk_key, data_prefix, manifest_key, ref_from_manifest_key, ref_under, staging_prefix
from braid.format.timestamps import format_timestamp, parse_timestamp, utc_now
from conftest import run_braid


@pytest.mark.parametrize(
    "text,expected", [("64MiB", 64 << 20), ("8M", 8 << 20), ("1g", 1 << 30), ("4096", 4096), ("5MB", 5_000_000), ("1.5KiB", 1536)]
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "12 parsecs", "-1M", "1.3B"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_size(text)


def test_format_size() -> None:
    assert format_size(512) == "512 B" and format_size(64 << 20) == "64 MiB"


def test_backup_ref_round_trip_and_order() -> None:
    a = BackupRef.new("db2.prod")
    assert BackupRef.parse(str(a)) == a
    assert BackupRef.parse("db@latest").is_latest


def test_backup_id_records_its_start_to_the_millisecond() -> None:
    moment = datetime(2026, 11, 23, 1, 2, 3, 456789, tzinfo=UTC)
    ref = BackupRef.new("db", moment)
    assert ref.id.startswith("20261123T010203.456Z-") and ref.started == moment.replace(microsecond=456000)
    with pytest.raises(UsageError):
        _ = BackupRef.parse("db@latest").started


@pytest.mark.parametrize("text", ["db", "db@", "@20261123T010203.000Z-0a1b2c3d", "db/x@latest", "db@2026", "db@20261123T010203Z-0a1b2c3d", "-db@latest"])
def test_backup_ref_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        BackupRef.parse(text)


def test_layout_builds_and_parses_every_backup_key() -> None:
    ref = BackupRef.parse("db.prod@20261123T010203.456Z-0a1b2c3d")
    assert manifest_key(ref) == "manifests/db.prod/20261123T010203.456Z-0a1b2c3d.json"
    assert chunk_key(ref, 7) == "data/db.prod/20261123T010203.456Z-0a1b2c3d/0000000007"
    assert chunk_key(ref, 7).startswith(data_prefix(ref)) and staging_prefix(ref) == "staging/db.prod/20261123T010203.456Z-0a1b2c3d/"
    assert ref_from_manifest_key(manifest_key(ref)) == ref
    assert ref_under(DATA, chunk_key(ref, 7)) == ref and ref_under(STAGING, staging_prefix(ref) + "in0/seg0") == ref
    for key in ("manifests/db/latest.json", "manifests/db.json", "manifests/a/b/c.json", "data/db/x/0000000001"):
        assert ref_from_manifest_key(key) is None and ref_under(DATA, key) is None
    assert ref_under(STAGING, chunk_key(ref, 7)) is None and ref_under("manifests/", manifest_key(ref)) is None


def test_one_timestamp_form_round_trips_and_sorts_by_time() -> None:
    moment = datetime(2026, 11, 23, 1, 2, 3, 456789, tzinfo=UTC)
    assert format_timestamp(moment) == "2026-11-23T01:02:03.456789Z" == format_timestamp(moment.astimezone(timezone(timedelta(hours=5))))
    assert parse_timestamp("2026-11-23T01:02:03.456789Z") == moment
    assert parse_timestamp(utc_now()) <= datetime.now(UTC)
    with pytest.raises(ValueError):
        parse_timestamp("2026-11-23T01:02:03+00:00")


def test_encryption_context_bytes_are_the_documented_ones() -> None:
    # The local key file's AES-GCM associated data (docs/format.md, Keys).
    context = encryption_context("5f0c3c1e-7d2a-4a5e-9b1e-0c1d2e3f4a5b", "db@20261123T010203.000Z-0a1b2c3d")
    assert canonical_context(context) == b'{"braid:backup":"db@20261123T010203.000Z-0a1b2c3d","braid:repository":"5f0c3c1e-7d2a-4a5e-9b1e-0c1d2e3f4a5b"}'


def test_key_file_created_0600_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "k.key"
    keys = LocalKeyFile.create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    before = path.read_bytes()
    with pytest.raises(KeyAccessError, match="refusing to overwrite"):
        LocalKeyFile.create(path)
    assert path.read_bytes() == before
    assert LocalKeyFile.open(path).key_id == keys.key_id


def test_key_file_errors(tmp_path: Path) -> None:
    with pytest.raises(KeyAccessError, match="not found"):
        LocalKeyFile.open(tmp_path / "missing.key")
    bad = tmp_path / "bad.key"
    bad.write_text("{}")
    with pytest.raises(KeyAccessError, match="not a valid Braid master key"):
        LocalKeyFile.open(bad)


def test_wrapped_key_bound_to_context_and_key(tmp_path: Path) -> None:
    keys = LocalKeyFile.create(tmp_path / "a.key")
    data_key, wrapped = keys.generate_data_key(encryption_context("r", "db@20261123T010203.000Z-0a1b2c3d"))
    assert keys.unwrap(wrapped).fingerprint == data_key.fingerprint
    from dataclasses import replace

    moved = replace(wrapped, context=encryption_context("r", "db@20261123T010203.000Z-ffffffff"))
    with pytest.raises(KeyAccessError, match="does not unwrap"):
        keys.unwrap(moved)
    other = LocalKeyFile.create(tmp_path / "b.key")
    with pytest.raises(KeyAccessError, match="wrong key file"):
        other.unwrap(wrapped)


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-23T01:02:03Z",  # no microseconds
        "2026-11-23T01:02:03.456Z",  # milliseconds only
        "2026-11-23T01:02:03.000000",  # no Z
        "2026-11-23 01:02:03.000000Z",
        "2026-13-23T01:02:03.000000Z",  # month 13
        "2026-02-30T01:02:03.000000Z",  # 30 February
        "2026-11-23T01:02:03.000000Z\n",
        "\u0662\u0660\u0662\u0666-11-23T01:02:03.000000Z",  # Arabic-Indic digits
    ],
)
def test_a_timestamp_has_one_form(text: str) -> None:
    with pytest.raises(ValueError):
        parse_timestamp(text)


def test_timestamps_and_ids_round_trip_to_the_microsecond_and_millisecond() -> None:
    moment = datetime(2026, 11, 23, 1, 2, 3, 456789, tzinfo=UTC)
    assert parse_timestamp(format_timestamp(moment)) == moment
    assert parse_timestamp("2026-11-23T01:02:03.456789Z") == moment
    ref = BackupRef.new("pg", moment)
    assert ref.started == moment.replace(microsecond=456000)
    with pytest.raises(UsageError, match="invalid backup id"):
        BackupRef.parse("pg@\u0662\u0660\u0662\u066611\u06623T010203.456Z-1a2b3c4d")


def test_chunk_size_default_follows_where_chunks_are_stored(repo: Path) -> None:
    """16 MiB chunks in a directory (small streams are not start-up bound), 64 MiB on S3 (a request per chunk)."""
    assert default_chunk_size(str(repo)) == DEFAULT_CHUNK_DIRECTORY == 16 * 2**20
    assert default_chunk_size("s3://bucket/prefix") == DEFAULT_CHUNK_S3 == 64 * 2**20
    stream = os.urandom(40 * 2**20)
    for extra, size, chunks in (((), 16 * 2**20, 3), (("--chunk-size", "8MiB"), 8 * 2**20, 5)):
        made = run_braid("backup", "--repo", str(repo), "--name", "db", *extra, stdin=stream)
        assert made.code == 0, made.stderr
        shown = json.loads(run_braid("show", "--repo", str(repo), made.stdout.decode().strip(), "--json").stdout)
        assert (shown["chunk_size"], shown["chunks"]) == (size, chunks)


def test_read_full_fills_through_short_reads_and_stops_at_the_end() -> None:
    """Pipes and files may return fewer bytes than asked: a chunk is filled by repeated reads, never cut short."""
    import io

    from braid.format.buffers import read_full

    class Trickle(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self.data, self.pos = data, 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            n = min(3, len(buffer), len(self.data) - self.pos)  # at most 3 bytes a call
            buffer[:n] = self.data[self.pos : self.pos + n]
            self.pos += n
            return n

    view = memoryview(bytearray(10))
    assert read_full(Trickle(b"0123456789abc"), view) == 10 and bytes(view) == b"0123456789"
    short = memoryview(bytearray(10))
    assert read_full(Trickle(b"01234"), short) == 5 and bytes(short[:5]) == b"01234"
