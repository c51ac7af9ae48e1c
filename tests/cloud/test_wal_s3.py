"""The WAL archive on an `s3://` repository with `--engine local` (the host compresses and encrypts), on moto.

The same commands, the same object, the same rules as in a directory: a
create-only PUT (If-None-Match) is what makes a push never overwrite, and
S3 acknowledges a PUT only once it is stored, so exit 0 means durable.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.cloud.test_s3_local_engine import _objects, s3  # noqa: F401 (the fixture)
from tests.conftest import run_braid
from tests.wal_segments import segment_bytes, write_segment

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]

SEG = "000000010000000000000003"
MARKER = b"BRAID-S3-WAL-PLAINTEXT"


def test_wal_push_and_fetch_on_plain_s3(s3: dict[str, str], isolated_config: Path, tmp_path: Path) -> None:  # noqa: F811
    repo = "s3://plain/wal-host"
    assert run_braid("init", "--repo", repo, "--engine", "local", env=s3).code == 0
    path = write_segment(tmp_path, SEG, marker=MARKER)
    pushed = run_braid("wal-push", "--repo", repo, "--name", "pg", str(path), env=s3)
    assert (pushed.code, pushed.stderr) == (0, "")
    assert run_braid("wal-push", "--repo", repo, "--name", "pg", str(path), env=s3).code == 0  # the same bytes again
    stored = _objects(s3, "wal-host/wal/pg/")
    assert sorted(stored) == ["wal-host/wal/pg/0000000100000000/000000010000000000000003", "wal-host/wal/pg/archive.json"]
    assert not any(MARKER in body for body in _objects(s3, "wal-host/").values())
    dest = tmp_path / "RECOVERYXLOG"
    fetched = run_braid("wal-fetch", "--repo", repo, "--name", "pg", "--prefetch", "0", SEG, str(dest), env=s3)
    assert fetched.code == 0 and dest.read_bytes() == path.read_bytes()
    path.write_bytes(segment_bytes(SEG, seed=9))
    conflict = run_braid("wal-push", "--repo", repo, "--name", "pg", str(path), env=s3)
    assert conflict.code == 7 and "different content" in conflict.stderr
    missing = run_braid("wal-fetch", "--repo", repo, "--name", "pg", "--prefetch", "0", "0000000100000000000000FE", str(dest), env=s3)
    assert missing.code == 1
