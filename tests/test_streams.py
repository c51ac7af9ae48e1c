"""Streams, end to end through the real CLI: pipes written in turn, pipes nobody opens, safe restore output.

Every run is under a subprocess timeout, so a deadlock fails the test
instead of hanging the suite. The round-robin writer and reader are a
separate process (tests/support/round_robin.py), as the database is.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from braid.cli.compose import open_key_service, open_repository
from braid.engine.driver import Release, drive, pool_size
from braid.engine.stream import InputSource, Piece
from braid.errors import StorageError
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.manifest import Manifest
from braid.ops.open import open_backup
from braid.ops.restore import OutputTarget, restore_backup
from braid.ports.store import ObjectStore
from conftest import BRAID, Result, run_braid
from support.round_robin import run_beside, start_reader, start_writer, stop

pytestmark = pytest.mark.e2e
KiB = 1024
BLOCK = 64 * KiB
CHUNK = 256 * KiB
HANG = 90  # seconds: far above a healthy run (~2 s), so only a deadlock reaches it


def payload(size: int, seed: int) -> bytes:
    """Half random, half a repeated row: compressible, and distinct per input."""
    rng = random.Random(seed)
    row = f"row {seed:04d} of a table; ".encode()
    half = size // 2
    return (rng.randbytes(half) + row * ((size - half) // len(row) + 1))[:size]


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("braid: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def events(stderr: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in (json.loads(line) for line in stderr.splitlines() if line.startswith("{")) if e.get("event") == kind]


def braid_with(peer: subprocess.Popen[bytes], *args: str, timeout: float = HANG) -> Result:
    """Run the CLI while `peer` (the database's side) runs; both are stopped, and the test fails, if it hangs."""
    return Result(*run_beside(peer, [str(BRAID), *args], timeout=timeout))


def fifos(tmp_path: Path, prefix: str, count: int) -> list[Path]:
    paths = [tmp_path / f"{prefix}{i}" for i in range(count)]
    for path in paths:
        os.mkfifo(path)
    return paths


def opened(repo: Path, backup_id: str) -> tuple[ObjectStore, Manifest, DataKey]:
    """For in-process restores: the repository the CLI would open, and the authenticated manifest."""
    repository = open_repository(str(repo))
    manifest, key = open_backup(repository, BackupRef.parse(backup_id), open_key_service(repository, None))
    return repository.store, manifest, key


def data_files(repo: Path, backup_id: str) -> list[Path]:
    ref = BackupRef.parse(backup_id)
    return sorted((repo / "data" / ref.name / ref.id).glob("[0-9]*"))


# -- pipes written in turn ------------------------------------------------------------------


def test_more_pipes_written_in_turn_than_workers_back_up_and_restore(repo: Path, tmp_path: Path) -> None:
    """12 pipes, one writer moving 64 KiB to each in turn (Db2), --workers 2: workers + 2 buffers deadlocked this."""
    sizes = [3 * CHUNK + 5, 0, 700 * KiB, 1, 2 * CHUNK, 1200 * KiB, 300 * KiB, CHUNK + 1, 900 * KiB, 4 * CHUNK, 150 * KiB, 1000 * KiB]
    sources = []
    for i, size in enumerate(sizes):
        source = tmp_path / f"src{i}"
        source.write_bytes(payload(size, i))
        sources.append(source)
    pipes = fifos(tmp_path, "in", len(sizes))
    writer = start_writer(BLOCK, list(zip(sources, pipes, strict=True)))
    inputs = [a for p in pipes for a in ("--input", str(p))]
    backed = braid_with(writer, "backup", "--repo", str(repo), "--name", "db2", "--workers", "2", "--chunk-size", "256KiB", "--json", *inputs)
    assert backed.code == 0, backed.stderr
    assert writer.returncode == 0
    backup_id = json.loads(backed.out)["backup"]  # --json: the summary document

    shown = json.loads(run_braid("show", "--repo", str(repo), "--json", backup_id).out)
    assert [d["bytes"] for d in shown["input_details"]] == sizes
    # Memory: one buffer per input to read into, and workers + 1 in flight.
    assert 1 <= shown["stats"]["max_buffers_in_flight"] <= len(sizes) + 2 + 1

    outs = fifos(tmp_path, "out", len(sizes))
    restored = [tmp_path / f"restored{i}" for i in range(len(sizes))]
    reader = start_reader(BLOCK, list(zip(outs, restored, strict=True)))
    result = braid_with(reader, "restore", "--repo", str(repo), "--workers", "2", backup_id, *[a for o in outs for a in ("--output", str(o))])
    assert result.code == 0, result.stderr
    assert reader.returncode == 0
    for source, target in zip(sources, restored, strict=True):
        assert target.read_bytes() == source.read_bytes(), target


def test_a_pipe_reader_that_falls_behind_still_gets_everything_in_order(repo: Path, tmp_path: Path) -> None:
    """Restore: the reader opens its pipes in order and reads in turn; stdout-free, bytes identical, memory bounded in-process too."""
    data = [payload(5 * CHUNK + 17, 40), payload(CHUNK // 3, 41), payload(0, 42)]
    sources = []
    for i, blob in enumerate(data):
        source = tmp_path / f"s{i}"
        source.write_bytes(blob)
        sources.append(source)
    backed = run_braid("backup", "--repo", str(repo), "--name", "x", "--chunk-size", "256KiB", *[a for s in sources for a in ("--input", str(s))])
    assert backed.code == 0, backed.stderr
    store, manifest, key = opened(repo, backed.out.strip())
    outs = fifos(tmp_path, "o", 3)
    restored = [tmp_path / f"r{i}" for i in range(3)]
    reader = start_reader(4 * KiB, list(zip(outs, restored, strict=True)))
    try:
        stats = restore_backup(store, manifest, key, [OutputTarget(str(o), str(o)) for o in outs], workers=4, open_timeout=30)
        reader.wait(30)
    finally:
        stop(reader)
    assert [r.read_bytes() for r in restored] == data
    assert stats.buffers <= 3 + 4 + 1


# -- named pipes nobody opens ---------------------------------------------------------------


def test_an_input_pipe_nobody_writes_fails_after_the_open_timeout(repo: Path, tmp_path: Path) -> None:
    (pipe,) = fifos(tmp_path, "lonely", 1)
    started = time.monotonic()
    result = run_braid("backup", "--repo", str(repo), "--name", "db", "--input", str(pipe), "--open-timeout", "2", "--json", timeout=HANG)
    elapsed = time.monotonic() - started
    assert result.code == 5, result.stderr
    assert error_line(result.stderr) == (
        f"braid: error: input {pipe}: no process opened it for writing within 2 s (--open-timeout); start the backup that writes to it, or check the path"
    )
    (note,) = events(result.stderr, "waiting")
    assert note["input"] == str(pipe) and note["message"].startswith(f"waiting for a writer on {pipe}")
    assert 2 <= elapsed < 30
    assert json.loads(run_braid("list", "--repo", str(repo), "--json").out) == []


def test_a_pipe_nobody_opens_does_not_stop_the_other_input_being_read_completely(repo: Path, tmp_path: Path) -> None:
    fed, lonely = fifos(tmp_path, "p", 2)
    source = tmp_path / "src"
    source.write_bytes(payload(3 * 1024 * KiB, 7))
    writer = start_writer(BLOCK, [(source, fed)])
    result = braid_with(
        writer, "backup", "--repo", str(repo), "--name", "db", "--chunk-size", "256KiB", "--input", str(fed), "--input", str(lonely), "--open-timeout", "2"
    )
    assert writer.returncode == 0, "the writer of the other input could not finish: it was not read completely"
    assert result.code == 5, result.stderr
    assert f"input {lonely}: no process opened it for writing within 2 s" in error_line(result.stderr)
    assert json.loads(run_braid("list", "--repo", str(repo), "--json").out) == []


def test_a_writer_that_opens_late_is_waited_for_and_said_so(repo: Path, tmp_path: Path) -> None:
    (pipe,) = fifos(tmp_path, "late", 1)
    proc = subprocess.Popen(
        [str(BRAID), "backup", "--repo", str(repo), "--name", "db", "--input", str(pipe), "--open-timeout", "3", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline().decode()  # the reading phase begins at once,
        first += proc.stderr.readline().decode()  # the note comes after min(5 s, timeout / 2)
        assert events(first, "waiting"), first
        with open(pipe, "wb") as handle:  # then the writer turns up, within the timeout
            handle.write(b"late but whole")
        out, rest = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = first + rest.decode()
    assert proc.returncode == 0, err
    (note,) = events(err, "waiting")
    assert note["message"].startswith(f"waiting for a writer on {pipe}")
    assert run_braid("restore", "--repo", str(repo), json.loads(out)["backup"]).stdout == b"late but whole"


def test_a_writer_that_opens_at_once_but_writes_late_is_not_timed_out(repo: Path, tmp_path: Path) -> None:
    """The timeout is on the open, not the first byte: pg_basebackup may be silent through a spread checkpoint."""
    (pipe,) = fifos(tmp_path, "quiet", 1)
    proc = subprocess.Popen(
        [str(BRAID), "backup", "--repo", str(repo), "--name", "db", "--input", str(pipe), "--open-timeout", "1", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        with open(pipe, "wb") as handle:
            time.sleep(1.5)  # silent for longer than the timeout, after opening
            handle.write(b"after a checkpoint")
        out, err = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert events(err.decode(), "waiting") == []
    assert run_braid("restore", "--repo", str(repo), json.loads(out)["backup"]).stdout == b"after a checkpoint"


def test_a_restore_pipe_nobody_reads_fails_after_the_open_timeout(repo: Path, tmp_path: Path) -> None:
    assert run_braid("backup", "--repo", str(repo), "--name", "db", stdin=b"rows" * 1000).code == 0
    (pipe,) = fifos(tmp_path, "unread", 1)
    result = run_braid("restore", "--repo", str(repo), "db@latest", "--output", str(pipe), "--open-timeout", "2", "--json", timeout=HANG)
    assert result.code == 5, result.stderr
    assert error_line(result.stderr) == (
        f"braid: error: output {pipe}: no process opened it for reading within 2 s (--open-timeout); start the restore that reads it, or check the path"
    )
    (note,) = events(result.stderr, "waiting")
    assert note["output"] == str(pipe) and note["message"].startswith(f"waiting for a reader on {pipe}")


class FailingSink:
    """Fails the backup at its first chunk, as a full repository disk would."""

    def accept(self, index: int, piece: Piece, release: Release) -> None:
        release()
        raise StorageError("repository disk is full")

    def end_input(self, input_index: int, length: int) -> None: ...

    def finish(self) -> None: ...

    def abort(self, error: BaseException) -> None: ...


def test_a_failed_backup_stops_waiting_for_a_writer_at_once_and_lets_go_of_the_pipe(tmp_path: Path) -> None:
    fed = tmp_path / "fed"
    fed.write_bytes(b"x" * 5000)
    (lonely,) = fifos(tmp_path, "lonely", 1)
    sources = [InputSource(0, str(fed), str(fed)), InputSource(1, str(lonely), str(lonely))]
    started = time.monotonic()
    with pytest.raises(StorageError, match="disk is full"):
        drive(sources, FailingSink(), buffers=pool_size(2, 2), chunk_size=4096, backup="db@x", open_timeout=60)
    assert time.monotonic() - started < 10  # not the open timeout
    deadline = time.monotonic() + 5
    while any(t.name in ("braid-open", "braid-read-1") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name in ("braid-open", "braid-read-1") for t in threading.enumerate())
    with pytest.raises(OSError) as no_reader:  # nobody holds the pipe open for reading any more
        os.open(lonely, os.O_WRONLY | os.O_NONBLOCK)
    assert no_reader.value.errno == errno.ENXIO


@pytest.mark.parametrize("command", ["backup", "restore"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_open_timeout_must_be_a_positive_number_of_seconds(repo: Path, command: str, value: str) -> None:
    target = ["--name", "db"] if command == "backup" else ["db@latest"]
    result = run_braid(command, "--repo", str(repo), *target, "--open-timeout", value)
    assert result.code == 2, result.stderr
    assert "--open-timeout" in error_line(result.stderr) and repr(value) in error_line(result.stderr)


# -- restore never leaves a bad file under the real name --------------------------------------


def backup_chunks(repo: Path, size: int = 5 * CHUNK + 100) -> tuple[str, bytes]:
    data = payload(size, 3)
    result = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", "256KiB", stdin=data)
    assert result.code == 0, result.stderr
    return result.out.strip(), data


def test_a_missing_last_chunk_is_found_before_the_first_byte(repo: Path, tmp_path: Path) -> None:
    backup_id, _ = backup_chunks(repo)
    chunks = data_files(repo, backup_id)
    assert len(chunks) == 6
    chunks[-1].unlink()
    out = tmp_path / "restored.tar"
    result = run_braid("restore", "--repo", str(repo), backup_id, "--output", str(out))
    assert result.code == 6, result.stderr
    assert error_line(result.stderr) == f"braid: error: chunk 5 of backup {backup_id} is missing from the repository"
    assert not out.exists()
    assert list(tmp_path.glob("restored.tar*")) == []

    to_stdout = run_braid("restore", "--repo", str(repo), backup_id)
    assert to_stdout.code == 6 and "chunk 5" in error_line(to_stdout.stderr)
    assert to_stdout.stdout == b""


def test_a_truncated_chunk_is_found_before_the_first_byte(repo: Path, tmp_path: Path) -> None:
    backup_id, _ = backup_chunks(repo)
    last = data_files(repo, backup_id)[-1]
    stored = last.read_bytes()
    last.write_bytes(stored[:-1])
    result = run_braid("restore", "--repo", str(repo), backup_id)
    assert result.code == 6, result.stderr
    assert error_line(result.stderr) == (
        f"braid: error: chunk 5 of backup {backup_id} is {len(stored) - 1} bytes in the repository, the manifest says {len(stored)}; nothing was restored"
    )
    assert result.stdout == b""


def test_force_over_a_good_file_with_a_corrupt_first_chunk_keeps_the_good_file(repo: Path, tmp_path: Path) -> None:
    backup_id, data = backup_chunks(repo)
    out = tmp_path / "restored.tar"
    good = b"yesterday's good restore\n" * 1000
    out.write_bytes(good)
    inode = out.stat().st_ino
    first = data_files(repo, backup_id)[0]
    raw = bytearray(first.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # same size: only decoding finds it
    first.write_bytes(bytes(raw))
    result = run_braid("restore", "--repo", str(repo), backup_id, "--output", str(out), "--force")
    assert result.code == 6, result.stderr
    assert f"chunk 0 of backup {backup_id}" in error_line(result.stderr)
    assert out.read_bytes() == good and out.stat().st_ino == inode
    assert not Path(f"{out}.braid-partial").exists()


def test_a_successful_restore_is_renamed_into_place_and_replaces_a_leftover_partial(repo: Path, tmp_path: Path) -> None:
    backup_id, data = backup_chunks(repo)
    out = tmp_path / "restored.tar"
    out.write_bytes(b"old")
    os.chmod(out, 0o640)
    inode = out.stat().st_ino
    Path(f"{out}.braid-partial").write_bytes(b"from a restore that was killed")
    result = run_braid("restore", "--repo", str(repo), backup_id, "--output", str(out), "--force")
    assert result.code == 0, result.stderr
    assert out.read_bytes() == data
    assert out.stat().st_ino != inode  # a new file renamed over the old one, not the old one rewritten
    assert out.stat().st_mode & 0o777 == 0o640
    assert not Path(f"{out}.braid-partial").exists()


def test_restore_syncs_the_file_before_the_rename_and_the_directory_after(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backup_id, data = backup_chunks(repo, size=CHUNK + 1)
    store, manifest, key = opened(repo, backup_id)
    out = tmp_path / "restored"
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(f"fsync {os.readlink(f'/proc/self/fd/{fd}')}")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        calls.append(f"rename {src} {dst}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    restore_backup(store, manifest, key, [OutputTarget(str(out), str(out))], workers=2)
    real = os.path.realpath(out)
    assert calls == [f"fsync {real}.braid-partial", f"rename {real}.braid-partial {real}", f"fsync {os.path.dirname(real)}"]
    assert out.read_bytes() == data


# -- one input, one reader -------------------------------------------------------------------


def test_the_same_input_by_another_spelling_is_refused(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "d1").write_bytes(b"rows")
    (tmp_path / "link").symlink_to(tmp_path / "d1")
    monkeypatch.chdir(tmp_path)
    for spelling in ["./d1", str(tmp_path / "d1"), "link", "sub/../d1"]:
        (tmp_path / "sub").mkdir(exist_ok=True)
        result = run_braid("backup", "--repo", str(repo), "--name", "db", "--input", "d1", "--input", spelling)
        assert result.code == 5, result.stderr
        assert error_line(result.stderr) == f"braid: error: the same input is named twice: d1 and {spelling}"
    same = run_braid("backup", "--repo", str(repo), "--name", "db", "--input", "d1", "--input", "d1")
    assert same.code == 5 and error_line(same.stderr) == "braid: error: the same input is named twice: d1"
    assert json.loads(run_braid("list", "--repo", str(repo), "--json").out) == []


def test_a_failure_in_one_output_leaves_no_output_file_at_all(repo: Path, tmp_path: Path) -> None:
    """Restore is all or nothing for files: the first input, restored whole, is not renamed into place when the second fails."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_bytes(payload(CHUNK // 2, 1))
    second.write_bytes(payload(3 * CHUNK, 2))
    backed = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", "256KiB", "--input", str(first), "--input", str(second))
    assert backed.code == 0, backed.stderr
    backup_id = backed.out.strip()
    last = data_files(repo, backup_id)[-1]  # the second input's last chunk
    raw = bytearray(last.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    last.write_bytes(bytes(raw))
    outs = [tmp_path / "r1", tmp_path / "r2"]
    result = run_braid("restore", "--repo", str(repo), backup_id, *[a for o in outs for a in ("--output", str(o))])
    assert result.code == 6, result.stderr
    assert f"chunk 3 of backup {backup_id}" in error_line(result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("r") and p.name != "repo") == []


def test_the_same_output_by_another_spelling_is_refused(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i, name in enumerate(["a", "b"]):
        (tmp_path / name).write_bytes(b"x" * (i + 1))
    assert run_braid("backup", "--repo", str(repo), "--name", "db", "--input", str(tmp_path / "a"), "--input", str(tmp_path / "b")).code == 0
    monkeypatch.chdir(tmp_path)
    result = run_braid("restore", "--repo", str(repo), "db@latest", "--output", "out", "--output", "./out")
    assert result.code == 2, result.stderr
    assert error_line(result.stderr) == "braid: error: the same output is named twice"
    assert not (tmp_path / "out").exists()
