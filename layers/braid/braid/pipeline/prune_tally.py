"""TallyPrune: the last step of a scheduled prune run: what happened, said once, loudly if anything failed.

The map tolerates failed items (their data, having no manifest, is the next
run's leftover), so its status says little; the items' result records do.
TallyPrune counts an item without one as failed, writes the run's report
(`prune/RUN/report.json`), and publishes "Prune Failed" (counted in
`PruneFailures`, which an alarm watches) when items failed or were refused.
It also rebuilds the catalog snapshot hosts read and collects what no
reader needs any more (braid.ops.catalog.catalog_leftovers); Finalize does
not, as the log already shows a new backup. Its working files go last; the
report stays (the bucket's lifecycle expires `prune/`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from braid import contract
from braid.errors import IntegrityError, NotFoundError
from braid.format.ids import BackupRef
from braid.format.layout import manifest_key, prune_items_key, prune_plan_key, prune_report_key, prune_results_prefix
from braid.format.repository import Repository
from braid.ops.catalog import catalog_leftovers, collect_catalog_leftovers, parallel, read_catalog
from braid.ops.storage_class import record_move
from braid.pipeline.prune_plan import BACKUP, MOVE, SweepItem
from braid.pipeline.sweep import COLLECTED, DELETED, GONE, MOVED, REFUSED, SPARED
from braid.ports.pipeline import EventPublisher

MAX_EVENT_FAILURES = 10


@dataclass
class PruneReport:
    run: str
    pruned: list[str] = field(default_factory=list)  # backups the policy let go: manifests removed
    incomplete: list[str] = field(default_factory=list)  # of those, backups whose data a failed item left (next run collects it)
    collected: list[str] = field(default_factory=list)  # leftovers of backups that never published
    spared: list[str] = field(default_factory=list)  # leftover candidates that showed life again
    refused: list[str] = field(default_factory=list)  # slices of backups found with a manifest: nothing deleted
    unreadable: list[dict[str, str]] = field(default_factory=list)  # {"backup", "error"}: neither counted nor removed
    locked: list[dict[str, str]] = field(default_factory=list)  # {"backup", "until"}: let go by the rules, kept by Object Lock
    failed_items: int = 0
    objects_deleted: int = 0
    moved: list[str] = field(default_factory=list)  # kept backups whose chunks all moved: each has its storage record now
    move_incomplete: list[str] = field(default_factory=list)  # a move item failed: no record; the next run moves the rest
    objects_moved: int = 0
    storage: dict[str, Any] = field(default_factory=dict)  # the plan's storage section: moves planned, early-deletion charges
    catalog: dict[str, Any] = field(default_factory=dict)
    # Per archive, the plan's WAL section (braid.ops.wal_retention.WalPrunePlan.to_json): the files removed, those kept
    # for Object Lock, objects under their own retention, and the error of a deletion that failed.
    wal: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed_items and not self.refused and not self.unreadable and not self.wal_failed()

    def wal_failed(self) -> list[dict[str, Any]]:
        return [archive for archive in self.wal if archive.get("error")]

    def failures(self) -> list[str]:
        lines = [f"{ref}: its data could not be deleted; the next prune collects it as a leftover" for ref in self.incomplete]
        lines += [f"{ref}: has a manifest again; its slice was not deleted (run 'braid verify {ref}')" for ref in self.refused]
        lines += [f"{u['backup']}: {u['error']}" for u in self.unreadable]
        lines += [f"WAL of {a['name']}: not removed ({a['error']}); the next prune tries again" for a in self.wal_failed()]
        lines += [f"{ref}: not all its chunks moved to another storage class; the next prune moves the rest" for ref in self.move_incomplete]
        if self.failed_items and not self.incomplete and not self.move_incomplete:
            lines.append(f"{self.failed_items} leftover item(s) failed; the next prune tries them again")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}


def _json(repository: Repository, key: str) -> Any:
    try:
        return json.loads(repository.store.get(key))
    except ValueError as exc:
        raise IntegrityError(f"{repository.url}/{key} is not valid JSON: {exc}") from None


def _results(repository: Repository, run: str) -> dict[int, dict[str, Any]]:
    store = repository.store
    keys = [info.key for info in store.list(prune_results_prefix(run))]

    def read(key: str) -> dict[str, Any] | None:
        try:
            doc = json.loads(store.get(key))
        except (NotFoundError, ValueError):
            return None  # a record that is not there or not whole: the item counts as failed
        return doc if isinstance(doc, dict) and isinstance(doc.get("n"), int) else None

    return {doc["n"]: doc for doc in parallel(keys, read) if doc is not None}


def refresh_catalog(repository: Repository, now: datetime) -> dict[str, Any]:
    """Rebuild the snapshot from the manifests (a LIST of them, a summary GET each, in parallel: seconds at
    10,000 backups, and it repairs anything done round Braid), then collect what no reader needs any more."""
    catalog = read_catalog(repository, write=True, rebuild=True, now=now)
    leftovers = catalog_leftovers(repository, now)
    collect_catalog_leftovers(repository, leftovers)
    return {"snapshot": catalog.snapshot_written, "backups": len(catalog.entries), **leftovers.to_json()}


def _record_moves(repository: Repository, moves: dict[str, tuple[str, bool]], now: datetime, report: PruneReport) -> None:
    """A storage record for each backup whose slices all moved and whose manifest is still there; the rest wait for the next run."""
    for backup, (storage_class, whole) in sorted(moves.items()):
        ref = BackupRef.parse(backup)
        if repository.store.head(manifest_key(ref)) is None:
            continue  # removed since the plan: nothing to record
        if whole:
            record_move(repository.store, ref, storage_class, now)
            report.moved.append(backup)
        else:
            report.move_incomplete.append(backup)


def tally_run(repository: Repository, events: EventPublisher, *, run: str, now: datetime | None = None) -> PruneReport:
    moment = now or datetime.now(UTC)
    store = repository.store
    plan = _json(repository, prune_plan_key(run))
    items = [SweepItem.from_json(doc) for doc in _json(repository, prune_items_key(run))]
    results = _results(repository, run)
    report = PruneReport(
        run, pruned=list(plan.get("forget", [])), unreadable=list(plan.get("unreadable", [])), locked=list(plan.get("locked", [])),
        storage=dict(plan.get("storage", {})), wal=list(plan.get("wal", [])),
    )
    incomplete: set[str] = set()
    refused: set[str] = set()
    moves: dict[str, tuple[str, bool]] = {}  # backup -> (class, every slice moved)
    for item in items:
        result = results.get(item.n)
        outcome = result.get("outcome") if result else None
        if item.kind == MOVE:
            whole = moves.get(item.backup, (item.storage_class, True))[1] and outcome == MOVED
            moves[item.backup] = (item.storage_class, whole)
            report.objects_moved += int(result.get("objects", 0)) if result and outcome == MOVED else 0
            if outcome not in (MOVED, GONE):
                report.failed_items += 1
            continue
        if outcome not in (DELETED, REFUSED, COLLECTED, SPARED):
            report.failed_items += 1
            if item.kind == BACKUP:
                incomplete.add(item.backup)
            continue
        assert result is not None
        report.objects_deleted += int(result.get("objects", 0))
        if outcome == REFUSED:
            refused.add(item.backup)
        elif outcome == COLLECTED:
            report.collected.append(item.backup)
        elif outcome == SPARED:
            report.spared.append(item.backup)
    report.incomplete = sorted(incomplete)
    report.refused = sorted(refused)
    _record_moves(repository, moves, moment, report)
    report.catalog = refresh_catalog(repository, moment)
    store.put(prune_report_key(run), json.dumps(report.to_json(), sort_keys=True).encode())
    if report.failed_items or report.refused or report.wal_failed():
        events.publish(
            contract.PRUNE_FAILED,
            {"repository": repository.url, "run": run, "failed_items": report.failed_items, "failures": report.failures()[:MAX_EVENT_FAILURES]},
        )
    store.delete([*(info.key for info in store.list(prune_results_prefix(run))), prune_items_key(run), prune_plan_key(run)])
    return report
