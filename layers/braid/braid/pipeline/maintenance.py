"""Scheduled maintenance: apply retention, distrusting backups whose newest verification failed.

Run by an EventBridge schedule (functions/verify), without the host. The
verifying itself is the verify state machine's (braid.pipeline.verify_*,
started daily by its own schedule for each name's latest backup): it
fans out over the chunks and records each result beside the backup, so
this function, whose 15 minutes a deep verify of TiBs used to exhaust
before pruning, only reads those records (braid.ops.verification). Retention is the
same policy and code as `braid prune` (braid.ops.retention): the schedule's
rules if its event carries any, else each name's policy stored in the
repository, the one `braid prune` without rules applies; with the same
guarantees: only backups whose manifest authenticates count towards a rule,
and here also only those whose newest verification did not fail, so a
corrupt latest backup never pushes out the older good one; unreadable
backups are reported (and announced, as a failed verify is), never removed; backups the policy
lets go lose their manifest first, then their chunks; leftovers of backups
that never completed are collected only once idle past the grace period,
so a backup still in flight is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from braid.contract import VERIFY_FAILED
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.format.policy import COUNT_RULES, Duration
from braid.format.repository import Repository
from braid.ops.catalog import read_catalog
from braid.ops.retention import RetentionPolicy, execute_prune, plan_prune
from braid.ops.verification import failed_verifications
from braid.ports.keys import KeyService
from braid.ports.pipeline import EventPublisher


@dataclass
class MaintenanceReport:
    distrusted: list[dict[str, str]] = field(default_factory=list)  # {"backup", "error"}: their newest verification failed
    pruned: list[str] = field(default_factory=list)  # backups the retention policy let go
    collected: list[str] = field(default_factory=list)  # leftovers of backups that never completed
    unreadable: list[dict[str, str]] = field(default_factory=list)  # {"backup", "error"}: neither counted nor removed
    locked: list[dict[str, str]] = field(default_factory=list)  # {"backup", "until"}: let go by the policy, kept by Object Lock

    @property
    def ok(self) -> bool:
        return not self.unreadable

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "distrusted": self.distrusted,
            "pruned": self.pruned,
            "collected": self.collected,
            "unreadable": self.unreadable,
            "locked": self.locked,
        }


def run_maintenance(
    repository: Repository,
    keys: KeyService,
    events: EventPublisher,
    *,
    policy: RetentionPolicy,
    now: datetime | None = None,
) -> MaintenanceReport:
    """Prune: a failed verification never stops retention from running, but
    the backup that failed it counts towards no rule and is not removed, and
    every unreadable backup is announced."""
    distrusted: dict[BackupRef, str] = failed_verifications(repository)
    report = MaintenanceReport(distrusted=[{"backup": str(ref), "error": why} for ref, why in sorted(distrusted.items())])
    plan = plan_prune(repository, policy, keys, now, distrusted=distrusted)
    report.unreadable = [u.to_json() for u in plan.unreadable]
    # Announced before anything is removed: a prune that fails midway must not swallow them.
    for u in plan.unreadable:
        if u.ref not in distrusted:  # a failed verification was announced by the verify that found it
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
