"""Policy async-bundle on the emulated cloud: `wal-push --async` stages a backlog's segments of one slot in ONE PUT.

The stack as tests/cloud/test_wal_cloud.py runs it: the resident pusher signs as `host-agent-pg`, S3's notification
of the bundle reaches the WAL worker through the queue, and every request is checked against the stack's IAM
policies. The archive's record is version 3 (written by the worker's first segment, or here by hand where the
worker is made to fail), so its staging may hold bundles.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cloud.test_emulated_e2e import BRAID, Emulator, Run, braid
from tests.cloud.test_wal_cloud import AGENT, MARKER, all_bytes, archived, fetch, push, versions, wait_for
from tests.wal_segments import SYSID, segment_bytes, write_segment

from braid.format.wal_bundle import BUNDLE_FILES
from support.residents import stop_residents

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]
SIXTEEN = 16 << 20


def slot(segno: int) -> list[str]:
    """The names of the whole slot of segments that holds segment number `segno` (braid.format.wal_bundle.bundle_slot)."""
    start = segno - segno % BUNDLE_FILES
    return [f"0000000100000000{n:08X}" for n in range(start, start + BUNDLE_FILES)]


def record_archive(emulator: Emulator, size: int = 1 << 20) -> None:
    """The archive's version 3 record, as the WAL worker writes it for the first segment."""
    doc = {"format": "braid-wal-archive", "version": 3, "name": "pg", "system_identifier": str(SYSID), "segment_size": size}
    emulator.client("s3").put_object(Bucket=emulator.bucket, Key="wal/pg/archive.json", Body=json.dumps(doc).encode())


def backlog(directory: Path, names: list[str], size: int = 1 << 20) -> list[Path]:
    """A pg_wal directory whose `names` are all ready (archive_status/*.ready): PostgreSQL's backlog."""
    status = directory / "archive_status"
    status.mkdir(parents=True, exist_ok=True)
    paths = [write_segment(directory, name, marker=MARKER, size=size) for name in names]
    for name in names:
        (status / f"{name}.ready").write_text("")
    return paths


def push_async(emulator: Emulator, path: Path, spool: Path, **env: str) -> Run:
    """`wal-push --async` as archive_command runs it (the pusher it starts inherits `env`)."""
    command = [str(BRAID), "wal-push", "--name", "pg", "--async", "--spool", str(spool), str(path)]
    proc = subprocess.run(command, env={**emulator.braid_env(AGENT), **env}, capture_output=True, timeout=180)
    return Run(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode())


def stop_pushers(spool: Path) -> None:
    stop_residents(spool.glob("*/pusher.lock"))  # a pusher idles out after a minute: stopped by the pid it wrote


def staged_puts(emulator: Emulator) -> list[str]:
    return [str(r["key"]) for r in emulator.requests(service="s3", op="PutObject") if "wal-staging/" in str(r.get("key"))]


def push_backlog(emulator: Emulator, paths: list[Path], spool: Path, **env: str) -> None:
    try:
        for path in paths:  # the first starts the pusher, which takes the whole backlog; the others find their marker
            done = push_async(emulator, path, spool, **env)
            assert (done.code, done.stderr) == (0, ""), done.stderr
    finally:
        stop_pushers(spool)


