"""The monthly storage bill of a retention policy, with and without storage classes and incrementals (scripts/bench cloud-model).

The policy: a 1 TiB database backed up daily, every daily kept 30 days and
one backup a month kept a year (`--keep-daily 30 --keep-monthly 12`). In
steady state that is 30 dailies plus 11 monthlies older than the window.
Stored bytes per full are the database's size times `ratio` (1.0: before
compression, as the issue's "$700 a month for 30 dailies" counts). A month
is 30 days, as S3's pro-rated minimum-duration charge counts them
(braid.format.storage_class).

Incrementals (the issue "Incremental backup chains"): a weekly full and six
daily incrementals, each `fraction` of a full (measured 0.019 for the first
incremental after a 1 % change, docs/design/incremental-chains.md). A kept
backup keeps its whole chain (`lifetimes` says for how long each is kept).

A storage class applies to backups older than `after_days`. Moved after 30
days (the daily window), a chain's older items move too, kept only until
the chain's newest leaves the window, and are deleted within days: the rest
of the class's minimum is charged. Moved after 37 days (the window plus a
chain), only the monthlies' chains move. Full backups moved after 1 day
spend 29 days in the class and are deleted short of its minimum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DAILY = 30  # days the dailies are kept (--keep-daily 30)
MONTHLIES = 12  # --keep-monthly 12: 11 of them older than the daily window
CHAIN = 7  # a weekly full and six daily incrementals
DAYS_PER_MONTH = 30
INCREMENTAL_FRACTION = 0.019  # docs/design/incremental-chains.md: first incremental's stored bytes over the full's
FRACTIONS = (0.005, 0.01, 0.019, 0.027, 0.05, 0.10)  # the sensitivity table's range
MIN_DAYS = {"STANDARD": 0, "STANDARD_IA": 30, "GLACIER_IR": 90}
PRICE_KEYS = {"STANDARD": "s3_storage_gb_month", "STANDARD_IA": "s3_standard_ia_gb_month", "GLACIER_IR": "s3_glacier_ir_gb_month"}

# (scenario, incrementals?, class, after_days)
SCENARIOS: Sequence[tuple[str, bool, str, int]] = (
    ("daily fulls, all Standard", False, "STANDARD", 0),
    ("daily fulls, STANDARD_IA after 30 d", False, "STANDARD_IA", 30),
    ("daily fulls, GLACIER_IR after 30 d", False, "GLACIER_IR", 30),
    ("daily fulls, GLACIER_IR after 1 d (early deletions)", False, "GLACIER_IR", 1),
    ("weekly full + daily incrementals, all Standard", True, "STANDARD", 0),
    ("weekly full + daily incrementals, STANDARD_IA after 37 d", True, "STANDARD_IA", 37),
    ("weekly full + daily incrementals, GLACIER_IR after 37 d", True, "GLACIER_IR", 37),
    ("weekly full + daily incrementals, GLACIER_IR after 30 d (transient ancestors)", True, "GLACIER_IR", 30),
)


def lifetimes(incremental: bool, *, fraction: float, full_gib: float) -> tuple[list[tuple[float, int]], int]:
    """(GiB, days kept) of every backup made over a whole number of months in steady state, and that number of months.

    Daily fulls, one month: 29 dailies kept 30 days, and the month's monthly kept 12 months. Weekly chains, seven
    months (30 chains): item p (0 the full) is kept until the chain's last day leaves the window (36 - p days);
    seven of the chains hold a monthly restore point, one at each position q, which keeps items 0..q for 12
    months from q's day (q + 360 - p days).
    """
    year = MONTHLIES * DAYS_PER_MONTH
    if not incremental:
        return [(full_gib, DAILY)] * (DAYS_PER_MONTH - 1) + [(full_gib, year)], 1
    months = CHAIN
    items = []
    for chain in range(months * DAYS_PER_MONTH // CHAIN):
        point = chain if chain < CHAIN else None
        for p in range(CHAIN):
            kept = DAILY + CHAIN - 1 - p
            if point is not None and p <= point:
                kept = point + year - p
            items.append((full_gib if p == 0 else full_gib * fraction, kept))
    return items, months


def scenario_cost(prices: Mapping[str, float], incremental: bool, storage_class: str, after_days: int, *, fraction: float, full_gib: float) -> dict[str, float]:
    """Average GiB in Standard and in the class, the early-deletion charge a month, and the total a month, for one scenario.

    A backup kept longer than `after_days` spends those days in Standard and the rest in the class; deleted
    short of the class's minimum, the rest of the minimum is charged at the class's price.
    """
    std, cls = prices[PRICE_KEYS["STANDARD"]], prices[PRICE_KEYS[storage_class]]
    items, months = lifetimes(incremental, fraction=fraction, full_gib=full_gib)
    std_gib_days = cls_gib_days = early_gib_days = 0.0
    for gib, kept in items:
        if storage_class == "STANDARD" or kept <= after_days:
            std_gib_days += gib * kept
            continue
        in_class = kept - after_days
        std_gib_days += gib * after_days
        cls_gib_days += gib * in_class
        early_gib_days += gib * max(0, MIN_DAYS[storage_class] - in_class)
    days = months * DAYS_PER_MONTH
    standard_gib, class_gib = std_gib_days / days, cls_gib_days / days
    early = early_gib_days * cls / DAYS_PER_MONTH / months
    return {
        "standard_gib": round(standard_gib, 1),
        "class_gib": round(class_gib, 1),
        "early_deletion_per_month": round(early, 2),
        "per_month": round(standard_gib * std + class_gib * cls + early, 2),
    }


def policy_rows(prices: Mapping[str, float], *, fraction: float = INCREMENTAL_FRACTION, ratio: float = 1.0, database_gib: float = 1024.0) -> list[dict[str, Any]]:
    """One row per scenario: its inputs and `scenario_cost`'s figures (USD at `prices`)."""
    rows = []
    for name, incremental, storage_class, after_days in SCENARIOS:
        cost = scenario_cost(prices, incremental, storage_class, after_days, fraction=fraction, full_gib=database_gib * ratio)
        rows.append({
            "scenario": name, "class": storage_class, "after_days": after_days,
            "incremental_fraction": fraction if incremental else None, **cost,
        })
    return rows


def sensitivity_rows(prices: Mapping[str, float], *, ratio: float = 1.0, database_gib: float = 1024.0) -> list[dict[str, Any]]:
    """The incremental rows' monthly cost as the incremental fraction varies over FRACTIONS."""
    rows = []
    for f in FRACTIONS:
        row: dict[str, Any] = {"incremental_fraction": f}
        for name, incremental, storage_class, after_days in SCENARIOS:
            if incremental:
                row[name] = scenario_cost(prices, True, storage_class, after_days, fraction=f, full_gib=database_gib * ratio)["per_month"]
        rows.append(row)
    return rows
