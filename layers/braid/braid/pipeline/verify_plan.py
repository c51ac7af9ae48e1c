"""PlanVerify: which backups, which of their chunks, and (deep) the map items that check them.

Quick mode checks everything here (braid.ops.verify.check_entries: one LIST
of the data prefix, then QUICK_WORKERS HEADs at once for the stored
checksums, docs/cloud.md). Deep mode authenticates each manifest here (a
forged chunk list must not "verify" forged chunks), checks each input's
chained checksum when every chunk is selected, and writes the items the
workers check. A rotating verify takes the part after its previous
record's (braid.ops.verification).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from braid.errors import BackupError, IntegrityError, NotFoundError
from braid.format.ids import BackupRef
from braid.format.layout import verify_run_prefix
from braid.format.repository import Repository
from braid.format.verification import Selection
from braid.ops.open import open_backup, read_manifest
from braid.ops.verification import next_rotation
from braid.ops.verify import check_entries, input_checksum_failures, selected_chunks
from braid.pipeline.verify_request import ITEMS_OBJECT, PLAN_OBJECT, ItemOutcome, PlannedBackup, VerifyItem, VerifyRequest, items_of
from braid.ports.keys import KeyService

QUICK_WORKERS = 32  # HEADs in flight: each waits ~20 ms on S3, so a 16,000-chunk backup takes seconds


@dataclass(frozen=True)
class VerifyPlan:
    run: str
    mode: str
    backups: list[PlannedBackup]
    outcomes: list[ItemOutcome]
    items: list[VerifyItem]
    gone: list[dict[str, str]]  # {"backup", "error"}: removed (pruned, forgotten) before it could be checked: reported, never recorded

    def plan_document(self) -> bytes:
        return json.dumps(
            {
                "run": self.run,
                "mode": self.mode,
                "backups": [b.to_json() for b in self.backups],
                "outcomes": [o.to_json() for o in self.outcomes],
                "gone": self.gone,
            }
        ).encode()


def chosen_backups(repository: Repository, request: VerifyRequest) -> list[BackupRef]:
    """The backups the request names: a list (NAME@latest resolved), every backup, or each name's newest."""
    if request.backups == "all":
        return repository.backups()
    if request.backups == "latest":
        return sorted({ref.name: ref for ref in repository.backups()}.values())  # oldest first: each name's newest stays
    return [repository.resolve(BackupRef.parse(b)) for b in request.backups]


def plan_verify(repository: Repository, keys: KeyService | None, request: VerifyRequest, run: str) -> VerifyPlan:
    store = repository.store
    planned: list[PlannedBackup] = []
    outcomes: list[ItemOutcome] = []
    items: list[VerifyItem] = []
    gone: list[dict[str, str]] = []
    for ref in chosen_backups(repository, request):
        selection = next_rotation(store, ref, request.rotate) if request.rotate else Selection.sample(request.sample_percent)
        try:
            if request.deep:
                assert keys is not None
                manifest, key = open_backup(repository, ref, keys)
            else:
                manifest, key = read_manifest(repository, ref), None
        except NotFoundError as exc:  # no backup to record anything beside
            gone.append({"backup": str(ref), "error": str(exc)})
            continue
        except BackupError as exc:  # a backup that will not open failed its verification; the others still run
            planned.append(PlannedBackup(str(ref), selection, 0, 0))
            outcomes.append(ItemOutcome(str(ref), failures=[(-1, str(exc))], corrupt=isinstance(exc, IntegrityError)))
            continue
        chunks = selected_chunks(manifest, selection)
        planned.append(PlannedBackup(str(ref), selection, manifest.chunk_count, len(chunks)))
        if request.deep:
            assert key is not None
            items.extend(items_of(str(ref), (c.index for c in chunks)))
            if len(chunks) == manifest.chunk_count:
                found = input_checksum_failures(manifest, key)
                if found:
                    outcomes.append(ItemOutcome(str(ref), failures=[(manifest.chunk_count, f) for f in found], corrupt=True))
        else:
            report = check_entries(store, manifest, None, chunks, deep=False, workers=QUICK_WORKERS)
            outcomes.append(
                ItemOutcome(
                    str(ref), report.chunks_checked, report.bytes_checked, [(0, f) for f in report.failures], corrupt=report.corrupt
                )
            )
    return VerifyPlan(run, request.mode, planned, outcomes, items, gone)


def write_plan(repository: Repository, plan: VerifyPlan) -> dict[str, Any]:
    """Store the plan (and the map's items) under the run's prefix; what the state machine needs next ($.plan)."""
    prefix = verify_run_prefix(plan.run)
    repository.store.put(f"{prefix}{PLAN_OBJECT}", plan.plan_document())
    items_key = ""
    if plan.items:
        items_key = f"{prefix}{ITEMS_OBJECT}"
        repository.store.put(items_key, json.dumps([i.to_json() for i in plan.items]).encode())
    return {
        "run": plan.run,
        "mode": plan.mode,
        "map": bool(plan.items),
        "items": len(plan.items),
        "items_key": items_key,
        "chunks": sum(b.chunks_selected for b in plan.backups),
        "backups": len(plan.backups),
    }
