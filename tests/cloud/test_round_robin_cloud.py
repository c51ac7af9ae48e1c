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
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_emulated_e2e import BRAID, Emulator  # noqa: E402

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
