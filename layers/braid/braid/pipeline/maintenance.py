"""Scheduled maintenance: deep-verify recent backups, then start the prune run.

Run by an EventBridge schedule (functions/verify), without the host. Deep
verify of the latest backup of each name (or a sample of its chunks) catches
silent corruption while an older good backup still exists; each failure is
announced ("Verify Failed"). Retention is no longer done here: a prune of
TiBs does not fit one function, so this starts the prune state machine
(braid.pipeline.prune_plan, infra/braid_infra/prune_pipeline.py) with the
schedule's rules and, as `distrusted`, the backups this run's verify
failed: those count towards no rule and are never removed, so a corrupt
latest backup never pushes out the older good one. The prune starts even
when verify ran short of time (the backups it did not reach are simply
not distrusted, as the ones a sample misses), so retention never stops
because verifying took long.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from braid.contract import VERIFY_FAILED
from braid.errors import BackupError
from braid.format.ids import BackupRef
from braid.format.repository import Repository
from braid.format.summary import catalog_stamp
from braid.ops.verify import verify_published
from braid.pipeline.prune_plan import policy_from_event
from braid.ports.keys import KeyService
from braid.ports.pipeline import EventPublisher, PruneRuns

__all__ = ["MaintenanceReport", "latest_per_name", "policy_from_event", "prune_run_id", "run_maintenance", "verify_latest"]

# Verifying stops when less than this is left of the function's 15 minutes: one more
# backup's sampled verify must still fit, and starting the prune must never be cut off.
VERIFY_RESERVE_SECONDS = 300.0


@dataclass
class MaintenanceReport:
    verified: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # latest backups not verified: the function ran short of time
    prune_run: str | None = None  # the prune run started (its execution id)

    @property
    def ok(self) -> bool:
        return all(r.get("ok") for r in self.verified)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "verified": self.verified, "skipped": self.skipped, "prune_run": self.prune_run}


def latest_per_name(repository: Repository) -> list[BackupRef]:
    """The newest published backup of each name, sorted."""
    latest: dict[str, BackupRef] = {}
    for ref in repository.backups():
        latest[ref.name] = ref  # backups() is oldest first
    return sorted(latest.values())


def verify_latest(
    repository: Repository, keys: KeyService, sample_percent: float | None, *, time_left: Callable[[], float] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Deep-verify the newest backup of each name (the one a restore would use) while time allows; (reports, skipped)."""
    reports: list[dict[str, Any]] = []
    skipped: list[str] = []
    for ref in latest_per_name(repository):
        if time_left is not None and time_left() < VERIFY_RESERVE_SECONDS:
            skipped.append(str(ref))
            continue
        try:
            reports.append(verify_published(repository, ref, keys, sample_percent=sample_percent).to_json())
        except BackupError as exc:  # a backup that will not open is a failed verify, not a failed job
            reports.append({"backup": str(ref), "mode": "deep", "ok": False, "failures": [str(exc)]})
    return reports, skipped


def run_maintenance(
    repository: Repository,
    keys: KeyService,
    events: EventPublisher,
    prune: PruneRuns,
    *,
    sample_percent: float | None,
    prune_input: Mapping[str, Any],
    time_left: Callable[[], float] | None = None,
    now: datetime | None = None,
) -> MaintenanceReport:
    """Verify first, then start the prune with what failed as `distrusted`; every failure is announced."""
    policy_from_event(prune_input)  # a bad policy fails here, before anything runs
    verified, skipped = verify_latest(repository, keys, sample_percent, time_left=time_left)
    report = MaintenanceReport(verified=verified, skipped=skipped)
    failed = [r for r in report.verified if not r.get("ok")]
    for r in failed:
        events.publish(VERIFY_FAILED, {"repository": repository.url, "backup": r["backup"], "failures": r["failures"][:10]})
    distrusted = {r["backup"]: f"backup {r['backup']} failed verification: {(r['failures'] or ['unknown failure'])[0]}" for r in failed}
    run = prune_run_id(now)
    report.prune_run = prune.start(run, {**prune_input, "distrusted": {**dict(prune_input.get("distrusted") or {}), **distrusted}})
    return report


def prune_run_id(now: datetime | None = None) -> str:
    """A prune run's id, also its execution's name: when, and a random tail (two starts in one microsecond)."""
    return f"prune-{catalog_stamp(now)}-{secrets.token_hex(4)}".replace(".", "-")
