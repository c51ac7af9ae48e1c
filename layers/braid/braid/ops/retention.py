"""Retention: which backups to keep, and collecting what a policy lets go.

A policy keeps the union of its rules, per backup name, as pgBackRest and
restic do: the newest `keep_last`, and every backup younger than
`keep_days`. Three guarantees come before any rule:

- Only a backup whose manifest loads and authenticates under its data key
  counts towards a rule. An unreadable one (corrupt, truncated, re-sealed
  under another key, or failing a deep verify the caller ran) is never
  counted, so it can never push a good backup out, and never removed: it
  is reported, and `braid forget` removes it once a person has looked.
- The newest readable backup of each name is always kept: a policy never
  empties a name (`--keep-days` alone would, once backups stop); removing
  it is `braid forget`'s job.
- Pruning removes a backup's manifest first (from that moment the backup
  no longer exists, so a crash mid-prune never leaves a listed backup with
  missing chunks), then its chunks.

Leftovers of backups that never published, and temporary files of
interrupted writes, are collected by the rules in braid.ops.leftovers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from braid.errors import BackupError, IntegrityError, KeyAccessError, NotFoundError, UsageError
from braid.format.ids import BackupRef
from braid.format.layout import data_prefix, manifest_key, staging_prefix
from braid.format.repository import Repository
from braid.ops.leftovers import MIN_ORPHAN_GRACE_HOURS, collect_leftover, collect_temporary, find_leftovers, find_temporary
from braid.ops.open import open_backup
from braid.ports.keys import KeyService

__all__ = ["MIN_ORPHAN_GRACE_HOURS", "PrunePlan", "RetentionPolicy", "Unreadable", "execute_prune", "plan_prune", "unreadable_error"]


@dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int | None = None
    keep_days: float | None = None
    orphan_grace_hours: float = 48.0

    def __post_init__(self) -> None:
        if self.keep_last is None and self.keep_days is None:
            raise UsageError("a retention policy needs --keep-last N and/or --keep-days D")
        if self.keep_last is not None and self.keep_last < 1:
            raise UsageError("--keep-last must be at least 1")
        if self.keep_days is not None and not (math.isfinite(self.keep_days) and self.keep_days >= 0):
            raise UsageError(f"--keep-days must be a number of days, 0 or more (got {self.keep_days})")
        if not math.isfinite(self.orphan_grace_hours) or self.orphan_grace_hours < MIN_ORPHAN_GRACE_HOURS:
            raise UsageError(
                f"--orphan-grace-hours must be at least {MIN_ORPHAN_GRACE_HOURS:g} (got {self.orphan_grace_hours}): a shorter grace"
                " could take a running backup's data (a stalled producer, clock skew between hosts) for leftovers"
            )

    @property
    def grace(self) -> timedelta:
        return timedelta(hours=self.orphan_grace_hours)


@dataclass(frozen=True)
class Unreadable:
    """A published backup that counts towards no rule and is never removed by one."""

    ref: BackupRef
    error: BackupError

    def to_json(self) -> dict[str, str]:
        return {"backup": str(self.ref), "error": str(self.error)}


@dataclass
class PrunePlan:
    now: datetime  # when the plan was made: leftover ages are measured from here
    grace: timedelta
    keep: list[BackupRef] = field(default_factory=list)
    forget: list[BackupRef] = field(default_factory=list)
    orphans: list[BackupRef] = field(default_factory=list)  # data or staging without a manifest, idle past the grace period
    unreadable: list[Unreadable] = field(default_factory=list)
    temporary: list[str] = field(default_factory=list)  # keys of interrupted writes' temporary files, idle past the grace
    spared: list[BackupRef] = field(default_factory=list)  # orphans that showed life again just before deletion

    def to_json(self) -> dict[str, Any]:
        return {
            "keep": [str(r) for r in self.keep],
            "forget": [str(r) for r in self.forget],
            "orphans": [str(r) for r in self.orphans],
            "unreadable": [u.to_json() for u in self.unreadable],
            "temporary": list(self.temporary),
            "spared": [str(r) for r in self.spared],
        }


def _authenticate_all(
    repository: Repository, keys: KeyService, distrusted: Mapping[BackupRef, str]
) -> tuple[dict[BackupRef, str], list[Unreadable], set[BackupRef]]:
    """({ref: created} of authenticated backups, the unreadable ones, every published ref)."""
    readable: dict[BackupRef, str] = {}
    unreadable: list[Unreadable] = []
    published: set[BackupRef] = set()
    for ref in repository.backups():
        published.add(ref)
        if ref in distrusted:
            unreadable.append(Unreadable(ref, IntegrityError(distrusted[ref])))
            continue
        try:
            readable[ref] = open_backup(repository, ref, keys).manifest.created
        except NotFoundError:
            continue  # removed since the listing (another prune, a forget): nothing to keep or count
        except BackupError as exc:
            unreadable.append(Unreadable(ref, exc))
    return readable, unreadable, published


def plan_prune(
    repository: Repository,
    policy: RetentionPolicy,
    keys: KeyService,
    now: datetime | None = None,
    *,
    distrusted: Mapping[BackupRef, str] | None = None,
) -> PrunePlan:
    """What a prune would do; reads (and authenticates) every manifest, removes nothing.

    `distrusted`: backups the caller found bad (a failed deep verify), with
    the reason; they are treated as unreadable.
    """
    now = now or datetime.now(UTC)
    plan = PrunePlan(now=now, grace=policy.grace)
    readable, plan.unreadable, published = _authenticate_all(repository, keys, distrusted or {})
    by_name: dict[str, list[BackupRef]] = {}
    for ref in readable:
        by_name.setdefault(ref.name, []).append(ref)
    for refs in by_name.values():
        # Newest first as `NAME@latest` resolves: id's millisecond, then the manifest's own start time.
        newest_first = sorted(refs, key=lambda r: (r.id.partition("-")[0], readable[r], r.id), reverse=True)
        for position, ref in enumerate(newest_first):
            keep = position == 0
            keep = keep or (policy.keep_last is not None and position < policy.keep_last)
            keep = keep or (policy.keep_days is not None and now - ref.started <= timedelta(days=policy.keep_days))
            (plan.keep if keep else plan.forget).append(ref)
    plan.orphans = [leftover.ref for leftover in find_leftovers(repository.store, published, now, policy.grace)]
    plan.temporary = find_temporary(repository.store, now, policy.grace)
    plan.keep.sort()
    plan.forget.sort()
    plan.unreadable.sort(key=lambda u: u.ref)
    return plan


def execute_prune(repository: Repository, plan: PrunePlan) -> None:
    """Carry out a plan: forget what the policy let go, collect leftovers still idle.

    Orphans that show life again (a manifest appeared, or new activity)
    move from `plan.orphans` to `plan.spared`; temporary files touched
    since leave `plan.temporary`; so the plan reports what was done.
    """
    store = repository.store
    for ref in plan.forget:
        store.delete([manifest_key(ref)])
        store.delete(info.key for info in store.list(data_prefix(ref)))
        store.delete(info.key for info in store.list(staging_prefix(ref)))
    collected = []
    for ref in plan.orphans:
        if collect_leftover(store, ref, plan.now, plan.grace):
            collected.append(ref)
        else:
            plan.spared.append(ref)
    plan.orphans = collected
    plan.temporary = collect_temporary(store, plan.temporary, plan.now, plan.grace)


def unreadable_error(plan: PrunePlan) -> BackupError | None:
    """The one-line error a prune that met unreadable backups ends with (None: it met none).

    A key error when every one of them failed for want of a key (the key
    service, not the backups, needs fixing); an integrity error otherwise.
    """
    if not plan.unreadable:
        return None
    first = plan.unreadable[0]
    count = len(plan.unreadable)
    reason = str(first.error)
    if not reason.startswith(f"backup {first.ref}"):  # most errors name the backup already
        reason = f"{first.ref}: {reason}"
    message = (
        f"{count} backup(s) could not be read and were neither counted nor removed; first: {reason}"
        f" (look at it with 'braid verify {first.ref} --deep'; remove it with 'braid forget {first.ref}')"
    )
    if all(isinstance(u.error, KeyAccessError) for u in plan.unreadable):
        return KeyAccessError(message)
    return IntegrityError(message)
