"""Scheduled maintenance: start the prune run, and say how old the oldest staged backup is.

Run by an EventBridge schedule (functions/verify), without the host. It
neither verifies (the verify state machine does, on its own schedule:
braid_infra.verify_pipeline) nor prunes: a prune of TiBs does not fit one
function, so this starts the prune state machine (braid.pipeline.prune_plan,
which distrusts every backup whose newest verify record failed) with the
schedule's rules. It also measures the age of the oldest backup still in
staging (from the ids under `staging/`, two LISTs with a delimiter per name:
no object is read), which the stack alarms on past a day (braid_infra.monitoring).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from braid.format.layout import STAGING, ref_under
from braid.format.summary import catalog_stamp
from braid.pipeline.prune_plan import policy_from_event
from braid.ports.pipeline import PruneRuns
from braid.ports.store import ObjectStore, child_prefixes

__all__ = ["MaintenanceReport", "oldest_staging_hours", "policy_from_event", "prune_run_id", "run_maintenance"]


@dataclass
class MaintenanceReport:
    prune_run: str | None = None  # the prune run started (its execution id)
    oldest_staging: str | None = None  # NAME@ID of the oldest backup in staging, if any
    oldest_staging_hours: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, **asdict(self), "oldest_staging_hours": round(self.oldest_staging_hours, 2)}


def oldest_staging_hours(store: ObjectStore, now: datetime) -> tuple[str | None, float]:
    """(NAME@ID, hours since it started) of the oldest backup with anything under `staging/`; (None, 0) if none."""
    oldest = None
    for name_prefix in child_prefixes(store, STAGING):
        for backup_prefix in child_prefixes(store, name_prefix):
            ref = ref_under(STAGING, f"{backup_prefix}-")
            if ref is not None and (oldest is None or ref.started < oldest.started):
                oldest = ref
    if oldest is None:
        return None, 0.0
    return str(oldest), max(0.0, (now - oldest.started).total_seconds() / 3600)


def run_maintenance(
    prune: PruneRuns, *, prune_input: Mapping[str, Any], store: ObjectStore | None = None, now: datetime | None = None
) -> MaintenanceReport:
    """Start the prune with the schedule's rules (a bad policy fails here, before anything runs), and measure
    the oldest staged backup in `store`, if given."""
    policy_from_event(prune_input)
    report = MaintenanceReport()
    if store is not None:
        report.oldest_staging, report.oldest_staging_hours = oldest_staging_hours(store, now or datetime.now(UTC))
    report.prune_run = prune.start(prune_run_id(now), dict(prune_input))
    return report


def prune_run_id(now: datetime | None = None) -> str:
    """A prune run's id, also its execution's name: when, and a random tail (two starts in one microsecond)."""
    return f"prune-{catalog_stamp(now)}-{secrets.token_hex(4)}".replace(".", "-")
