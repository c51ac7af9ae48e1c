"""Object Lock: how long a backup's objects are immutable, and which objects are.

A repository on an S3 bucket with Object Lock enabled may say, in its
config.json (`object_lock`), that every backup is retained for DAYS in a
MODE (S3's GOVERNANCE or COMPLIANCE). Writers then put each object a
backup's restore needs (its chunks and its manifest) with that retention,
and prune and forget leave a backup alone until its date.

The date is the backup's start (the UTC time its id records) plus DAYS, not
each object's write time plus DAYS, because then:
  - every object of a backup carries one date, so whoever asks "may this
    backup go?" computes it from the id and the repository's setting, with
    no request per chunk (prune plans thousands of backups; a HEAD per
    chunk of each would cost more than the prune);
  - a manifest re-written by `braid rekey` years later keeps its backup's
    date, instead of outliving its chunks;
  - it is what a user means by "keep every backup 30 days".
A write whose date would not lie at least MIN_REMAINING ahead (a backup that
ran for almost DAYS) is retained until write time + MIN_REMAINING instead:
S3 refuses a retain-until date in the past, and a backup that cannot be
written is worse than one whose last objects stay a day longer.

Only chunks and manifests are locked. Staging (plaintext, removed once a
backup is published), leases, catalog records, policies, rekey's copies and
held records must stay deletable; config.json is replaced by rekey.
No bucket-default retention is set (see infra/braid_infra/storage.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.format.layout import DATA, LEASE, ref_from_manifest_key, ref_under

MODES = ("GOVERNANCE", "COMPLIANCE")
MAX_DAYS = 36500  # S3's limit on a retention period (100 years)
MIN_REMAINING = timedelta(days=1)


@dataclass(frozen=True)
class ObjectLock:
    """A repository's retention setting: every backup immutable for `days` from its start, in `mode`."""

    mode: str
    days: int

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"object lock mode {self.mode!r}: expected GOVERNANCE or COMPLIANCE")
        if isinstance(self.days, bool) or not isinstance(self.days, int) or not 1 <= self.days <= MAX_DAYS:
            raise UsageError(f"object lock days {self.days!r}: expected a whole number of days from 1 to {MAX_DAYS}")

    @classmethod
    def parse(cls, text: str) -> ObjectLock:
        """`MODE:DAYS` (`GOVERNANCE:30`), the form of the stack output and the Lambda environment."""
        mode, sep, days = text.strip().partition(":")
        if not sep or not days.strip().isdigit():
            raise UsageError(f"object lock {text!r}: expected MODE:DAYS, e.g. GOVERNANCE:30")
        return cls(mode.strip().upper(), int(days))

    @classmethod
    def from_json(cls, doc: Any) -> ObjectLock:
        """`{"mode": "GOVERNANCE", "days": 30}` (config.json, the CDK context)."""
        if not isinstance(doc, dict) or set(doc) != {"mode", "days"}:
            raise UsageError(f"object lock {doc!r}: expected {{\"mode\": \"GOVERNANCE\"|\"COMPLIANCE\", \"days\": N}}")
        mode = doc["mode"]
        return cls(mode.upper() if isinstance(mode, str) else mode, doc["days"])

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "days": self.days}

    def __str__(self) -> str:
        return f"{self.mode}:{self.days}"

    def until(self, ref: BackupRef) -> datetime:
        """When `ref`'s objects may be removed: its start plus the days, to the second."""
        return (ref.started + timedelta(days=self.days)).replace(microsecond=0)

    def retain_until(self, ref: BackupRef, now: datetime | None = None) -> datetime:
        """The date a write of one of `ref`'s objects carries now (never less than MIN_REMAINING ahead)."""
        moment = (now or datetime.now(UTC)).astimezone(UTC)
        floor = (moment + MIN_REMAINING).replace(microsecond=0)
        return max(self.until(ref), floor)

    def holds(self, ref: BackupRef, now: datetime) -> bool:
        """Whether `ref` is still under retention at `now`."""
        return self.until(ref) > now


def locked_ref(key: str) -> BackupRef | None:
    """The backup whose restore needs the object at `key` (a chunk or a manifest), or None.

    Any object under `data/NAME/ID/` but the lease is the backup's stored
    data, whatever its name (single chunks today, packed objects tomorrow).
    """
    ref = ref_from_manifest_key(key)
    if ref is not None:
        return ref
    if key.endswith(f"/{LEASE}"):
        return None
    return ref_under(DATA, key)
