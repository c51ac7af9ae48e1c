"""A prune run in one process: PlanPrune, every Sweep item, TallyPrune, one after another.

The state machine (infra/braid_infra/prune_pipeline.py) runs the same three
steps in Lambda; tests of what the steps decide use this on a local or moto
repository, and the emulated-cloud tests run the synthesized state machine.
`fail` makes chosen items raise instead of sweeping, as a failed map item
does (no result record).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from braid.format.layout import prune_items_key
from braid.format.repository import Repository
from braid.format.storage_class import StoragePolicy
from braid.pipeline.prune_plan import SweepItem, distrusted_from_event, plan_run, policy_from_event, slice_chunks_from_event
from braid.pipeline.prune_tally import PruneReport, tally_run
from braid.pipeline.sweep import SweepResult, sweep_item
from braid.ports.keys import KeyService
from braid.ports.pipeline import EventPublisher, PlainStoreJanitor, StagingJanitor


class InlinePruneRuns:
    """braid.ports.pipeline.PruneRuns, run to the end at `start`; keeps each run's report."""

    def __init__(self, repository: Repository, keys: KeyService, events: EventPublisher, *, now: datetime | None = None) -> None:
        self.repository = repository
        self.keys = keys
        self.events = events
        self.now = now
        self.fail: Callable[[SweepItem], bool] = lambda item: False
        self.reports: list[PruneReport] = []
        self.states: list[dict[str, Any]] = []
        self.results: list[SweepResult] = []
        self.before_sweep: Callable[[], None] = lambda: None
        self.storage_default: StoragePolicy | None = None  # the stack's braid:storageClass, as PlanPrune reads it from its environment

    def start(self, run: str, document: Mapping[str, Any]) -> str:
        state = plan_run(
            self.repository,
            self.keys,
            self.events,
            run=run,
            policy=policy_from_event(document),
            distrusted=distrusted_from_event(document),
            slice_chunks=slice_chunks_from_event(document),
            now=self.now,
            storage_default=self.storage_default,
        )
        self.states.append(state)
        self.before_sweep()
        items = [SweepItem.from_json(doc) for doc in json.loads(self.repository.store.get(prune_items_key(run)))]
        janitor = _janitor(self.repository)
        for item in items:
            if self.fail(item):
                continue
            self.results.append(
                sweep_item(
                    self.repository.store, janitor, item, run=run, now=datetime.fromisoformat(state["now"]), grace=timedelta(hours=state["grace_hours"])
                )
            )
        self.reports.append(tally_run(self.repository, self.events, run=run, now=self.now))
        return f"inline:{run}"


def _janitor(repository: Repository) -> StagingJanitor:
    """The Sweep's janitor for this repository's store: S3's (uploads and versions) on S3, none on a directory."""
    from braid.adapters.aws.lambda_env import S3StagingJanitor
    from braid.adapters.aws.s3 import S3Store

    store = repository.store
    return S3StagingJanitor(store) if isinstance(store, S3Store) else PlainStoreJanitor()