@pytest.fixture(scope="module")
def flaky(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The stack with the WAL worker failing its first batch (the bundle's first delivery; redelivered after 1 s)."""
    emulator = Emulator(tmp_path_factory.mktemp("wal-bundle"), "--fail-wal", "first=1", "--sqs-redelivery", "1")
    yield emulator
    emulator.stop()


def test_a_backlog_goes_as_one_bundle_and_its_redelivery_leaves_nothing_raw(flaky: Emulator, tmp_path: Path) -> None:
    record_archive(flaky)
    names = slot(0x50)
    paths = backlog(tmp_path / "pg_wal", names)
    push_backlog(flaky, paths, tmp_path / "spool")
    bundle = f"wal-staging/pg/{names[0]}.bundle"
    assert staged_puts(flaky) == [bundle], "one staging PUT for the backlog's slot"
    # The first delivery fails (--fail-wal first=1); SQS delivers it again and the worker packs the members.
    wait_for("every member archived", lambda: all(n in archived(flaky) for n in names), flaky)
    pack = f"wal/pg/0000000100000000/pack-{'-'.join(n[16:] for n in names)}"
    assert all(archived(flaky)[n] == [pack] for n in names), archived(flaky)
    assert len(flaky.requests(service="lambda", op="Invoke")) >= 2, "the failed delivery was delivered again"
    wait_for("the bundle removed, every version", lambda: not versions(flaky, "wal-staging/"), flaky)
    assert not any(MARKER in body for body in all_bytes(flaky, "wal/") + all_bytes(flaky, "wal-staging/")), "plaintext WAL left"
    for path in paths:
        got = fetch(flaky, path.name, tmp_path / f"restored-{path.name}")
        assert (got.code, got.stderr) == (0, ""), got.stderr
        assert (tmp_path / f"restored-{path.name}").read_bytes() == path.read_bytes()


@pytest.fixture(scope="module")
def stuck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The stack with a WAL worker that always fails: bundles stay in staging. 16 MiB segments: the base backup's."""
    emulator = Emulator(tmp_path_factory.mktemp("wal-bundle-stuck"), "--fail-wal", "always", "--sqs-redelivery", "1")
    record_archive(emulator, SIXTEEN)
    yield emulator
    emulator.stop()


def test_a_staged_bundle_is_read_by_fetch_the_gate_and_the_hosts_check(stuck: Emulator, tmp_path: Path) -> None:
    names = slot(9)  # the base backup below starts in 000000010000000000000009
    paths = backlog(tmp_path / "pg_wal", names, SIXTEEN)
    push_backlog(stuck, paths, tmp_path / "spool")
    bundle = f"wal-staging/pg/{names[0]}.bundle"
    assert stuck.keys("wal-staging/pg/") == [bundle]
    for path in (paths[0], paths[-1]):  # wal-fetch of a segment still in staging, from the bundle, verified
        dest = tmp_path / f"RECOVERY-{path.name}"
        got = fetch(stuck, path.name, dest)
        assert (got.code, got.stderr) == (0, ""), got.stderr
        assert dest.read_bytes() == path.read_bytes()
    duplicate = tmp_path / "again" / names[1]
    duplicate.parent.mkdir()
    duplicate.write_bytes(paths[1].read_bytes())
    again = push(stuck, duplicate)
    assert (again.code, again.stderr) == (0, ""), "the same bytes, in a staged bundle: accepted"
    other = tmp_path / "other" / names[2]
    other.parent.mkdir()
    other.write_bytes(segment_bytes(names[2], seed=5, size=SIXTEEN))
    refused = push(stuck, other)
    assert refused.code == 7, refused.stderr
    assert f"{names[2]} is already staged under 'pg' with different content" in refused.stderr
    assert f"staged sha256:{hashlib.sha256(paths[2].read_bytes()).hexdigest()}" in refused.stderr
    assert f"pushed sha256:{hashlib.sha256(other.read_bytes()).hexdigest()}" in refused.stderr
    assert refused.stderr.count("\n") == 1

    from tests.test_pgdata_restore import base_backup

    tar = base_backup(wal=False)  # its backup_label starts in 000000010000000000000009: a member of the bundle
    published = braid(stuck, AGENT, "backup", "--name", "pg", "--wal-wait", "0", "--quiet", stdin=tar)
    assert published.code == 0, published.stderr
    assert stuck.keys("manifests/pg/")


def test_with_the_policy_off_the_pusher_stages_one_object_per_segment(stuck: Emulator, tmp_path: Path) -> None:
    names = slot(0x30)
    paths = backlog(tmp_path / "pg_wal", names, SIXTEEN)
    push_backlog(stuck, paths, tmp_path / "spool", BRAID_WAL_BUNDLE="off")
    assert sorted(k for k in stuck.keys("wal-staging/pg/") if k[len("wal-staging/pg/") :] in names) == [f"wal-staging/pg/{n}" for n in names]
    assert not [k for k in stuck.keys("wal-staging/pg/") if k.endswith(f"{names[0]}.bundle")]
