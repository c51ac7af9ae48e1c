"""Retention rules as data: the `--keep-*` rules, `--keep-within` durations,
and the per-name policy a repository stores at `policies/NAME.json`.

The rules follow restic's `forget --keep-*` (braid.ops.retention applies
them). A stored policy is plain JSON, not sealed: it is validated strictly
on read (known fields only, each in range), and one that fails is an
error, never read as "keep nothing".

    {"version": 1, "name": "pg", "rules": {"keep_daily": 7, "keep_within": "1mo"}}

It may also say when the name's chunks move to a cheaper S3 storage class
(braid.format.storage_class, braid.ops.storage_class), an optional key:

    {..., "storage": {"class": "GLACIER_IR", "after_days": 30}}
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any

from braid.errors import IntegrityError, UsageError
from braid.format.storage_class import StoragePolicy

__all__ = ["COUNT_RULES", "Duration", "KeepRules", "keep_reasons", "parse_policy", "parse_storage", "policy_bytes"]

POLICY_VERSION = 1
COUNT_RULES = ("keep_last", "keep_hourly", "keep_daily", "keep_weekly", "keep_monthly", "keep_yearly")
MAX_KEEP_DAYS = 1_000_000.0  # ~2,700 years: beyond it "keep" is forever, and timedelta overflows near 1e9 days
MAX_DURATION_PART = 1_000_000
_DURATION = re.compile(r"(\d+)(y|mo|min|m|d|h)", re.ASCII)
_UNITS = {"y": "y", "mo": "mo", "m": "mo", "d": "d", "h": "h", "min": "min"}  # a bare m: months (restic), in stored documents only


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


@dataclass(frozen=True)
class Duration:
    """restic's DURATION: years, months, days and hours, e.g. `2y5mo7d3h`, and minutes (`30min`).

    restic writes months as a bare `m`, which reads as minutes to most
    people: from a user (`--keep-within`) it is refused, with both
    spellings; stored documents written before `mo` still read it as months.
    """

    years: int = 0
    months: int = 0
    days: int = 0
    hours: int = 0
    minutes: int = 0

    @classmethod
    def parse(cls, text: str, *, user: bool = False) -> Duration:
        """`user`: typed by a user (a bare `m` is refused); otherwise from a stored document."""
        parts: dict[str, int] = {}
        position = 0
        bare_m = False
        for match in _DURATION.finditer(text):
            unit = _UNITS[match.group(2)]
            if match.start() != position or unit in parts:
                break
            bare_m = bare_m or match.group(2) == "m"
            parts[unit] = int(match.group(1))
            position = match.end()
        if not text or position != len(text) or not parts:
            raise UsageError(
                f"--keep-within must be a duration such as 2y5mo7d3h or 30min (years, months, days, hours, minutes, each at most once), not {text!r}"
            )
        if bare_m and user:
            number = parts["mo"]
            raise UsageError(f"--keep-within {text!r}: a bare m is ambiguous; write {number}min for minutes or {number}mo for months")
        if any(value > MAX_DURATION_PART for value in parts.values()):
            raise UsageError(f"--keep-within {text!r}: each part must be at most {MAX_DURATION_PART:,}")
        duration = cls(parts.get("y", 0), parts.get("mo", 0), parts.get("d", 0), parts.get("h", 0), parts.get("min", 0))
        if duration.is_zero:
            raise UsageError(f"--keep-within must be more than 0, not {text!r}")
        return duration

    @property
    def is_zero(self) -> bool:
        return not (self.years or self.months or self.days or self.hours or self.minutes)

    def __str__(self) -> str:
        units = ((self.years, "y"), (self.months, "mo"), (self.days, "d"), (self.hours, "h"), (self.minutes, "min"))
        text = "".join(f"{value}{unit}" for value, unit in units if value)
        return text or "0h"

    def deadline(self, newest: datetime) -> datetime | None:
        """`newest` minus this duration, as restic (Go's AddDate: Mar 31 - 1m = Mar 3), or None if before year 1.

        Backups started strictly after the deadline are kept.
        """
        months = newest.year * 12 + (newest.month - 1) - self.years * 12 - self.months
        year, month = divmod(months, 12)
        if year < 1:
            return None
        try:
            # Go normalizes an out-of-range day by rolling over into the next month.
            first = datetime(year, month + 1, 1, newest.hour, newest.minute, newest.second, newest.microsecond, tzinfo=newest.tzinfo or UTC)
            return first + timedelta(days=newest.day - 1 - self.days, hours=-self.hours, minutes=-self.minutes)
        except OverflowError:
            return None


@dataclass(frozen=True)
class KeepRules:
    """The keep rules of a policy; their union is kept. Counts are at least 1 when set."""

    keep_last: int | None = None
    keep_hourly: int | None = None
    keep_daily: int | None = None
    keep_weekly: int | None = None
    keep_monthly: int | None = None
    keep_yearly: int | None = None
    keep_within: Duration | None = None
    keep_days: float | None = None

    def __post_init__(self) -> None:
        for name in COUNT_RULES:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UsageError(f"{_flag(name)} must be at least 1 (got {value!r})")
        if self.keep_within is not None and self.keep_within.is_zero:
            raise UsageError("--keep-within must be more than 0")
        if self.keep_days is not None and not (
            isinstance(self.keep_days, int | float) and math.isfinite(self.keep_days) and 0 <= self.keep_days <= MAX_KEEP_DAYS
        ):
            raise UsageError(f"--keep-days must be a number of days, 0 or more (got {self.keep_days})")

    @property
    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                doc[f.name] = str(value) if isinstance(value, Duration) else value
        return doc

    def describe(self) -> str:
        return " ".join(f"{_flag(k)} {v:g}" if isinstance(v, float) else f"{_flag(k)} {v}" for k, v in self.to_json().items())

    @classmethod
    def from_json(cls, doc: Any) -> KeepRules:
        """Strict: a dict of known rules only, counts integers, keep_within a DURATION string; UsageError otherwise."""
        if not isinstance(doc, dict):
            raise UsageError("rules must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise UsageError(f"unknown rule(s) {', '.join(unknown)}")
        within = doc.get("keep_within")
        if within is not None and not isinstance(within, str):
            raise UsageError(f"keep_within must be a DURATION string such as 7d, not {within!r}")
        days = doc.get("keep_days")
        if days is not None and (isinstance(days, bool) or not isinstance(days, int | float)):
            raise UsageError(f"keep_days must be a number, not {days!r}")
        return cls(
            **{name: doc.get(name) for name in COUNT_RULES},
            keep_within=Duration.parse(within) if within is not None else None,
            keep_days=float(days) if days is not None else None,
        )


def policy_bytes(name: str, rules: KeepRules, storage: StoragePolicy | None = None) -> bytes:
    if rules.is_empty:
        raise UsageError(f"a stored policy for {name} needs at least one --keep-* rule")
    doc: dict[str, Any] = {"version": POLICY_VERSION, "name": name, "rules": rules.to_json()}
    if storage is not None:
        doc["storage"] = storage.to_json()
    return json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n"


def _policy_doc(raw: bytes, name: str, where: str) -> tuple[KeepRules, StoragePolicy | None]:
    try:
        doc = json.loads(raw)
        if (
            not isinstance(doc, dict)
            or doc.get("version") != POLICY_VERSION
            or doc.get("name") != name
            or not {"version", "name", "rules"} <= set(doc) <= {"version", "name", "rules", "storage"}
        ):
            raise UsageError(f"expected {{'version': {POLICY_VERSION}, 'name': {name!r}, 'rules': {{...}}}} and optionally 'storage': {{...}}")
        rules = KeepRules.from_json(doc["rules"])
        if rules.is_empty:
            raise UsageError("no rule")
        storage = StoragePolicy.from_json(doc["storage"]) if "storage" in doc else None
    except (ValueError, UsageError) as exc:
        raise IntegrityError(
            f"stored retention policy {where} is not valid ({exc}); nothing was pruned. Rewrite it with"
            f" 'braid prune --name {name} --keep-... --save-policy' or remove it with 'braid prune --name {name} --delete-policy'"
        ) from None
    return rules, storage


def parse_policy(raw: bytes, name: str, where: str) -> KeepRules:
    """A stored policy's keep rules, validated; IntegrityError (naming `where`) for anything but a well-formed policy of `name`."""
    return _policy_doc(raw, name, where)[0]


def parse_storage(raw: bytes, name: str, where: str) -> StoragePolicy | None:
    """A stored policy's storage class setting (None: it sets none), validated as `parse_policy` does."""
    return _policy_doc(raw, name, where)[1]


def bucket(rule: str, moment: datetime) -> tuple[int, ...]:
    """The UTC calendar bucket `moment` falls in for a `keep_*ly` rule (ISO weeks for weekly)."""
    moment = moment.astimezone(UTC)
    if rule == "keep_hourly":
        return (moment.year, moment.month, moment.day, moment.hour)
    if rule == "keep_daily":
        return (moment.year, moment.month, moment.day)
    if rule == "keep_weekly":
        iso = moment.isocalendar()
        return (iso.year, iso.week)
    if rule == "keep_monthly":
        return (moment.year, moment.month)
    if rule == "keep_yearly":
        return (moment.year,)
    raise ValueError(rule)


_BUCKET_TEXT = {"keep_hourly": "%Y-%m-%d %H:00", "keep_daily": "%Y-%m-%d", "keep_weekly": "%G-W%V", "keep_monthly": "%Y-%m", "keep_yearly": "%Y"}


def keep_reasons(started_newest_first: Sequence[datetime], rules: KeepRules, now: datetime) -> list[list[str]]:
    """Why the rules keep each of one name's backups (start times, newest first): the rules that matched, [] for none.

    restic's `forget --keep-*`: each `keep_*ly` N keeps the first (newest)
    backup met in each new bucket until N buckets are used (`keep-daily 7:
    newest of 2026-11-28`); `keep_within` counts from the newest backup;
    `keep_days` from `now`. The newest backup's guarantee is the caller's.
    """
    reasons: list[list[str]] = [[] for _ in started_newest_first]
    if not started_newest_first:
        return reasons
    for rule in COUNT_RULES:
        count = getattr(rules, rule)
        if count is None:
            continue
        flag, total, last = rule.replace("_", "-"), count, None
        for position, started in enumerate(started_newest_first):
            if count == 0:
                break
            value: object = position if rule == "keep_last" else bucket(rule, started)
            if value != last:
                what = f"one of the newest {total}" if rule == "keep_last" else f"newest of {started.astimezone(UTC).strftime(_BUCKET_TEXT[rule])}"
                reasons[position].append(f"{flag} {total}: {what}")
                last = value
                count -= 1
    if rules.keep_within is not None:
        deadline = rules.keep_within.deadline(started_newest_first[0])
        for position, started in enumerate(started_newest_first):
            if deadline is None or started > deadline:
                reasons[position].append(f"keep-within {rules.keep_within}: started within it of the newest")
    if rules.keep_days is not None:
        window = timedelta(days=rules.keep_days)
        for position, started in enumerate(started_newest_first):
            if now - started <= window:
                reasons[position].append(f"keep-days {rules.keep_days:g}: started in the last {rules.keep_days:g} days")
    return reasons
