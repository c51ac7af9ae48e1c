"""What a `wal-push` loads: PostgreSQL runs it once per 16 MiB segment, so start-up is most of its cost."""

from __future__ import annotations

from pathlib import Path

from test_startup import CLOUD_AND_TERMINAL, ON_DEMAND, SECOND_OPENSSL, found, loaded
from wal_segments import write_segment

SEG = "000000010000000000000003"


def test_a_wal_push_loads_no_manifest_no_cloud_and_no_second_openssl(tmp_path: Path, repo: Path) -> None:
    path = write_segment(tmp_path, SEG)
    modules = loaded(tmp_path, "wal-push", "--repo", str(repo), "--name", "pg", str(path))
    assert {"braid.ops.wal_push", "zstandard", "cryptography.hazmat.primitives.ciphers.aead"} <= modules  # the push happened
    assert found(modules, CLOUD_AND_TERMINAL + ON_DEMAND + SECOND_OPENSSL + ("braid.format.manifest", "braid.engine.local", "braid.engine.driver", "awscrt")) == []


def test_an_async_wal_push_answered_from_the_spool_loads_no_crypto_and_no_repository(tmp_path: Path, repo: Path) -> None:
    path = write_segment(tmp_path, SEG)
    spool = tmp_path / "spool"
    args = ("wal-push", "--repo", str(repo), "--name", "pg", "--async", "--spool", str(spool), str(path))
    loaded(tmp_path, *args)  # the pusher stores it; later calls find the marker
    box = next(spool.glob("push-*"))
    (box / "ok" / SEG).write_text("")  # as the pusher leaves it for a file it stored ahead of PostgreSQL's call
    modules = loaded(tmp_path, *args)
    assert not (box / "ok" / SEG).exists()
    assert found(modules, ("cryptography", "zstandard", "braid.format.repository", "braid.adapters", "subprocess", "braid.ops.wal_push")) == []
    pid = (box / "pusher.lock").read_text().strip()
    if pid:
        import os
        import signal

        try:
            os.kill(int(pid), signal.SIGTERM)
        except ProcessLookupError:
            pass


def test_a_wal_fetch_served_from_the_prefetch_spool_loads_no_crypto_and_no_repository(tmp_path: Path, repo: Path) -> None:
    spool, wal = tmp_path / "spool", tmp_path / "pg_wal"
    wal.mkdir()
    args = ("wal-fetch", "--repo", str(repo), "--name", "pg", "--spool", str(spool))
    loaded(tmp_path, "wal-push", "--repo", str(repo), "--name", "pg", str(write_segment(tmp_path, SEG)))
    loaded(tmp_path, *args, SEG, str(wal / "RECOVERYXLOG"))  # fetched from the archive; the spool is made
    box = next(spool.glob("fetch-*"))
    nxt = "000000010000000000000004"
    (box / nxt).write_bytes(b"verified bytes")  # as the prefetcher leaves a segment it fetched and checked
    modules = loaded(tmp_path, *args, nxt, str(wal / "RECOVERYXLOG"))
    assert (wal / "RECOVERYXLOG").read_bytes() == b"verified bytes" and not (box / nxt).exists()
    assert found(modules, ("cryptography", "zstandard", "braid.format.repository", "braid.adapters", "braid.ops.wal_fetch")) == []
    lock = box / "prefetch.lock"
    pid = lock.read_text().strip() if lock.exists() else ""
    if pid.isdigit():
        import os
        import signal

        try:
            os.kill(int(pid), signal.SIGTERM)
        except ProcessLookupError:
            pass
