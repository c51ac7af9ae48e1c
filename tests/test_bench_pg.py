"""scripts/bench pg's pure parts: paired medians and ratios, the archive backlog's samples, the recovery log, --pg-rows.

PostgreSQL and pgBackRest are not needed (the bench itself runs them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from bench_lib.benchmarks.pg import _rows  # noqa: E402
from bench_lib.pg_figures import backlog, lsn, paired, recovery_ended, redo_done  # noqa: E402

# Lines as PostgreSQL 15.18 logs an archive recovery that ends at the end of the archive and promotes.
RECOVERY_LOG = """\
2026-11-29 00:40:01.120 UTC [4242] LOG:  starting archive recovery
2026-11-29 00:40:01.300 UTC [4242] LOG:  restored log file "000000010000000000000004" from archive
2026-11-29 00:40:01.310 UTC [4242] LOG:  redo starts at 0/4000028
2026-11-29 00:40:01.900 UTC [4240] LOG:  database system is ready to accept read-only connections
2026-11-29 00:40:09.210 UTC [4242] LOG:  redo done at 0/4A000060 system usage: CPU: user: 3.10 s, system: 0.81 s, elapsed: 7.90 s
2026-11-29 00:40:09.400 UTC [4242] LOG:  selected new timeline ID: 2
2026-11-29 00:40:09.500 UTC [4242] LOG:  archive recovery complete
2026-11-29 00:40:09.610 UTC [4240] LOG:  database system is ready to accept connections
"""


def test_a_wal_position_is_its_byte_offset() -> None:
    assert lsn("0/4A000060") == 0x4A000060
    assert lsn(" 1/0 ") == 1 << 32
    assert lsn("FFFFFFFF/FFFFFFFF") == 2**64 - 1
    for bad in ("", "4A000060", "0/", "0/G", "0/123456789"):
        with pytest.raises(ValueError, match="not a WAL position"):
            lsn(bad)


def test_recovery_ends_at_the_read_write_line_not_the_hot_standbys() -> None:
    standby_only = RECOVERY_LOG.split("2026-11-29 00:40:09.210")[0]
    assert not recovery_ended(standby_only)
    assert redo_done(standby_only) is None
    assert recovery_ended(RECOVERY_LOG)
    assert redo_done(RECOVERY_LOG) == 0x4A000060
    assert redo_done(RECOVERY_LOG + "... LOG:  redo done at 0/5000028 system usage\n") == 0x5000028  # the last one counts


def test_a_pair_gives_medians_bests_and_pgbackrests_time_over_braids() -> None:
    assert paired("restore", [4.0, 2.0, 3.0], [6.0, 3.3, 9.0]) == {
        "restore_braid_median_s": 3.0,
        "restore_pgbackrest_median_s": 6.0,
        "restore_braid_best_s": 2.0,
        "restore_pgbackrest_best_s": 3.3,
        "restore_ratio_median": 2.0,
        "restore_ratio_best": 1.65,
        "restore_reps": 3,
    }
    assert paired("backup", [2.0, 4.0], [3.0, 3.0])["backup_ratio_median"] == 1.0  # an even count: the mean of the middle two


@pytest.mark.parametrize(("braid", "pgbackrest", "message"), [
    ([], [], "got 0 and 0"),
    ([1.0], [1.0, 2.0], "got 1 and 2"),
    ([1.0, 0.0], [1.0, 2.0], "0 seconds"),
])
def test_pairs_that_cannot_be_compared_are_refused(braid: list[float], pgbackrest: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=f"recovery: .*{message}"):
        paired("recovery", braid, pgbackrest)


def test_the_backlog_is_the_max_p99_and_mean_of_the_samples() -> None:
    samples = "\n".join(["0"] * 90 + ["1"] * 8 + ["3", "9"]) + "\n\n"
    assert backlog(samples) == {
        "max_archive_backlog_segments": 9,
        "p99_archive_backlog_segments": 3,
        "mean_archive_backlog_segments": 0.2,
        "archive_backlog_samples": 100,
    }
    assert backlog("2")["p99_archive_backlog_segments"] == 2


@pytest.mark.parametrize(("text", "message"), [("", "no backlog sample"), ("\n \n", "no backlog sample"), ("1\nx\n", "not a count: 'x'"), ("-1", "not a count")])
def test_a_backlog_without_counts_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        backlog(text)


def test_pg_rows_are_checked() -> None:
    assert _rows("pitr") == ["pitr"]
    assert _rows(" archive , pitr ") == ["archive", "pitr"]
    for bad in ("", "restore", "archive,,x"):
        with pytest.raises(argparse.ArgumentTypeError, match="--pg-rows"):
            _rows(bad)
