"""Policy `pipe-buffer` (braid.engine.pipe_buffer): the pipes of a backup and a restore get a 1 MiB kernel buffer.

The function alone (a pipe, a regular file, the policy off, a descriptor
the kernel refuses), then through the real CLI: the producer's stdout as
the producer itself sees it, and the restore's stdout as its reader sees it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from braid.contract import ENV_PIPE_BUFFER
from braid.engine.pipe_buffer import PIPE_BUFFER_BYTES, widen
from conftest import BRAID, run_braid

F_GETPIPE_SZ = 1032


def pipe_size(fd: int) -> int:
    return fcntl.fcntl(fd, F_GETPIPE_SZ)


@pytest.fixture
def pipe():
    read, write = os.pipe()
    yield read, write
    os.close(read)
    os.close(write)


def test_a_pipe_is_widened_from_either_end(pipe, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PIPE_BUFFER, raising=False)
    read, write = pipe
    assert pipe_size(read) < PIPE_BUFFER_BYTES
    assert widen(read) == PIPE_BUFFER_BYTES
    assert pipe_size(write) == PIPE_BUFFER_BYTES
    assert widen(write) is None  # already that large: left alone


def test_the_policy_off_leaves_the_pipe_as_it_was(pipe, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PIPE_BUFFER, "off")
    read, _ = pipe
    before = pipe_size(read)
    assert widen(read) is None
    assert pipe_size(read) == before < PIPE_BUFFER_BYTES


def test_anything_but_a_pipe_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PIPE_BUFFER, raising=False)
    with open(tmp_path / "file", "wb") as handle:
        assert widen(handle.fileno()) is None
    read, write = os.pipe()
    os.close(read)
    os.close(write)
    assert widen(read) is None  # a descriptor the kernel refuses (EBADF): never an error for the backup


# The producer waits until Braid has widened its stdout (an event, bounded generously), then writes the size it sees.
_REPORT_SIZE = (
    "import fcntl, sys, time\n"
    "deadline = time.monotonic() + 60\n"
    "while fcntl.fcntl(1, 1032) < (1 << 20) and time.monotonic() < deadline:\n"
    "    time.sleep(0.01)\n"
    "sys.stdout.write(str(fcntl.fcntl(1, 1032)))\n"
)


def test_the_producers_stdout_is_widened(repo: Path, tmp_path: Path) -> None:
    done = run_braid("backup", "--repo", str(repo), "--name", "db", "--", sys.executable, "-c", _REPORT_SIZE, timeout=120)
    assert done.code == 0, done.stderr
    backup = done.out.strip()
    restored = run_braid("restore", "--repo", str(repo), backup, "--output", str(tmp_path / "out"))
    assert restored.code == 0, restored.stderr
    assert (tmp_path / "out").read_bytes() == str(PIPE_BUFFER_BYTES).encode()


def test_the_restores_stdout_is_widened_before_its_first_byte(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stored = run_braid("backup", "--repo", str(repo), "--name", "db", stdin=b"x" * 300_000)
    assert stored.code == 0, stored.stderr
    env = dict(os.environ)
    env.pop(ENV_PIPE_BUFFER, None)
    with subprocess.Popen([str(BRAID), "restore", "--repo", str(repo), stored.out.strip()], stdout=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None
        first = proc.stdout.read(1)  # written after the output was opened, and so widened
        assert pipe_size(proc.stdout.fileno()) == PIPE_BUFFER_BYTES
        rest = proc.stdout.read()
    assert proc.returncode == 0
    assert first + rest == b"x" * 300_000
