"""braid.ops.spool: a spool's identity file is private and whole, and a spool of another identity is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from braid.errors import InputError
from braid.ops.spool import spool_for


def test_identity_file_is_private_and_kept(tmp_path: Path) -> None:
    wal = tmp_path / "pg_wal"
    wal.mkdir()
    before = os.umask(0o022)
    try:
        spool = spool_for(str(tmp_path / "spools"), "fetch", "/repo", "pg", wal)
    finally:
        os.umask(before)
    marker = spool / "identity"
    assert marker.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in spool.iterdir()) == ["identity"]
    assert spool_for(str(tmp_path / "spools"), "fetch", "/repo", "pg", wal) == spool


def test_a_spool_of_another_identity_is_refused(tmp_path: Path) -> None:
    wal = tmp_path / "pg_wal"
    wal.mkdir()
    spool = spool_for(str(tmp_path / "spools"), "fetch", "/repo", "pg", wal)
    (spool / "identity").write_text("push\n/other\npg\n/x\n")
    with pytest.raises(InputError, match="belongs to another repository, name or pg_wal"):
        spool_for(str(tmp_path / "spools"), "fetch", "/repo", "pg", wal)
