"""Retention: which backups to keep, and collecting what a policy lets go.

A policy keeps the union of its rules, per backup name, as pgBackRest and
restic do: the newest `keep_last`, and every backup younger than
`keep_days`. Pruning removes a backup's manifest first (from that moment the
backup no longer exists, so a crash mid-prune never leaves a listed backup
with missing chunks), then its chunks. It also collects data left by backups
that never completed, but only after a grace period, so a backup still
running on the host or in Step Functions is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.format.layout import DATA, STAGING, data_prefix, manifest_key, ref_under, staging_prefix
from braid.format.repository import Repository


@dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int | None = None
    keep_days: float | None = None
    orphan_grace_hours: float = 48.0

    def __post_init__(self) -> None:
        if self.keep_last is None and self.keep_days is None:
            raise UsageError("a retention policy needs --keep-last N and/or --keep-days D")
        if (self.keep_last is not None and self.keep_last < 1) or (self.keep_days is not None and self.keep_days < 0):
            raise UsageError("--keep-last must be at least 1 and --keep-days not negative")


def started_at(ref: BackupRef) -> datetime:
    return ref.started


@dataclass
class PrunePlan:
    keep: list[BackupRef] = field(default_factory=list)
    forget: list[BackupRef] = field(default_factory=list)
    orphans: list[BackupRef] = field(default_factory=list)  # data or staging without a manifest, past the grace period

    def to_json(self) -> dict[str, list[str]]:
        return {"keep": [str(r) for r in self.keep], "forget": [str(r) for r in self.forget], "orphans": [str(r) for r in self.orphans]}


def _refs_under(repository: Repository, root: str) -> set[BackupRef]:
    """Backups that have objects under data/ or staging/ (NAME/ID/...)."""
    refs = (ref_under(root, info.key) for info in repository.store.list(root))
    return {ref for ref in refs if ref is not None}


def plan_prune(repository: Repository, policy: RetentionPolicy, now: datetime | None = None) -> PrunePlan:
    now = now or datetime.now(UTC)
    plan = PrunePlan()
    published = repository.backups()
    by_name: dict[str, list[BackupRef]] = {}
    for ref in published:
        by_name.setdefault(ref.name, []).append(ref)
    for refs in by_name.values():
        newest_first = sorted(refs, key=lambda r: r.id, reverse=True)
        for position, ref in enumerate(newest_first):
            keep = policy.keep_last is not None and position < policy.keep_last
            if policy.keep_days is not None and now - started_at(ref) <= timedelta(days=policy.keep_days):
                keep = True
            (plan.keep if keep else plan.forget).append(ref)
    grace = timedelta(hours=policy.orphan_grace_hours)
    complete = set(published)
    leftovers = _refs_under(repository, DATA) | _refs_under(repository, STAGING)
    plan.orphans = sorted(r for r in leftovers if r not in complete and now - started_at(r) > grace)
    plan.keep.sort()
    plan.forget.sort()
    return plan


def execute_prune(repository: Repository, plan: PrunePlan) -> None:
    store = repository.store
    for ref in plan.forget:
        store.delete([manifest_key(ref)])
        store.delete(info.key for info in store.list(data_prefix(ref)))
    for ref in plan.orphans:
        store.delete(info.key for info in store.list(data_prefix(ref)))
        store.delete(info.key for info in store.list(staging_prefix(ref)))
