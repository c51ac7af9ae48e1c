"""S3 storage classes for old backups' chunks: the policy, the move record, and what they cost.

A backup's chunks (everything under `data/NAME/ID/`) may move from S3
Standard to STANDARD_IA or GLACIER_IR once the backup is `after_days` old:
both are read with a plain GET, no restore request. Manifests, the catalog,
policies and staging always stay in Standard. The policy is a name's stored
policy (`"storage": {"class": "GLACIER_IR", "after_days": 30}`,
braid.format.policy) or the stack's `braid:storageClass` context
(`CLASS:DAYS`, as `--storage-class` spells it too).

The mover writes a record when every chunk of a backup has moved
(`storage/NAME/ID/STAMP~CLASS`, braid.format.layout): readers take a
backup's class and the day it moved from there and never recompute it from
ages. No record: the chunks are in Standard (on S3), or on local disk.

Minimum storage durations, from the S3 storage class documentation
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/storage-class-intro.html,
"Storage classes for infrequently accessed objects": STANDARD_IA 30 days,
GLACIER_IR 90 days) and the S3 pricing page
(https://aws.amazon.com/s3/pricing/, footnotes: "Objects that are deleted,
overwritten, or transitioned to a different storage class before [the
minimum] will incur a pro-rated charge equal to the storage charge for the
remaining days"). Prices and their date: docs/design/2026-11-28-storage-classes.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from braid.errors import UsageError

STANDARD = "STANDARD"
STANDARD_IA = "STANDARD_IA"
GLACIER_IR = "GLACIER_IR"
LOCAL = "local"  # a directory repository: no storage classes, no AWS storage bill
MOVABLE = (STANDARD_IA, GLACIER_IR)
# Days an object is billed for at least once it enters the class (see the module's sources).
MIN_DAYS: dict[str, int] = {STANDARD: 0, STANDARD_IA: 30, GLACIER_IR: 90}
# The price table key (braid.format.prices) of a GB-month in each class.
PRICE_KEYS: dict[str, str] = {STANDARD: "s3_storage_gb_month", STANDARD_IA: "s3_standard_ia_gb_month", GLACIER_IR: "s3_glacier_ir_gb_month"}
# A GB-month is billed as 30 days in the pro-rated early-deletion charge (the pricing page's examples).
DAYS_PER_MONTH = 30
MAX_AFTER_DAYS = 36500
GB = 2**30


class StorageClassError(UsageError):
    """A storage class asked of a store that has none (a directory repository), or a policy that names no usable class.

    A usage error (exit 2): nothing is wrong with the repository; the request cannot apply to it.
    """


@dataclass(frozen=True)
class StoragePolicy:
    """Move a backup's chunks to `storage_class` once it is `after_days` old (counted from its start)."""

    storage_class: str
    after_days: int

    def __post_init__(self) -> None:
        if self.storage_class not in MOVABLE:
            raise UsageError(f"storage class must be one of {', '.join(MOVABLE)} (restorable without a restore request), not {self.storage_class!r}")
        if isinstance(self.after_days, bool) or not isinstance(self.after_days, int) or not 0 <= self.after_days <= MAX_AFTER_DAYS:
            raise UsageError(f"the days before a move must be a whole number from 0 to {MAX_AFTER_DAYS}, not {self.after_days!r}")

    @classmethod
    def parse(cls, text: str) -> StoragePolicy:
        """`CLASS:DAYS`, e.g. `GLACIER_IR:30` (`--storage-class`, the `braid:storageClass` context)."""
        storage_class, colon, days = text.strip().partition(":")
        if not colon or not days.isdigit():
            raise UsageError(f"a storage class policy is CLASS:DAYS, e.g. STANDARD_IA:30 or GLACIER_IR:90, not {text!r}")
        return cls(storage_class.upper(), int(days))

    def __str__(self) -> str:
        return f"{self.storage_class}:{self.after_days}"

    def to_json(self) -> dict[str, Any]:
        return {"class": self.storage_class, "after_days": self.after_days}

    @classmethod
    def from_json(cls, doc: Any) -> StoragePolicy:
        if not isinstance(doc, dict) or set(doc) != {"class", "after_days"}:
            raise UsageError('storage must be {"class": CLASS, "after_days": DAYS}')
        if not isinstance(doc["class"], str):
            raise UsageError(f"storage class must be text, not {doc['class']!r}")
        return cls(doc["class"], doc["after_days"])

    def due(self, started: datetime, now: datetime) -> bool:
        """A backup started at `started` is old enough to move at `now`."""
        return (now - started).total_seconds() >= self.after_days * 86400


@dataclass(frozen=True)
class Placement:
    """Where a backup's chunks are: a class, and since when (None: since they were written)."""

    storage_class: str
    since: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {"class": self.storage_class, "since": self.since.isoformat().replace("+00:00", "Z") if self.since else None}


def remaining_days(storage_class: str, since: datetime | None, now: datetime) -> float:
    """Days of the class's minimum storage duration still to run at `now` (0 once served; 0 for Standard)."""
    minimum = MIN_DAYS.get(storage_class, 0)
    if not minimum or since is None:
        return 0.0
    served = (now - since).total_seconds() / 86400
    return max(0.0, minimum - served)


def monthly_cost(stored_bytes: int, storage_class: str, prices: Any) -> float:
    """A month of `stored_bytes` in `storage_class`, with a price table's prices (a mapping of price key to price)."""
    return stored_bytes / GB * float(prices[PRICE_KEYS[storage_class]])


def early_deletion_charge(stored_bytes: int, placement: Placement, now: datetime, prices: Any) -> float:
    """What deleting the chunks at `now` adds: the storage of the minimum duration's remaining days, pro rata."""
    days = remaining_days(placement.storage_class, placement.since, now)
    return monthly_cost(stored_bytes, placement.storage_class, prices) * days / DAYS_PER_MONTH if days else 0.0
