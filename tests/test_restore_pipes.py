"""Restore to a command through pipes never deadlocks, and a killed Braid takes its consumer along.

- `restore --pipes`: each pipe ends as soon as its own input is written and
  verified, and is written only once the consumer opened it, so a reader
  that takes the pipes in turn (Db2) or one after another (`cat {pipe1};
  cat {pipe2}`) gets every input, whatever their sizes (0 and 1 byte too);
- a consumer that never opens a pipe fails the restore: exit 5 at
  --open-timeout while it runs, exit 11 once it exited;
- SIGKILL of `braid restore -- COMMAND` (or `--pipes`) kills the consumer
  (PR_SET_PDEATHSIG) instead of handing it a clean end of a cut stream;
- `backup --pipes`: a pipe a process the command started still holds 5 s
  after the command exited fails the backup (exit 11), as for stdout.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BRAID, Result, run_braid
from support.round_robin import SCRIPT as ROUND_ROBIN

SIZES = [0, 1, 300_000, 5, 70_000, 1, 200_000, 0, 131_072, 65_536, 999, 150_001]  # 12 inputs
HANG = 240.0  # a guard against a deadlock, never a margin a healthy run waits for


def error_line(result: Result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("braid: ")]
    assert lines, result.stderr
    return lines[-1]


def braid(repo: Path, tmp: Path, *args: str) -> Result:
    return run_braid(args[0], "--repo", str(repo), *args[1:], env={"TMPDIR": str(tmp)}, timeout=HANG)


@pytest.fixture
def private_tmp(tmp_path: Path) -> Path:
    path = tmp_path / "tmp"
    path.mkdir()
    return path


@pytest.fixture
def twelve(repo: Path, tmp_path: Path, private_tmp: Path) -> tuple[str, list[bytes]]:
    """A backup of 12 inputs of unequal sizes (two empty, two of 1 byte), in 64 KiB chunks."""
    rng = random.Random(21)
    datas = [rng.randbytes(n) for n in SIZES]
    args = []
    for i, data in enumerate(datas):
        source = tmp_path / f"in{i}"
        source.write_bytes(data)
        args += ["--input", str(source)]
    made = braid(repo, private_tmp, "backup", "--name", "db2", "--chunk-size", "64KiB", *args)
    assert made.code == 0, made.stderr
    return made.out.strip(), datas


def test_a_round_robin_reader_of_twelve_unequal_pipes_gets_every_input(
    repo: Path, tmp_path: Path, private_tmp: Path, twelve: tuple[str, list[bytes]]
) -> None:
    ref, datas = twelve
    outs = [tmp_path / f"rr{i}" for i in range(len(datas))]
    pairs = [f"{{pipe{i + 1}}}={out}" for i, out in enumerate(outs)]
    result = braid(repo, private_tmp, "restore", ref, "--pipes", "--", sys.executable, str(ROUND_ROBIN), "read", "4096", *pairs)
    assert result.code == 0, result.stderr
    assert [out.read_bytes() for out in outs] == datas
    assert not list(private_tmp.iterdir())  # the pipe directory is gone


def test_a_sequential_reader_of_twelve_unequal_pipes_gets_every_input(
    repo: Path, tmp_path: Path, private_tmp: Path, twelve: tuple[str, list[bytes]]
) -> None:
    ref, datas = twelve
    script = "; ".join(f"cat {{pipe{i + 1}}} > {tmp_path / f'seq{i}'}" for i in range(len(datas)))
    result = braid(repo, private_tmp, "restore", ref, "--pipes", "--", "sh", "-c", script)
    assert result.code == 0, result.stderr
    assert [(tmp_path / f"seq{i}").read_bytes() for i in range(len(datas))] == datas


def test_a_consumer_that_exits_without_opening_a_pipe_fails_the_restore(
    repo: Path, tmp_path: Path, private_tmp: Path, twelve: tuple[str, list[bytes]]
) -> None:
    ref, datas = twelve
    names = " ".join(f"{{pipe{i + 1}}}" for i in range(2, len(datas)))
    result = braid(repo, private_tmp, "restore", ref, "--pipes", "--", "sh", "-c", f"cat {{pipe1}} {{pipe2}} > /dev/null; echo {names} > /dev/null")
    assert result.code == 11, result.stderr
    line = error_line(result)
    assert line.startswith("braid: error: the consumer failed: sh exited with status 0 before reading the whole backup (it never opened pipe3, pipe4"), line
    assert line.endswith("; the restore is incomplete"), line


def test_a_consumer_that_does_not_open_a_pipe_within_the_open_timeout_fails_with_exit_5(
    repo: Path, tmp_path: Path, private_tmp: Path, twelve: tuple[str, list[bytes]]
) -> None:
    ref, datas = twelve
    code = "import sys, time\nfor p in sys.argv[1:3]: open(p, 'rb').read()\ntime.sleep(600)"
    pipes = [f"{{pipe{i + 1}}}" for i in range(len(datas))]
    result = braid(repo, private_tmp, "restore", ref, "--pipes", "--open-timeout", "2", "--", sys.executable, "-c", code, *pipes)
    assert result.code == 5, result.stderr
    assert error_line(result) == (
        "braid: error: pipe3 of python3: the consumer did not open it for reading within 2 s (--open-timeout); the restore is incomplete"
    ) or error_line(result).endswith("the consumer did not open it for reading within 2 s (--open-timeout); the restore is incomplete")
    assert "waiting for a reader on pipe3 of" in result.stderr


SLOW_READER = """
import os, sys, time
pid_file, count_file, progress_file, pause_at, go_file = sys.argv[1:6]
open(pid_file, "w").write(str(os.getpid()))
source = open(sys.argv[6], "rb", buffering=0) if len(sys.argv) > 6 else sys.stdin.buffer
n = 0
while True:
    block = source.read(1 << 16)
    if not block:
        break
    n += len(block)
    with open(progress_file + ".tmp", "w") as f:
        f.write(str(n))
    os.replace(progress_file + ".tmp", progress_file)
    while n >= int(pause_at) and not os.path.exists(go_file):  # the test kills Braid here, then says go
        time.sleep(0.01)
