"""Producer-aware backups and restores: Braid runs the database tool and publishes only on its success.

The fault suite ("Producer faults"): a producer that exits non-zero at the
start, mid-stream or at the end, is killed by a signal, or writes nothing,
in the one-stream and the --pipes form, publishes nothing (list is empty,
no manifest, no chunk, the private pipe directory removed) and exits 11
naming its status and last stderr line. Then round trips, placeholders,
stderr pass-through, signals, empty streams, and the restore's consumer.

Every run is the real CLI in a subprocess, the tools real executables
(support.db_tools) writing and reading real named pipes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from braid.errors import EXIT_CODES, EmptyStreamError, ProducerError
from braid.format.ids import BackupRef
from braid.format.staging import StagingArea, StreamEnd
from braid.format.staging.keys import stream_end_key
from conftest import BRAID, Result, run_braid
from support.db_tools import install, stream
from support.signals import default_dispositions

CHUNK = "64KiB"
SIZE = 300_000  # five chunks, the last one short


@pytest.fixture
def tools(tmp_path: Path) -> tuple[str, str]:
    dbtool, dbrestore = install(tmp_path / "bin")
    return str(dbtool), str(dbrestore)


@pytest.fixture
def private_tmp(tmp_path: Path) -> Path:
    """Braid's TMPDIR: where it makes its pipe directories, empty again after every run."""
    path = tmp_path / "tmp"
    path.mkdir()
    return path


def braid(repo: Path, private_tmp: Path, *args: str, stdin: bytes | None = None) -> Result:
    """`braid COMMAND --repo REPO ARGS...`: the repository before ARGS, which may end in `-- COMMAND`."""
    return run_braid(args[0], "--repo", str(repo), *args[1:], stdin=stdin, env={"TMPDIR": str(private_tmp)}, timeout=60)


def backup(repo: Path, private_tmp: Path, *args: str, stdin: bytes | None = None) -> Result:
    return braid(repo, private_tmp, "backup", "--name", "db", "--chunk-size", CHUNK, *args, stdin=stdin)


def error_line(result: Result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("braid: ")]
    assert lines, result.stderr
    return lines[-1]


def assert_nothing_published(repo: Path, private_tmp: Path) -> None:
    listed = run_braid("list", "--repo", str(repo), "--json")
    assert listed.code == 0 and json.loads(listed.out) == [], listed.out
    assert [p for p in (repo / "manifests").rglob("*") if p.is_file()] == []
    assert [p for p in (repo / "data").rglob("*") if p.is_file()] == []
    assert list(private_tmp.iterdir()) == [], "the pipe directory was left behind"


# -- the fault suite -----------------------------------------------------------------

FAULTS = {
    # name: (dbtool spec, the end as Braid names it, the last stderr line)
    "fails-at-start": (f"size={SIZE},fail_at=0,status=2,say=dbtool: connection refused", "exited with status 2", "dbtool: connection refused"),
    "fails-mid-stream": (f"size={SIZE},fail_at=150000,status=1,say=dbtool: disk error", "exited with status 1", "dbtool: disk error"),
    "fails-at-end": (f"size={SIZE},fail_at={SIZE},status=1,say=dbtool: could not write the WAL", "exited with status 1", "dbtool: could not write the WAL"),
    "killed-by-signal": (f"size={SIZE},fail_at=100000,kill=9", "was killed by signal 9 (SIGKILL)", f"dbtool: backing up {SIZE} bytes to"),
}


