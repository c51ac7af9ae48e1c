"""Measuring: wall and CPU time of in-process code and of child processes.

The machine is noisy and small, so every comparison interleaves the runs of
ours and the reference (alternating which goes first) and keeps every
repetition; the report takes the best and the median of each side. CPU time
(user + system) is measured alongside wall time: for a single-threaded
workload it is the steadier figure.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Sample:
    wall: float  # seconds
    cpu: float  # user + system seconds (own process or the child and all it waited for)
    max_rss: int = 0  # KiB, children only
    started_at: float = 0.0  # epoch seconds when a child command started (0 for in-process code)

    def __post_init__(self) -> None:
        if self.wall <= 0:
            raise ValueError("a measured run took no time")


@dataclass
class Series:
    """Every repetition of one side of a comparison."""

    samples: list[Sample] = field(default_factory=list)

    def add(self, sample: Sample) -> Sample:
        self.samples.append(sample)
        return sample

    @property
    def best_wall(self) -> float:
        return min(s.wall for s in self.samples)

    @property
    def median_wall(self) -> float:
        return statistics.median(s.wall for s in self.samples)

    @property
    def best_cpu(self) -> float:
        return min(s.cpu for s in self.samples)

    @property
    def median_cpu(self) -> float:
        return statistics.median(s.cpu for s in self.samples)

    @property
    def max_rss(self) -> int:
        return max((s.max_rss for s in self.samples), default=0)


def measure(fn: Callable[[], object]) -> tuple[Sample, object]:
    """Run `fn` in this process: wall time and this process's CPU time (all threads)."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = fn()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return Sample(wall, cpu), result


class CommandFailed(RuntimeError):
    pass


_SPAWN = Path(__file__).with_name("spawn.py")


def run_command(
    argv: Sequence[str],
    *,
    stdin: Path | None = None,
    stdout: Path | None = None,
    stderr: Path | None = None,
    env: dict[str, str] | None = None,
) -> Sample:
    """Run one command (for a pipeline, `bash -c`): wall time, CPU time and peak RSS.

    The command runs under spawn.py, which times it with wait4: the rusage
    covers the command and every descendant it waited for (a whole `bash -c
    'a | b'` pipeline), and the peak RSS is the command's own (see spawn.py).
    stdout defaults to /dev/null.
    """
    result = Path(tempfile.mkstemp(prefix="braid-bench-", suffix=".json")[1])
    try:
        with _open(stdin, "rb") as fin, _open(stdout, "wb") as fout, _open(stderr, "ab") as ferr:
            code = subprocess.call([sys.executable, str(_SPAWN), str(result), "--", *argv], stdin=fin, stdout=fout, stderr=ferr, env=env)
        if code != 0:
            where = f"; see {stderr}" if stderr else ""
            raise CommandFailed(f"{' '.join(argv)} exited with {code}{where}")
        doc = json.loads(result.read_text())
    finally:
        result.unlink(missing_ok=True)
    return Sample(doc["wall"], doc["cpu"], doc["max_rss"], doc.get("started_at", 0.0))


def _open(path: Path | None, mode: str):
    if path is None:
        return open(os.devnull, mode)
    return open(path, mode)


def warm_page_cache(path: Path) -> None:
    """Read a file through the page cache, so the next side reads it from memory.

    braid drops its input's pages as it reads them (a database's files must
    not evict the database's own cache), so without this whichever side
    runs after braid would read the data set from disk, and braid's ratio
    would gain what the other side lost.
    """
    with open(path, "rb", buffering=0) as handle:
        while handle.read(8 << 20):
            pass


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU-seconds a running process (all its threads) has used so far, from /proc/PID/stat.

    For a server the benchmark started but does not wait for (s3proxy): the
    difference across one run is what the server spent on it.
    """
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drop_dirty_pages() -> None:
    """Flush written data between runs so one run's writeback does not bill the next."""
    os.sync()


def interleave(reps: int, sides: Sequence[Callable[[], None]]) -> None:
    """Run each side once per repetition, rotating which goes first."""
    for rep in range(reps):
        order = list(sides[rep % len(sides) :]) + list(sides[: rep % len(sides)])
        for side in order:
            side()
