"""Scheduled maintenance: start the prune run.

Run by an EventBridge schedule (functions/verify), without the host. It
verifies nothing itself: the verify state machine does that on its own
schedule (braid_infra.verify_pipeline) and leaves a record beside each
backup. Retention is not done here either: a prune of TiBs does not fit one
function, so this starts the prune state machine (braid.pipeline.prune_plan,
infra/braid_infra/prune_pipeline.py) with the schedule's rules. The prune
planner distrusts every backup whose newest verify record failed
(braid.ops.verification.failed_verifications): those count towards no rule
and are never removed, so a corrupt latest backup never pushes out the
older good one, whoever started the prune.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from braid.format.summary import catalog_stamp
from braid.pipeline.prune_plan import policy_from_event
from braid.ports.pipeline import PruneRuns

__all__ = ["MaintenanceReport", "policy_from_event", "prune_run_id", "run_maintenance"]


@dataclass
class MaintenanceReport:
    prune_run: str | None = None  # the prune run started (its execution id)

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "prune_run": self.prune_run}


def run_maintenance(prune: PruneRuns, *, prune_input: Mapping[str, Any], now: datetime | None = None) -> MaintenanceReport:
    """Start the prune with the schedule's rules; a bad policy fails here, before anything runs."""
    policy_from_event(prune_input)
    run = prune_run_id(now)
    return MaintenanceReport(prune_run=prune.start(run, dict(prune_input)))


def prune_run_id(now: datetime | None = None) -> str:
    """A prune run's id, also its execution's name: when, and a random tail (two starts in one microsecond)."""
    return f"prune-{catalog_stamp(now)}-{secrets.token_hex(4)}".replace(".", "-")
