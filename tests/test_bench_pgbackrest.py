"""scripts/bench incremental's pgBackRest side: reading `pgbackrest info --output=json`, the week's ratios, the daily change.

Pure functions only: pgBackRest and PostgreSQL 15 are not needed (the bench itself runs them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from bench_lib.pgbackrest_incremental import StoredBackup, changed_range, stored_backups, week_ratios  # noqa: E402


def _backup(label: str, kind: str, delta: int, size: int) -> dict:
    """One backup as pgBackRest 2.45 reports it (fields trimmed from a real `info --output=json`)."""
    return {
        "archive": {"start": "000000010000000000000005", "stop": "000000010000000000000005"},
        "backrest": {"format": 5, "version": "2.45"},
        "info": {"delta": size // 2, "repository": {"delta": delta, "size": delta * 3}, "size": size},
        "label": label,
        "type": kind,
    }


def _info(*stanzas: tuple[str, list[dict]]) -> str:
    return json.dumps([{"name": name, "backup": backups, "status": {"code": 0, "message": "ok"}} for name, backups in stanzas])


FULL = "20261128-144218F"
INCR1 = "20261128-144218F_20261128-144223I"
INCR2 = "20261128-144218F_20261128-144225I"


def test_the_stored_bytes_are_each_backups_repository_delta_oldest_first() -> None:
    text = _info(
        ("other", [_backup("20261127-000000F", "full", 1, 1)]),
        ("bench", [_backup(INCR2, "incr", 1_432_112, 71_000_000), _backup(FULL, "full", 4_241_632, 71_600_000), _backup(INCR1, "incr", 1_514_016, 71_636_700)]),
    )
    assert stored_backups(text, "bench") == [
        StoredBackup(FULL, "full", 4_241_632, 71_600_000),
        StoredBackup(INCR1, "incr", 1_514_016, 71_636_700),
        StoredBackup(INCR2, "incr", 1_432_112, 71_000_000),
    ]


def test_a_missing_stanza_or_field_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="no stanza 'bench'"):
        stored_backups(_info(("other", [])), "bench")
    broken = _backup(FULL, "full", 1, 1)
    del broken["info"]["repository"]
    with pytest.raises(ValueError, match="stanza 'bench' lacks 'repository'"):
        stored_backups(_info(("bench", [broken])), "bench")
    with pytest.raises(ValueError, match="no stanza"):
        stored_backups("{}", "bench")


def test_the_week_ratios_compare_the_two_chains_and_each_with_its_own_full() -> None:
    facts = week_ratios([1000, 20, 30], [4000, 1600, 2400])
    assert facts == {
        "pgbackrest_full_stored_bytes": 4000,
        "pgbackrest_incrementals_stored_bytes": 4000,
        "braid_full_stored_bytes": 1000,
        "braid_incrementals_stored_bytes": 50,
        "pgbackrest_first_incremental_over_full": 0.4,
        "pgbackrest_incrementals_over_fulls": 0.5,
        "braid_incrementals_over_fulls": 0.025,
        "braid_incrementals_over_pgbackrest_incrementals": 0.0125,
        "braid_full_over_pgbackrest_full": 0.25,
    }


@pytest.mark.parametrize(("braid", "pgbackrest", "message"), [
    ([1000], [4000], "need a full and the same number"),
    ([1000, 20], [4000, 1, 2], "got 2 and 3"),
    ([1000, 0], [4000, 10], "0 bytes"),
])
def test_chains_that_cannot_be_compared_are_refused(braid: list[int], pgbackrest: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        week_ratios(braid, pgbackrest)


def test_each_day_changes_one_percent_contiguous_and_no_two_days_overlap() -> None:
    rows, days = 5_000_000, 7
    ranges = [changed_range(day, days, rows) for day in range(1, days + 1)]
    assert all(last - first + 1 == rows // 100 for first, last in ranges)
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert ranges[0][0] >= 1 and ranges[-1][1] <= rows
    assert changed_range(1, 7, 5_000_000) == (555_556, 605_555)  # the aids the recorded PostgreSQL 18 week changed
