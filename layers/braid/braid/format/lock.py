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

Archived WAL (each file, pack and history file under `wal/NAME/`) is
locked too, for DAYS from its write: a WAL file is needed only by backups
that started before it was written, whose own dates (start plus DAYS) fall
before its, so the WAL a locked backup needs stays at least as long as the
backup. A rewrite (`braid rekey`) keeps the original's date (`rewrite_until`).
`retention_until` is the one mapping from a key to the date its write carries.
The one exception is a `.history` file: written at its timeline's switch,
before the backups on that timeline start, so each backup's publication
lengthens it to the backup's own date (`history_until`,
braid.ops.wal_history_lock); S3 lets a date grow, never shrink.

Staging (plaintext, removed once a backup is published; `wal-staging/` too),
leases, catalog records, policies, rekey's copies, held records and a WAL
archive's `archive.json` must stay deletable; config.json is replaced by rekey.
No bucket-default retention is set (see infra/braid_infra/storage.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.format.layout import DATA, LEASE, WAL, ref_from_manifest_key, ref_under, wal_file_of_key

MODES = ("GOVERNANCE", "COMPLIANCE")
MAX_DAYS = 36500  # S3's limit on a retention period (100 years)
MIN_REMAINING = timedelta(days=1)
REWRITE_MARGIN = timedelta(minutes=1)  # a rewrite keeps its original's date only when it lies at least this far ahead


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

    def wal_until(self, now: datetime | None = None) -> datetime:
        """The date an archived WAL object written now carries: now plus the days, to the second (never before
        `until` of a backup that started before now)."""
        moment = (now or datetime.now(UTC)).astimezone(UTC)
        return (moment + timedelta(days=self.days)).replace(microsecond=0)

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


def locked_wal(key: str) -> bool:
    """Whether `key` is an archived WAL object: a file (segment, .partial, .backup, .history) or a pack, under `wal/NAME/`."""
    if not key.startswith(WAL):
        return False
    name, slash, rest = key[len(WAL) :].partition("/")
    if not slash:
        return False
    try:
        if wal_file_of_key(name, key) is not None:
            return True
    except UsageError:  # not a backup name
        return False
    from braid.format.wal_pack import pack_members

    directory, slash, base = rest.partition("/")
    return bool(slash) and "/" not in base and pack_members(directory, base) is not None


def retention_until(lock: ObjectLock, key: str, now: datetime | None = None) -> datetime | None:
    """The retain-until date a write of `key` now carries under `lock`: a backup's object its backup's date
    (`retain_until`), an archived WAL object now plus the days (`wal_until`); None for a key that stays deletable."""
    ref = locked_ref(key)
    if ref is not None:
        return lock.retain_until(ref, now)
    if locked_wal(key):
        return lock.wal_until(now)
    return None


def history_until(lock: ObjectLock, ref: BackupRef, now: datetime | None = None) -> datetime:
    """The date the history file of `ref`'s timeline must carry at least when `ref` is published: the date `ref`'s
    manifest is written with (`retain_until`), as of REWRITE_MARGIN from `now`, so a manifest PUT moments after the
    extension never carries a later date (that differs from `until(ref)` only for a backup that ran almost the days)."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return lock.retain_until(ref, moment + REWRITE_MARGIN)


def rewrite_until(lock: ObjectLock, key: str, original: datetime | None, now: datetime | None = None) -> datetime | None:
    """The date a new version of `key` replacing one retained until `original` carries: the original's date, so a
    rewrite (rekey, a storage class move) neither shortens nor lengthens its object's retention; MIN_REMAINING from
    now when that date is not REWRITE_MARGIN ahead (S3 refuses a date in the past); a write's date
    (`retention_until`) when the original carries none."""
    fresh = retention_until(lock, key, now)
    if fresh is None or original is None:
        return fresh
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    if original.astimezone(UTC) >= moment + REWRITE_MARGIN:
        return original.astimezone(UTC)
    return (moment + MIN_REMAINING).replace(microsecond=0)
