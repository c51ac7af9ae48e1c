"""Policy sync-bundle on the emulated cloud: a plain `wal-push` at a backlog stages its ready slot-mates in ONE PUT.

PostgreSQL's calls as archive_command makes them: one process per segment, in order, each `.ready` renamed
`.done` once the call exits 0; the host signs as `host-agent-pg` and every request is checked against the stack's
IAM policies; S3's notification of the bundle reaches the WAL worker through the queue.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cloud.test_emulated_e2e import BRAID, Emulator, Run
from tests.cloud.test_wal_bundle_cloud import backlog, record_archive, slot, staged_puts
from tests.cloud.test_wal_cloud import AGENT, MARKER, all_bytes, archived, fetch, versions, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]


def push(emulator: Emulator, path: Path, **env: str) -> Run:
    """`braid wal-push --name pg %p` as archive_command runs it."""
    command = [str(BRAID), "wal-push", "--name", "pg", str(path)]
    proc = subprocess.run(command, env={**emulator.braid_env(AGENT), **env}, capture_output=True, timeout=180)
    return Run(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode())


def archive_in_order(emulator: Emulator, paths: list[Path], **env: str) -> None:
    for path in paths:
        done = push(emulator, path, **env)
        assert (done.code, done.stderr) == (0, ""), done.stderr
        status = path.parent / "archive_status"
        os.rename(status / f"{path.name}.ready", status / f"{path.name}.done")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    emulator = Emulator(tmp_path_factory.mktemp("wal-lookahead"))
    record_archive(emulator)
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def stuck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """A WAL worker that always fails: what the calls staged stays, whatever the worker's pace."""
    emulator = Emulator(tmp_path_factory.mktemp("wal-lookahead-stuck"), "--fail-wal", "always", "--sqs-redelivery", "1")
    record_archive(emulator)
    yield emulator
    emulator.stop()


def mine(emulator: Emulator, names: list[str]) -> list[str]:
    return [k for k in staged_puts(emulator) if k.rpartition("/")[2][:24] in names]


def test_a_backlog_is_one_staging_put_and_the_next_calls_stage_nothing(stuck: Emulator, tmp_path: Path) -> None:
    names = slot(0x60)
    paths = backlog(tmp_path / "pg_wal", names)
    archive_in_order(stuck, paths)
    assert mine(stuck, names) == [f"wal-staging/pg/{names[0]}.bundle"], "one staging PUT for the slot"
    for path in (paths[1], paths[-1]):  # wal-fetch of a segment still in staging, from the bundle, verified
        got = fetch(stuck, path.name, tmp_path / f"restored-{path.name}")
        assert (got.code, got.stderr) == (0, ""), got.stderr
        assert (tmp_path / f"restored-{path.name}").read_bytes() == path.read_bytes()


def test_with_the_policy_off_each_call_stages_its_own_segment(stuck: Emulator, tmp_path: Path) -> None:
    names = slot(0x70)
    archive_in_order(stuck, backlog(tmp_path / "pg_wal", names), BRAID_WAL_SYNC_BUNDLE="off")
    assert mine(stuck, names) == [f"wal-staging/pg/{n}" for n in names], "one staged object per segment"


def test_the_worker_packs_a_look_ahead_bundle_and_leaves_nothing_raw(stack: Emulator, tmp_path: Path) -> None:
    names = slot(0x60)
    paths = backlog(tmp_path / "pg_wal", names)
    archive_in_order(stack, paths)
    bundle = f"wal-staging/pg/{names[0]}.bundle"
    # The first PUT is the bundle; a call made after the worker removed it stages its segment again, found archived.
    assert mine(stack, names)[0] == bundle
    wait_for("every member archived", lambda: all(n in archived(stack) for n in names), stack)
    pack = f"wal/pg/0000000100000000/pack-{'-'.join(n[16:] for n in names)}"
    assert all(archived(stack)[n][0] == pack for n in names), archived(stack)
    wait_for("staging empty, every version", lambda: not versions(stack, "wal-staging/"), stack)
    assert not any(MARKER in body for body in all_bytes(stack, "wal/") + all_bytes(stack, "wal-staging/")), "plaintext WAL left"
    for path in (paths[0], paths[-1]):
        got = fetch(stack, path.name, tmp_path / f"restored-{path.name}")
        assert (got.code, got.stderr) == (0, ""), got.stderr
        assert (tmp_path / f"restored-{path.name}").read_bytes() == path.read_bytes()
