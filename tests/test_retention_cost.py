"""scripts/bench cloud-model's retention-policy rows, recomputed independently, day by day.

The model (bench_lib.retention_cost) sums each backup's lifetime; this test
walks the calendar instead: each day it bills every backup alive that day
in the class its age puts it in, and at each deletion the days still short
of the class's minimum (S3's pro rata). Prices are the us-east-1 list prices
written here (docs/design/2026-11-28-storage-classes.md), not read from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from bench_lib import retention_cost  # noqa: E402
from bench_lib.benchmarks.cloud_model import policy_tables  # noqa: E402

PRICE = {"STANDARD": 0.023, "STANDARD_IA": 0.0125, "GLACIER_IR": 0.004}
MINIMUM = {"STANDARD": 0, "STANDARD_IA": 30, "GLACIER_IR": 90}
TIB = 1024.0


def calendar(incremental: bool, fraction: float) -> list[tuple[int, float, int]]:
    """(day made, GiB, day deleted) of every backup over 3 years: daily, a weekly full when incremental; dailies
    kept 30 days, the last backup of each 30-day month kept 360 days, and every backup an kept one builds on."""
    days = 3 * 360
    size = [TIB if not incremental or day % 7 == 0 else TIB * fraction for day in range(days)]
    until = [day + 30 for day in range(days)]
    for day in range(29, days, 30):  # the month's monthly
        until[day] = day + 360
    if incremental:  # a kept incremental keeps its chain back to the full
        for day in range(days):
            for parent in range(day - day % 7, day):
                until[parent] = max(until[parent], until[day])
    return [(day, size[day], until[day]) for day in range(days)]


def month_bill(incremental: bool, storage_class: str, after: int, fraction: float = 0.019) -> float:
    """The bill of days 720..1079 (steady state), divided into 30-day months."""
    backups = calendar(incremental, fraction)
    first, last = 720, 1080
    bill = 0.0
    for day in range(first, last):
        for made, gib, gone in backups:
            if made <= day < gone:
                age = day - made
                where = storage_class if storage_class != "STANDARD" and age >= after else "STANDARD"
                bill += gib * PRICE[where] / 30
            if gone == day and storage_class != "STANDARD" and gone - made > after:
                short = MINIMUM[storage_class] - (gone - made - after)
                bill += gib * PRICE[storage_class] * max(0, short) / 30
    return bill / ((last - first) / 30)


def test_daily_fulls_cost_what_41_fulls_do_and_the_classes_cut_it() -> None:
    rows = {row["scenario"]: row for row in retention_cost.policy_rows(PRICE_TABLE)}
    assert rows["daily fulls, all Standard"]["per_month"] == pytest.approx(41 * TIB * 0.023, abs=0.01)  # 30 dailies + 11 monthlies
    assert rows["daily fulls, STANDARD_IA after 30 d"]["per_month"] == pytest.approx(30 * TIB * 0.023 + 11 * TIB * 0.0125, abs=0.01)
    assert rows["daily fulls, GLACIER_IR after 30 d"]["per_month"] == pytest.approx(30 * TIB * 0.023 + 11 * TIB * 0.004, abs=0.01)
    # After a day: 1 day Standard and 29 in GLACIER_IR each; 29 deletions a month each charged the 61 days short of 90.
    after_a_day = TIB * 0.023 + 40 * TIB * 0.004 + 29 * TIB * 0.004 * 61 / 30
    assert rows["daily fulls, GLACIER_IR after 1 d (early deletions)"]["per_month"] == pytest.approx(after_a_day, abs=0.01)


PRICE_TABLE = {"s3_storage_gb_month": 0.023, "s3_standard_ia_gb_month": 0.0125, "s3_glacier_ir_gb_month": 0.004}


@pytest.mark.parametrize(("name", "incremental", "storage_class", "after"), list(retention_cost.SCENARIOS))
def test_every_row_matches_a_day_by_day_bill(name: str, incremental: bool, storage_class: str, after: int) -> None:
    (row,) = [r for r in retention_cost.policy_rows(PRICE_TABLE) if r["scenario"] == name]
    assert row["per_month"] == pytest.approx(month_bill(incremental, storage_class, after), rel=0.002), name
    assert row["incremental_fraction"] == (0.019 if incremental else None)


def test_the_incremental_rows_move_with_the_fraction_as_a_day_by_day_bill_does() -> None:
    for row in retention_cost.sensitivity_rows(PRICE_TABLE):
        f = row["incremental_fraction"]
        assert row["weekly full + daily incrementals, all Standard"] == pytest.approx(month_bill(True, "STANDARD", 0, f), rel=0.002)
        assert row["weekly full + daily incrementals, GLACIER_IR after 37 d"] == pytest.approx(month_bill(True, "GLACIER_IR", 37, f), rel=0.002)
    standard = [row["weekly full + daily incrementals, all Standard"] for row in retention_cost.sensitivity_rows(PRICE_TABLE)]
    assert standard == sorted(standard) and 0.019 in retention_cost.FRACTIONS


def test_cloud_model_carries_the_rows_in_its_tables_and_json() -> None:
    policy, sensitivity = policy_tables()
    doc = policy.to_json()
    assert "1 TiB database, dailies kept 30 days, monthlies a year" in doc["title"]
    assert [row["scenario"] for row in doc["rows"]] == [name for name, *_ in retention_cost.SCENARIOS]
    assert doc["rows"][0]["per_month"] == pytest.approx(41 * TIB * 0.023, abs=0.01)
    assert [row["incremental_fraction"] for row in sensitivity.to_json()["rows"]] == list(retention_cost.FRACTIONS)
