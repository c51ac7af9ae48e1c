"""Soak cases for commands Braid runs through pipes (issue 21), used by tests/support/soak.py.

  pipes     restore --pipes of a backup of 2..14 inputs of random sizes (0 and
            1 byte among them) to a round-robin or a sequential reader: the
            bytes must come back whole, and a run past HANG is a hang;
  consumer  SIGKILL of `braid restore -- COMMAND` (or --pipes) after a random
            number of bytes: the consumer must die with it, never reading a
            clean end of the cut stream (a loss if it does);
  linger    `backup --pipes` whose command leaves a process holding a pipe:
            exit 11 within seconds, nothing published (a hang past HANG).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.kill_points import BRAID, LocalRepo, Tally, pattern
from support.round_robin import SCRIPT as ROUND_ROBIN

HANG = 180.0  # seconds: a healthy case takes a few; past this it is counted as a hang

_CONSUMER = """
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
    open(progress_file, "w").write(str(n))
    while n >= int(pause_at) and not os.path.exists(go_file):
        time.sleep(0.01)
open(count_file, "w").write(str(n))
"""


def _int(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def pipes_restore(repo: LocalRepo, rng: random.Random, tally: Tally) -> None:
    count = rng.randint(2, 14)
    sizes = [rng.choice([0, 1, rng.randint(2, 4096), rng.randint(4096, 600_000)]) for _ in range(count)]
    work = repo.root / "pipes"
    work.mkdir(exist_ok=True)
    datas = [pattern(size, rng.randrange(1 << 30)) for size in sizes]
    args: list[str] = []
    for i, data in enumerate(datas):
        (work / f"in{i}").write_bytes(data)
        args += ["--input", str(work / f"in{i}")]
    if not any(sizes):  # every input empty: Braid rightly refuses that stream unless told it is meant (exit 5)
        args.append("--allow-empty")
    made = repo.run("backup", "--name", "pipes", "--chunk-size", "64KiB", *args)
    tally.cases += 1
    if made.code != 0:
        tally.lose(f"backup of {count} inputs for a pipes restore: exit {made.code} {made.error}")
        return
    ref = made.stdout.decode().strip()
    outs = [work / f"out{i}" for i in range(count)]
    for out in outs:
        out.unlink(missing_ok=True)
    if rng.random() < 0.5:
        shape = "round-robin"
        command = [sys.executable, str(ROUND_ROBIN), "read", str(rng.choice([4096, 65536])), *[f"{{pipe{i + 1}}}={o}" for i, o in enumerate(outs)]]
    else:
        shape = "sequential"
        command = ["sh", "-c", "; ".join(f"cat {{pipe{i + 1}}} > {o}" for i, o in enumerate(outs))]
    try:
        done = repo.run("restore", ref, "--pipes", "--", *command, timeout=HANG)
    except subprocess.TimeoutExpired:
        tally.hang(f"restore --pipes of {sizes} to a {shape} reader")
        return
    got = [o.read_bytes() if o.exists() else None for o in outs]
    if done.code != 0 or got != datas:
        tally.lose(f"restore --pipes of {sizes} to a {shape} reader: exit {done.code} {done.error}; sizes {[None if g is None else len(g) for g in got]}")
    repo.run("forget", ref)


def consumer_kill(repo: LocalRepo, rng: random.Random, tally: Tally, ref: str, size: int) -> None:
    work = repo.root / "consumer"
    work.mkdir(exist_ok=True)
    for name in ("pid", "count", "progress", "go"):
        (work / name).unlink(missing_ok=True)
    script = work / "slow.py"
    script.write_text(_CONSUMER)
    pause_at = rng.randint(1, max(1, size - 1))
    pipes = rng.random() < 0.5
    argv = [str(BRAID), "restore", ref, *(["--pipes"] if pipes else []), "--", sys.executable, str(script)]
    argv += [str(work / n) for n in ("pid", "count", "progress")] + [str(pause_at), str(work / "go")] + (["{pipe1}"] if pipes else [])
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=repo.env)
    tally.cases += 1
    until = time.monotonic() + HANG
    while _int(work / "progress") < pause_at and proc.poll() is None and time.monotonic() < until:
        time.sleep(0.02)
    if proc.poll() is not None:
        return  # it ended before the point (a tiny backup): no kill landed
    if time.monotonic() >= until:
        proc.kill()
        proc.wait()
        tally.hang(f"restore {'--pipes ' if pipes else ''}-- COMMAND never reached byte {pause_at} of {size}")
        return
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    tally.kills += 1
    (work / "go").write_text("go")  # a consumer still alive now reads on to the end it is handed
    consumer = _int(work / "pid")
    while consumer and _alive(consumer) and time.monotonic() < until:
        time.sleep(0.02)
    if consumer and _alive(consumer):
        os.kill(consumer, signal.SIGKILL)
        tally.hang(f"the consumer of a SIGKILLed restore at byte {pause_at} of {size} outlived it")
    if (work / "count").exists():
        tally.lose(f"the consumer of a SIGKILLed restore{' --pipes' if pipes else ''} saw an end after {(work / 'count').read_text()} of {size} bytes")


def linger(repo: LocalRepo, rng: random.Random, tally: Tally) -> None:
    work = repo.root / "linger"
    work.mkdir(exist_ok=True)
    source = work / "src"
    source.write_bytes(pattern(rng.randint(1, 300_000), rng.randrange(1 << 30)))
    pid_file = work / "pid"
    pid_file.unlink(missing_ok=True)
    held = rng.randint(1, 2)
    script = f"cat {source} > {{pipe{3 - held}}}; sh -c 'echo $$ > {pid_file}; exec sleep 600' 3>{{pipe{held}}} >/dev/null 2>&1 & exit 0"
    tally.cases += 1
    try:
        done = repo.run("backup", "--name", "linger", "--pipes", "2", "--", "sh", "-c", script, timeout=HANG)
    except subprocess.TimeoutExpired:
        tally.hang("backup --pipes with a process holding a pipe after the command exited")
        return
    finally:
        if pid_file.exists() and _int(pid_file):
            try:
                os.kill(_int(pid_file), signal.SIGKILL)
            except ProcessLookupError:
                pass
    listed, _ = repo.listed()
    if done.code != 0 and done.code != 11 or any(ref.startswith("linger@") for ref in listed):
        tally.lose(f"backup --pipes with pipe{held} held open: exit {done.code} {done.error}; listed {listed}")
    elif done.code == 0:
        tally.lose(f"backup --pipes with pipe{held} held open was published: {done.stdout.decode().strip()}")
