"""Pipes written in turn, on the emulated cloud: more inputs than the agent's uploads in flight.

The agent once pooled (concurrency + 2) buffers for all its inputs: with 8
pipes fed in turn by one process (as Db2 does) and --concurrency 2, readers
holding a buffer waited for bytes the writer could not send, stuck on a
pipe whose reader waited for a buffer. One emulator run: back up 8 pipes
(an empty and a 1-byte input among them), restore to 8 pipes read in turn,
bytes identical, memory within (inputs + concurrency + 1) chunks.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_emulated_e2e import BRAID, Emulator  # noqa: E402

from support.round_robin import SCRIPT as ROUND_ROBIN  # noqa: E402
from support.round_robin import run_beside, start_reader, start_writer  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]
KiB, MiB = 1024, 1024**2
BLOCK = 64 * KiB
HANG = 240  # seconds: a healthy run takes well under a minute on the emulator


def payload(size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    row = f"row {seed:04d} of a table; ".encode()
    half = size // 2
    return (rng.randbytes(half) + row * ((size - half) // len(row) + 1))[:size]


def test_more_pipes_written_in_turn_than_uploads_in_flight_back_up_and_restore(tmp_path: Path) -> None:
    emulator = Emulator(tmp_path / "emulator")
    try:
        sizes = [5 * MiB + 3, 0, 700 * KiB, 1, 2 * MiB, 6 * MiB, 300 * KiB, 1200 * KiB]
        sources = []
        for i, size in enumerate(sizes):
            source = tmp_path / f"src{i}"
            source.write_bytes(payload(size, i))
            sources.append(source)
        pipes = [tmp_path / f"in{i}" for i in range(len(sizes))]
        for pipe in pipes:
            os.mkfifo(pipe)
        writer = start_writer(BLOCK, list(zip(sources, pipes, strict=True)))
        argv = [str(BRAID), "backup", "--name", "db2", "--chunk-size", "5MiB", "--concurrency", "2", "--json"]
        code, out, err = run_beside(writer, argv + [a for p in pipes for a in ("--input", str(p))], timeout=HANG, env=emulator.braid_env("agent"))
        assert code == 0, f"{err}\n{emulator.tail()}"
        assert writer.returncode == 0
        backup_id = json.loads(out)["backup"]  # --json: the summary document
        (stream_end,) = [e for e in (json.loads(line) for line in err.splitlines() if line.startswith("{")) if e.get("event") == "stream-end"]
        assert stream_end["bytes_read"] == sum(sizes)
        assert 1 <= stream_end["max_buffers_in_flight"] <= len(sizes) + 2 + 1  # inputs + concurrency + 1

        outs = [tmp_path / f"out{i}" for i in range(len(sizes))]
        for pipe in outs:
            os.mkfifo(pipe)
        restored = [tmp_path / f"restored{i}" for i in range(len(sizes))]
        reader = start_reader(BLOCK, list(zip(outs, restored, strict=True)))
        argv = [str(BRAID), "restore", backup_id, "--workers", "2", *[a for o in outs for a in ("--output", str(o))]]
        code, _, err = run_beside(reader, argv, timeout=HANG, env=emulator.braid_env("restorer"))
        assert code == 0, f"{err}\n{emulator.tail()}"
        assert reader.returncode == 0
        for source, target in zip(sources, restored, strict=True):
            assert target.read_bytes() == source.read_bytes(), target
    finally:
        emulator.stop()


def test_restore_pipes_to_round_robin_and_sequential_readers_of_twelve_unequal_inputs(tmp_path: Path) -> None:
    """`restore --pipes -- COMMAND` from the cloud: each pipe ends as soon as its own input is verified,
    so a reader in turn and one pipe after another both get every input (0 and 1 byte among them)."""
    emulator = Emulator(tmp_path / "emulator")
    try:
        sizes = [6 * MiB + 3, 0, 700 * KiB, 1, 2 * MiB, 0, 300 * KiB, 1, 1200 * KiB, 64 * KiB, 999, 5 * MiB]
        inputs: list[str] = []
        for i, size in enumerate(sizes):
            source = tmp_path / f"src{i}"
            source.write_bytes(payload(size, i))
            inputs += ["--input", str(source)]
        argv = [str(BRAID), "backup", "--name", "db2p", "--chunk-size", "5MiB", *inputs]
        proc = subprocess.run(argv, capture_output=True, timeout=HANG, env=emulator.braid_env("agent"))
        assert proc.returncode == 0, f"{proc.stderr.decode()}\n{emulator.tail()}"
        ref = proc.stdout.decode().strip().splitlines()[-1]

        rr = [tmp_path / f"rr{i}" for i in range(len(sizes))]
        reader = [sys.executable, str(ROUND_ROBIN), "read", str(BLOCK), *[f"{{pipe{i + 1}}}={out}" for i, out in enumerate(rr)]]
        proc = subprocess.run([str(BRAID), "restore", ref, "--pipes", "--", *reader], capture_output=True, timeout=HANG, env=emulator.braid_env("restorer"))
        assert proc.returncode == 0, f"{proc.stderr.decode()}\n{emulator.tail()}"
        assert [out.read_bytes() for out in rr] == [payload(size, i) for i, size in enumerate(sizes)]

        seq = [tmp_path / f"seq{i}" for i in range(len(sizes))]
        script = "; ".join(f"cat {{pipe{i + 1}}} > {out}" for i, out in enumerate(seq))
        proc = subprocess.run([str(BRAID), "restore", ref, "--pipes", "--", "sh", "-c", script], capture_output=True, timeout=HANG, env=emulator.braid_env("restorer"))
        assert proc.returncode == 0, f"{proc.stderr.decode()}\n{emulator.tail()}"
        assert [out.read_bytes() for out in seq] == [payload(size, i) for i, size in enumerate(sizes)]
    finally:
        emulator.stop()
