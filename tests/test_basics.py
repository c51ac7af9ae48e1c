"""Sizes, backup references, and the local key file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from braid.adapters.local.keys import LocalKeyFile
from braid.cli.sizes import format_size, parse_size
from braid.errors import KeyAccessError, UsageError
from braid.format.ids import BackupRef
from braid.format.keys import encryption_context


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


@pytest.mark.parametrize("text", ["db", "db@", "@20261123T010203.000Z-0a1b2c3d", "db/x@latest", "db@2026", "db@20261123T010203Z-0a1b2c3d", "-db@latest"])
def test_backup_ref_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        BackupRef.parse(text)


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
