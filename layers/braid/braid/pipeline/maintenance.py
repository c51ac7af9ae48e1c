"""Scheduled maintenance: deep-verify recent backups, then apply retention.

Run by an EventBridge schedule (functions/verify), without the host. Deep
verify of the latest backup of each name (or a sample of its chunks) catches
silent corruption while an older good backup still exists. Retention is the
same policy and code as `braid prune` (braid.ops.retention): the schedule's
rules if its event carries any, else each name's policy stored in the
repository, the one `braid prune` without rules applies; with the same
guarantees: only backups whose manifest authenticates count towards a rule,
and here also only those that passed this run's verify, so a corrupt latest
backup never pushes out the older good one; unreadable backups are reported
(and announced, as a failed verify is), never removed; backups the policy
lets go lose their manifest first, then their chunks; leftovers of backups
that never completed are collected only once idle past the grace period,
so a backup still in flight is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from braid.contract import VERIFY_FAILED
from braid.errors import BackupError, UsageError
from braid.format.ids import BackupRef
from braid.format.policy import COUNT_RULES, Duration
from braid.format.repository import Repository
from braid.ops.catalog import read_catalog
from braid.ops.retention import RetentionPolicy, execute_prune, plan_prune
from braid.ops.verify import verify_published
from braid.ports.keys import KeyService
from braid.ports.pipeline import EventPublisher


@dataclass
class MaintenanceReport:
    verified: list[dict[str, Any]] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)  # backups the retention policy let go
    collected: list[str] = field(default_factory=list)  # leftovers of backups that never completed
    unreadable: list[dict[str, str]] = field(default_factory=list)  # {"backup", "error"}: neither counted nor removed
    locked: list[dict[str, str]] = field(default_factory=list)  # {"backup", "until"}: let go by the policy, kept by Object Lock

    @property
    def ok(self) -> bool:
        return all(r.get("ok") for r in self.verified) and not self.unreadable

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verified": self.verified,
            "pruned": self.pruned,
            "collected": self.collected,
            "unreadable": self.unreadable,
            "locked": self.locked,
        }


def latest_per_name(repository: Repository) -> list[BackupRef]:
    """The newest published backup of each name, sorted."""
    latest: dict[str, BackupRef] = {}
    for ref in repository.backups():
        latest[ref.name] = ref  # backups() is oldest first
    return sorted(latest.values())


def verify_latest(repository: Repository, keys: KeyService, sample_percent: float | None) -> list[dict[str, Any]]:
    """Deep-verify the newest backup of each name: the one a restore would use."""
    reports: list[dict[str, Any]] = []
    for ref in latest_per_name(repository):
        try:
            reports.append(verify_published(repository, ref, keys, sample_percent=sample_percent).to_json())
        except BackupError as exc:  # a backup that will not open is a failed verify, not a failed job
            reports.append({"backup": str(ref), "mode": "deep", "ok": False, "failures": [str(exc)]})
    return reports


def run_maintenance(
    repository: Repository,
    keys: KeyService,
    events: EventPublisher,
    *,
    sample_percent: float | None,
    policy: RetentionPolicy,
    now: datetime | None = None,
) -> MaintenanceReport:
    """Verify first, then prune: a failed verify never stops retention from
    running, but the backup that failed it counts towards no rule and is not
    removed, and every failure is announced."""
    report = MaintenanceReport(verified=verify_latest(repository, keys, sample_percent))
    failed = {r["backup"]: r for r in report.verified if not r.get("ok")}
    distrusted = {
        BackupRef.parse(name): f"backup {name} failed verification: {(r['failures'] or ['unknown failure'])[0]}" for name, r in failed.items()
    }
    plan = plan_prune(repository, policy, keys, now, distrusted=distrusted)
    report.unreadable = [u.to_json() for u in plan.unreadable]
    # Announced before anything is removed: a prune that fails midway must not swallow them.
    for r in failed.values():
        events.publish(VERIFY_FAILED, {"repository": repository.url, "backup": r["backup"], "failures": r["failures"][:10]})
    for u in plan.unreadable:
        if str(u.ref) not in failed:  # older backups verify_latest did not look at
            events.publish(VERIFY_FAILED, {"repository": repository.url, "backup": str(u.ref), "failures": [str(u.error)]})
    execute_prune(repository, plan)
    report.pruned = [str(r) for r in plan.forget]
    report.locked = [entry.to_json() for entry in plan.locked]
    report.collected = [str(r) for r in plan.orphans]
    # Hosts only read the catalog: the schedule rebuilds its snapshot from the manifests (braid.ops.catalog),
    # which also repairs anything done around Braid (a manifest deleted by hand).
    read_catalog(repository, rebuild=True)
    return report


def policy_from_event(event: dict[str, Any]) -> RetentionPolicy:
    """The schedule's retention settings: any of {"keep_last", "keep_hourly", "keep_daily",
    "keep_weekly", "keep_monthly", "keep_yearly", "keep_within" (a DURATION such as "1y"),
    "keep_days"}, and "orphan_grace_hours".

    An event with no keep rule applies each name's policy stored in the
    repository (`braid prune --name NAME --keep-... --save-policy`); a name
    without one keeps every backup. So a schedule with no policy configured
    removes no backup (it still collects leftovers of backups that never
    completed: those are not backups).
    """
    try:
        counts = {rule: int(event[rule]) for rule in COUNT_RULES if event.get(rule) is not None}
        within = event.get("keep_within")
        keep_days = event.get("keep_days")
        return RetentionPolicy.of(
            keep_days=float(keep_days) if keep_days is not None else None,
            orphan_grace_hours=float(event.get("orphan_grace_hours", 48)),
            keep_within=Duration.parse(str(within)) if within is not None else None,
            stored=not counts and within is None and keep_days is None,
            **counts,
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(f"the schedule's retention settings are not numbers: {exc}") from None
