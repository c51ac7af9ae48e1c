"""scripts/bench pg's pure parts: paired medians and ratios, the archive backlog's samples, PostgreSQL's recovery log.

No PostgreSQL needed (tests/test_bench_pg.py); bench_lib/pg_pitr.py and
bench_lib/pg_archive.sh produce what these read.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_REDO_DONE = re.compile(r"redo done at ([0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8})")
READY = "database system is ready to accept connections"  # PostgreSQL 15 logs it once recovery ended and it promoted


def lsn(text: str) -> int:
    """A WAL position `X/Y` (pg_lsn's text) as a byte offset; ValueError otherwise."""
    match = _LSN.match(text.strip())
    if match is None:
        raise ValueError(f"not a WAL position: {text!r}")
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)


def redo_done(log_text: str) -> int | None:
    """The last `redo done at X/Y` position in a server log (where recovery stopped replaying), or None."""
    found = _REDO_DONE.findall(log_text)
    return lsn(found[-1]) if found else None


def recovery_ended(log_text: str) -> bool:
    """Whether the server log says recovery ended and the server accepts read-write connections (not the hot standby's read-only line)."""
    return READY in log_text


def paired(prefix: str, braid: Sequence[float], pgbackrest: Sequence[float]) -> dict[str, float | int]:
    """The `--json` facts of one interleaved comparison (seconds, lower is better): each side's median and best, the ratios.

    `<prefix>_ratio_median` is pgBackRest's median time over Braid's (above 1: Braid faster),
    `<prefix>_ratio_best` the same of the best runs. Both sides need the same number of runs.
    """
    if not braid or len(braid) != len(pgbackrest):
        raise ValueError(f"{prefix}: need the same number of runs on both sides, got {len(braid)} and {len(pgbackrest)}")
    if min(*braid, *pgbackrest) <= 0:
        raise ValueError(f"{prefix}: a run of 0 seconds was not measured")
    ours, theirs = statistics.median(braid), statistics.median(pgbackrest)
    return {
        f"{prefix}_braid_median_s": round(ours, 3),
        f"{prefix}_pgbackrest_median_s": round(theirs, 3),
        f"{prefix}_braid_best_s": round(min(braid), 3),
        f"{prefix}_pgbackrest_best_s": round(min(pgbackrest), 3),
        f"{prefix}_ratio_median": round(theirs / ours, 3),
        f"{prefix}_ratio_best": round(min(pgbackrest) / min(braid), 3),
        f"{prefix}_reps": len(braid),
    }


def backlog(samples_text: str) -> dict[str, float | int]:
    """The archive backlog from pg_archive.sh's sampler: one count of `.ready` files a line (blank lines ignored).

    ValueError when there is no sample or a line is not a count.
    """
    counts = []
    for line in samples_text.splitlines():
        if line.strip():
            if not line.strip().isdigit():
                raise ValueError(f"backlog sample is not a count: {line!r}")
            counts.append(int(line))
    if not counts:
        raise ValueError("no backlog sample")
    ordered = sorted(counts)
    return {
        "max_archive_backlog_segments": ordered[-1],
        "p99_archive_backlog_segments": ordered[min(len(ordered) - 1, max(0, -(-len(ordered) * 99 // 100) - 1))],
        "mean_archive_backlog_segments": round(sum(counts) / len(counts), 2),
        "archive_backlog_samples": len(counts),
    }