open(count_file, "w").write(str(n))
"""


def _wait_for(check: object, what: str) -> None:
    until = time.monotonic() + HANG
    while not check():  # type: ignore[operator]
        assert time.monotonic() < until, f"gave up waiting for {what}"
        time.sleep(0.02)


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as stat:  # a zombie no one reaped yet is gone too
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize("pipes", [False, True], ids=["stdin", "pipes"])
@pytest.mark.parametrize("kill_at", [1 << 16, 3 << 20, 6 << 20])
def test_sigkill_of_braid_restore_kills_its_consumer_before_it_sees_an_end(
    repo: Path, tmp_path: Path, private_tmp: Path, pipes: bool, kill_at: int
) -> None:
    data = random.Random(kill_at).randbytes(8 << 20)
    source = tmp_path / "src"
    source.write_bytes(data)
    made = braid(repo, private_tmp, "backup", "--name", "big", "--chunk-size", "1MiB", "--input", str(source))
    assert made.code == 0, made.stderr
    script = tmp_path / "slow.py"
    script.write_text(SLOW_READER)
    pid_file, count_file, progress_file, go_file = tmp_path / "pid", tmp_path / "count", tmp_path / "progress", tmp_path / "go"
    argv = [str(BRAID), "restore", made.out.strip(), "--repo", str(repo)]
    argv += ["--pipes", "--"] if pipes else ["--"]
    argv += [sys.executable, str(script), str(pid_file), str(count_file), str(progress_file), str(kill_at), str(go_file)]
    argv += ["{pipe1}"] if pipes else []
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(private_tmp)})
    try:
        _wait_for(lambda: _read_int(progress_file) >= kill_at, f"the consumer to read {kill_at} bytes")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        go_file.write_text("go")  # a consumer still alive would now read on to the end it is handed
        consumer = _read_int(pid_file)
        _wait_for(lambda: _gone(consumer), "the consumer to end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not count_file.exists(), f"the consumer saw an end after {count_file.read_text()} of {len(data)} bytes"
    assert _read_int(progress_file) < len(data)


def test_backup_pipes_fails_when_a_process_holds_a_pipe_open_after_the_command_exited(repo: Path, tmp_path: Path, private_tmp: Path) -> None:
    source = tmp_path / "src"
    source.write_bytes(b"rows\n" * 100_000)
    lingering = tmp_path / "lingering.pid"
    script = f"cat {source} > {{pipe1}}; sh -c 'echo $$ > {lingering}; exec sleep 300' 3>{{pipe2}} >/dev/null 2>&1 & exit 0"
    try:
        result = braid(repo, private_tmp, "backup", "--name", "held", "--pipes", "2", "--", "sh", "-c", script)
    finally:
        if lingering.exists():
            os.kill(int(lingering.read_text()), signal.SIGKILL)
    assert result.code == 11, result.stderr
    # The background process opens pipe2 before or after its shell exits, as the scheduler has it: either is this failure.
    held = ("still held pipe2 open 5 s later", "opened pipe2 after it exited")
    assert error_line(result) in [
        f"braid: error: the producer failed: sh exited with status 0, but a process it started {how}"
        " (the stream must end with the producer: run the tool in the foreground) (nothing on stderr); nothing was published"
        for how in held
    ], error_line(result)
    assert braid(repo, private_tmp, "list", "--name", "held").out.strip() == "" or "held@" not in braid(repo, private_tmp, "list").out
    # A pipe whose writer closes within the grace, with bytes still to read, is no held pipe.
    ok = braid(repo, private_tmp, "backup", "--name", "ok", "--pipes", "2", "--", "sh", "-c", f"cat {source} > {{pipe1}} & cat {source} > {{pipe2}}; wait")
    assert ok.code == 0, ok.stderr


def test_backup_pipes_fails_at_the_open_timeout_when_the_command_opens_a_pipe_for_reading(repo: Path, tmp_path: Path, private_tmp: Path) -> None:
    source = tmp_path / "src"
    source.write_bytes(b"rows\n" * 10_000)
    result = braid(repo, private_tmp, "backup", "--name", "misread", "--pipes", "2", "--open-timeout", "4", "--", "sh", "-c", f"cat {source} > {{pipe1}}; cat {{pipe2}}")
    assert result.code == 11, result.stderr
    assert error_line(result) == (
        "braid: error: the producer failed: sh opened pipe2 for reading, not writing, and no process wrote to it within 4 s (--open-timeout);"
        " nothing was published"
    )
    assert "waiting for a writer on pipe2 of sh: it opened the pipe for reading, not writing (giving up after 4 s, --open-timeout)" in result.stderr
    assert "misread@" not in braid(repo, private_tmp, "list").out