@pytest.mark.parametrize("form", ["command", "pipes"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_failing_producer_publishes_nothing_and_exits_11_naming_its_end(
    repo: Path, private_tmp: Path, tools: tuple[str, str], fault: str, form: str
) -> None:
    spec, end, last = FAULTS[fault]
    pipes = ["--pipes", "2"] if form == "pipes" else []
    paths = ["{pipes}"] if form == "pipes" else []

    result = backup(repo, private_tmp, *pipes, "--", tools[0], spec, *paths)

    assert result.code == 11, result.stderr
    line = error_line(result)
    assert line.startswith(f"braid: error: the producer failed: dbtool {end} (its last stderr line: \"{last}")
    assert line.endswith("; nothing was published")
    assert_nothing_published(repo, private_tmp)


def test_a_producer_that_cannot_be_run_is_exit_11(repo: Path, private_tmp: Path) -> None:
    result = backup(repo, private_tmp, "--", "/nonexistent/pg_basebackup", "-D", "-")
    assert result.code == 11
    assert error_line(result) == "braid: error: the producer failed: cannot run pg_basebackup: command not found"
    assert_nothing_published(repo, private_tmp)


def test_exit_11_is_in_the_exit_code_table() -> None:
    assert EXIT_CODES[11] == "the producer (backup) or consumer (restore) command failed"
    assert ProducerError("x").exit_code == 11 and EmptyStreamError("x").exit_code == 5
    helped = run_braid("--help")
    assert " 11  the producer (backup) or consumer (restore) command failed" in helped.out


# -- empty streams -----------------------------------------------------------------------


def test_an_empty_stream_is_refused_in_every_form(repo: Path, private_tmp: Path, tools: tuple[str, str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    message = (
        "braid: error: the backup stream is empty (the input ended before its first byte); nothing was published."
        " An empty stream usually means the producer failed; pass --allow-empty if empty is what you mean to back up"
    )
    for args, stdin in ((["--"], None), (["--input", str(empty)], None), ([], b"")):
        if args == ["--"]:
            args = ["--", tools[0], "size=0"]
        result = backup(repo, private_tmp, *args, stdin=stdin)
        assert (result.code, error_line(result)) == (5, message), args
    piped = backup(repo, private_tmp, "--pipes", "2", "--", tools[0], "size=0", "{pipes}")
    assert piped.code == 5 and "(every input ended before its first byte)" in error_line(piped)
    assert_nothing_published(repo, private_tmp)


def test_allow_empty_publishes_an_empty_backup(repo: Path, private_tmp: Path, tools: tuple[str, str]) -> None:
    result = backup(repo, private_tmp, "--allow-empty", "--", tools[0], "size=0")
    assert result.code == 0, result.stderr
    ref = result.out.strip()
    restored = run_braid("restore", "--repo", str(repo), ref)
    assert (restored.code, restored.stdout) == (0, b"")
    shown = json.loads(run_braid("show", "--repo", str(repo), ref, "--json").out)
    assert shown["plaintext_bytes"] == 0


# -- good producers ----------------------------------------------------------------------


def test_a_good_producer_round_trips_and_its_stderr_passes_through(repo: Path, private_tmp: Path, tools: tuple[str, str]) -> None:
    result = backup(repo, private_tmp, "--", tools[0], f"size={SIZE},say=dbtool: base backup completed")

    assert result.code == 0, result.stderr
    assert f"dbtool: backing up {SIZE} bytes to stdout" in result.stderr.splitlines()
    assert "dbtool: base backup completed" in result.stderr.splitlines()
    ref = result.out.strip()
    assert ref.startswith("db@")
    restored = run_braid("restore", "--repo", str(repo), ref)
    assert restored.code == 0 and restored.stdout == stream(0, SIZE)
    shown = json.loads(run_braid("show", "--repo", str(repo), ref, "--json").out)
    assert [i["source"] for i in shown["input_details"]] == ["stdout of dbtool"]  # the program's name, never its arguments
    assert list(private_tmp.iterdir()) == []


def test_three_pipes_round_trip_through_producer_and_consumer(repo: Path, private_tmp: Path, tools: tuple[str, str], tmp_path: Path) -> None:
    result = backup(repo, private_tmp, "--pipes", "3", "--", tools[0], f"size={SIZE}", "{pipes}")

    assert result.code == 0, result.stderr
    ref = result.out.strip()
    assert result.out == f"{ref}\n"  # the tool's own stdout goes to stderr: stdout is only NAME@ID
    assert "Backup successful. The timestamp for this backup image is : 20260101000000" in result.stderr.splitlines()
    shown = json.loads(run_braid("show", "--repo", str(repo), ref, "--json").out)
    assert [i["source"] for i in shown["input_details"]] == ["pipe1 of dbtool", "pipe2 of dbtool", "pipe3 of dbtool"]
    assert [i["bytes"] for i in shown["input_details"]] == [SIZE] * 3
    # The mirror: a consumer reading three pipes Braid made checks every byte.
    restored = braid(repo, private_tmp, "restore", ref, "--pipes", "--", tools[1], f"size={SIZE}", "{pipe1}", "{pipe2}", "{pipe3}")
    assert restored.code == 0, restored.stderr
    assert f"dbrestore: 3 input(s) of {SIZE} bytes each, every byte as written" in restored.stderr
    # And to files: input K is what the producer wrote to {pipeK}.
    outputs = [tmp_path / f"out{i}" for i in range(3)]
    to_files = run_braid("restore", "--repo", str(repo), ref, *[a for o in outputs for a in ("--output", str(o))])
    assert to_files.code == 0, to_files.stderr
    assert [o.read_bytes() for o in outputs] == [stream(i, SIZE) for i in range(3)]
    assert list(private_tmp.iterdir()) == []


def test_pipe_placeholders_are_substituted_one_by_one(repo: Path, private_tmp: Path, tools: tuple[str, str], tmp_path: Path) -> None:
    # dbtool writes its first path argument with stream 0: here that is {pipe2}.
    result = backup(repo, private_tmp, "--pipes", "2", "--", tools[0], f"size={SIZE}", "{pipe2}", "{pipe1}")
    assert result.code == 0, result.stderr
    outputs = [tmp_path / "one", tmp_path / "two"]
    restored = run_braid("restore", "--repo", str(repo), result.out.strip(), "--output", str(outputs[0]), "--output", str(outputs[1]))
    assert restored.code == 0, restored.stderr
    assert [o.read_bytes() for o in outputs] == [stream(1, SIZE), stream(0, SIZE)]


# -- signals -------------------------------------------------------------------------------


def test_under_nohup_a_sighup_is_not_braids_to_act_on_and_the_backup_completes(repo: Path, private_tmp: Path, tmp_path: Path) -> None:
    """A SIGHUP that Braid's parent ignores (nohup) stays ignored, for Braid and so for its producer: the backup goes on."""
    ready, trapped, go = tmp_path / "ready", tmp_path / "trapped", tmp_path / "go"
    script = (
        "import os, sys, time, signal\n"
        f"signal.signal(signal.SIGHUP, lambda *a: open({str(trapped)!r}, 'a').write('SIGHUP'))\n"
        "sys.stdout.buffer.write(b'x' * 100000); sys.stdout.flush()\n"
        f"open({str(ready)!r}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
    )

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen(
        [str(BRAID), "backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK, "--", sys.executable, "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(private_tmp)},
        preexec_fn=nohup,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the producer did not start"
        time.sleep(0.02)
    proc.send_signal(signal.SIGHUP)
    go.touch()  # the producer ends only after the signal was sent
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert not trapped.exists()  # never passed on: ignored by Braid, not Braid's to forward
    assert out.decode().strip().startswith("db@")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("form", ["command", "pipes"])
def test_a_signal_to_braid_reaches_the_producer_and_nothing_is_published(
    repo: Path, private_tmp: Path, tools: tuple[str, str], tmp_path: Path, signum: signal.Signals, form: str
) -> None:
    ready, trapped = tmp_path / "ready", tmp_path / "trapped"
    spec = f"size={SIZE},fail_at=100000,hang=1,ready={ready},trap={trapped}"
    pipes = ["--pipes", "2", "--", tools[0], spec, "{pipes}"] if form == "pipes" else ["--", tools[0], spec]
    proc = subprocess.Popen(
        [str(BRAID), "backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK, *pipes],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(private_tmp)},
        preexec_fn=default_dispositions,  # a runner under nohup ignores SIGHUP, and Braid keeps an ignored signal ignored
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the producer did not start"
        time.sleep(0.02)

    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)

    assert proc.returncode == 130, err.decode()
    assert err.decode().splitlines()[-1] == "braid: interrupted"
    assert trapped.read_text() == f"{signum.name}\n"  # passed on exactly once
    assert out == b""
    assert_nothing_published(repo, private_tmp)


def test_sigterm_stops_a_plain_stdin_backup_as_sigint_does(repo: Path, private_tmp: Path) -> None:
    proc = subprocess.Popen(
        [str(BRAID), "backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(stream(0, 200_000))
    proc.stdin.flush()
    first = proc.stderr.readline()  # the reading phase begins
    assert b'"event": "phase"' in first, first
    first = proc.stderr.readline()  # a chunk stored: braid is in the middle of the stream
    assert b'"event": "chunk"' in first, first
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err.decode().splitlines()[-1] == "braid: interrupted"
    assert_nothing_published(repo, private_tmp)


# -- restore into a consumer ---------------------------------------------------------------


@pytest.fixture
def one_stream(repo: Path, private_tmp: Path, tools: tuple[str, str]) -> str:
    result = backup(repo, private_tmp, "--", tools[0], f"size={SIZE}")
    assert result.code == 0, result.stderr
    return result.out.strip()


def test_restore_into_tar_extracts_the_archive(repo: Path, private_tmp: Path, tmp_path: Path) -> None:
    source = tmp_path / "pgdata"
    source.mkdir()
    (source / "PG_VERSION").write_text("16\n")
    (source / "base.dat").write_bytes(stream(7, 250_000))
    archive = tmp_path / "base.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(source, arcname="pgdata")
    made = backup(repo, private_tmp, "--", "cat", str(archive))
    assert made.code == 0, made.stderr
    target = tmp_path / "restored"
    target.mkdir()

    result = braid(repo, private_tmp, "restore", "db@latest", "--", "tar", "-x", "-C", str(target))

    assert result.code == 0, result.stderr
    assert (target / "pgdata" / "PG_VERSION").read_text() == "16\n"
    assert (target / "pgdata" / "base.dat").read_bytes() == stream(7, 250_000)
    assert list(private_tmp.iterdir()) == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("status=3,say=dbrestore: database in use", 'dbrestore exited with status 3 (its last stderr line: "dbrestore: database in use")'),
        ("take=1000", "dbrestore exited with status 0 before reading the whole backup"),
        ("take=0,status=0", "dbrestore exited with status 0 before reading the whole backup"),
    ],
    ids=["exits-non-zero", "stops-reading-early", "reads-nothing"],
)
def test_a_consumer_that_fails_or_stops_early_fails_the_restore(
    repo: Path, private_tmp: Path, tools: tuple[str, str], one_stream: str, spec: str, expected: str
) -> None:
    result = braid(repo, private_tmp, "restore", one_stream, "--", tools[1], f"size={SIZE},{spec}")

    assert result.code == 11, result.stderr
    line = error_line(result)
    assert line.startswith(f"braid: error: the consumer failed: {expected}"), line
    assert line.endswith("; the restore is incomplete")
    assert list(private_tmp.iterdir()) == []


def test_a_consumer_that_exits_0_leaving_bytes_in_its_pipe_fails(repo: Path, private_tmp: Path, tools: tuple[str, str]) -> None:
    small = backup(repo, private_tmp, "--", tools[0], "size=1000")  # fits in a pipe's buffer: every write succeeds
    assert small.code == 0, small.stderr
    result = braid(repo, private_tmp, "restore", small.out.strip(), "--", "sh", "-c", "sleep 0.5")
    assert result.code == 11, result.stderr
    assert error_line(result) == (
        "braid: error: the consumer failed: sh exited with status 0 before reading the whole backup (1000 byte(s) left unread)"
        " (nothing on stderr); the restore is incomplete"
    )


def test_a_consumer_of_pipes_that_fails_fails_the_restore(repo: Path, private_tmp: Path, tools: tuple[str, str]) -> None:
    made = backup(repo, private_tmp, "--pipes", "2", "--", tools[0], f"size={SIZE}", "{pipes}")
    assert made.code == 0, made.stderr
    result = braid(repo, private_tmp, "restore", "db@latest", "--pipes", "--", tools[1], "take=10,status=4,say=dbrestore: bad image", "{pipes}")
    assert result.code == 11
    assert error_line(result) == (
        'braid: error: the consumer failed: dbrestore exited with status 4 (its last stderr line: "dbrestore: bad image"); the restore is incomplete'
    )


# -- usage ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["backup", "--name", "db", "--pipes", "2"], "--pipes N makes pipes for a command to write: give it after --"),
        (["backup", "--name", "db", "--input", "/p1", "--", "dbtool"], "--input and a command after -- exclude each other"),
        (["backup", "--resume", "db@20260101T000000.000Z-00000000", "--", "dbtool"], "--resume applies only to s3:// repositories"),
        (["backup", "--name", "db", "--", "dbtool", "{pipes}"], "the command names pipes ({pipes}) but Braid makes none: add --pipes N"),
        (["backup", "--name", "db", "--pipes", "3", "--", "dbtool", "{pipe1}", "{pipe4}"], "the command names {pipe4}, but there are 3 pipes"),
        (["backup", "--name", "db", "--pipes", "3", "--", "dbtool", "{pipe1}"], "the command must name every one of the 3 pipes"),
        (["backup", "--name", "db", "--"], "give the command that writes the backup after --"),
        (["backup", "--name", "db", "pg_basebackup"], "unexpected argument 'pg_basebackup': the command to run goes after --"),
        (["restore", "db@latest", "--pipes"], "--pipes makes pipes for a command to read: give it after --"),
        (["restore", "db@latest", "--output", "/x", "--", "tar", "-x"], "--output and a command after -- exclude each other"),
        (["list", "--", "ls"], "'braid list' runs no command: remove the -- and what follows it"),
    ],
)
def test_command_usage_errors(repo: Path, args: list[str], message: str) -> None:
    result = run_braid(args[0], "--repo", str(repo), *args[1:])
    assert result.code == 2, result.stderr
    assert error_line(result).startswith(f"braid: error: {message}"), error_line(result)


def test_a_multi_input_backup_needs_pipes_for_its_consumer(repo: Path, private_tmp: Path, tools: tuple[str, str]) -> None:
    made = backup(repo, private_tmp, "--pipes", "2", "--", tools[0], "size=1000", "{pipes}")
    assert made.code == 0, made.stderr
    ref = made.out.strip()
    result = braid(repo, private_tmp, "restore", ref, "--", tools[1], "size=1000")
    assert result.code == 2
    assert error_line(result) == (
        f"braid: error: backup {ref} has 2 inputs; give the command one pipe per input: --pipes -- COMMAND naming {{pipes}} or {{pipe1}}..{{pipe2}}"
    )
    assert list(private_tmp.iterdir()) == []


# -- the abandoned stream-end record and the planner (in process) ------------------------------


def test_an_abandoned_stream_end_round_trips_and_an_ordinary_one_is_unchanged() -> None:
    ordinary = StreamEnd([5, 0], [1, 1])
    assert ordinary.to_bytes() == b'{"lengths":[5,0],"segments":[1,1]}'
    given_up = StreamEnd([5, 0], [1, 0], abandoned="the producer failed: dbtool exited with status 1")
    assert StreamEnd.from_bytes(given_up.to_bytes()) == given_up
    with pytest.raises(Exception, match=r"abandoned must give a reason"):
        StreamEnd.from_bytes(b'{"abandoned":" ","lengths":[1],"segments":[1]}')


def test_the_planner_fails_an_abandoned_stream_at_once(tmp_path: Path) -> None:
    from braid.adapters.local.store import LocalStore
    from braid.format.staging import SessionRecord
    from braid.pipeline.plan import StreamAbandonedError, plan_next_round

    store = LocalStore(tmp_path / "repo")
    ref = BackupRef.parse("db@20260101T000000.000Z-0000abcd")
    area = StagingArea(store, ref)
    area.write_session(SessionRecord(str(ref), "repo-id", 65536, 16, 3, ["stdout of dbtool"], "2026-01-01T00:00:00Z"))
    store.put(stream_end_key(ref), StreamEnd([70000], [1], abandoned="the producer failed: dbtool exited with status 1").to_bytes())

    with pytest.raises(StreamAbandonedError, match=rf"^the agent abandoned backup {ref}: the producer failed: dbtool exited with status 1$"):
        plan_next_round(store, ref, max_concurrency=10, max_chunks_per_item=4, poll_seconds=5, stall_seconds=60)


def test_a_pipe_the_producer_never_opened_is_a_missing_stream_not_an_empty_one(repo: Path, private_tmp: Path) -> None:
    """Read back, a pipe nobody opened looks like an empty input. Published, the backup would
    lack a whole stream; Braid watches its pipes being opened and refuses it (exit 11)."""
    skipped = backup(repo, private_tmp, "--pipes", "2", "--", "sh", "-c", 'printf rows > "$1"', "sh", "{pipe1}", "{pipe2}")
    assert (skipped.code, error_line(skipped)) == (
        11,
        'braid: error: the producer failed: sh exited with status 0 without ever opening pipe2 of the 2 pipes (nothing on stderr); nothing was published',
    )
    assert_nothing_published(repo, private_tmp)
    # Opened and closed without a byte, it is an empty stream, which a backup may hold.
    emptied = backup(repo, private_tmp, "--pipes", "2", "--", "sh", "-c", 'printf rows > "$1"; : > "$2"', "sh", "{pipe1}", "{pipe2}")
    assert emptied.code == 0, emptied.stderr
    shown = json.loads(run_braid("show", "--repo", str(repo), emptied.out.strip(), "--json").out)
    assert [i["bytes"] for i in shown["input_details"]] == [4, 0]


def test_a_producer_that_exits_while_a_process_it_started_holds_its_stdout_publishes_nothing(repo: Path, private_tmp: Path) -> None:
    """`sh -c 'tool &'`: the shell exits 0 at once, the stream goes on in a process whose end
    Braid never sees. Rather than wait for it forever or judge it by the shell's status,
    Braid gives the stream a grace after the producer's exit and then fails (exit 11)."""
    result = backup(repo, private_tmp, "--", "sh", "-c", "echo rows; sleep 60 &")
    assert (result.code, error_line(result)) == (
        11,
        "braid: error: the producer failed: sh exited with status 0, but a process it started still held its stdout open 5 s later"
        " (the stream must end with the producer: run the tool in the foreground) (nothing on stderr); nothing was published",
    )
    assert_nothing_published(repo, private_tmp)
    # Its last bytes still in the pipe when it exits are not a held stdout: a slow reader loses nothing.
    slow = backup(repo, private_tmp, "--", "sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x")
    assert slow.code == 0, slow.stderr
