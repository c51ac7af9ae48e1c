"""Sweep: one item of a prune run's map: delete a slice of a removed backup, move a slice of a kept one, or collect a leftover.

Every step is safe to run twice and late (EXPRESS children, retried):
a removed backup's slice is deleted a LIST page and a DeleteObjects at a
time, refused if a manifest is found (ids are never reused); a move slice
moves to its storage class (braid.ops.storage_class.move_objects) unless
the manifest is gone by now; a leftover is judged again exactly as
`braid prune` does (braid.ops.leftovers.collect_leftover). Each item ends
by writing its result record; TallyPrune counts an item without one as
failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from braid.format.ids import BackupRef
from braid.format.layout import data_prefix, manifest_key, prune_result_key
from braid.format.staging import StagingArea
from braid.ops.leftovers import collect_leftover
from braid.ops.storage_class import move_objects
from braid.pipeline.prune_plan import BACKUP, LEFTOVER, MOVE, SweepItem
from braid.ports.pipeline import StagingJanitor
from braid.ports.store import ObjectStore, list_after

PAGE = 1000  # one LIST page, one DeleteObjects request

DELETED = "deleted"  # a slice's objects are gone
REFUSED = "refused"  # a slice of a backup that has a manifest: nothing deleted
COLLECTED = "collected"  # a leftover's objects are gone
SPARED = "spared"  # a leftover that showed life again (or published): left alone
MOVED = "moved"  # a move slice's objects are all in the item's storage class
GONE = "gone"  # a move slice of a backup removed since the plan: nothing moved


@dataclass(frozen=True)
class SweepResult:
    n: int
    kind: str
    backup: str
    outcome: str
    objects: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "kind": self.kind, "backup": self.backup, "outcome": self.outcome, "objects": self.objects}


def _in_slice(store: ObjectStore, prefix: str, after: str, until: str) -> Iterator[str]:
    for info in list_after(store, prefix, after):
        if until and info.key > until:
            return
        yield info.key


def _delete_pages(store: ObjectStore, keys: Iterator[str]) -> int:
    deleted = 0
    while page := list(islice(keys, PAGE)):
        store.delete(page)
        deleted += len(page)
    return deleted


def sweep_item(store: ObjectStore, janitor: StagingJanitor, item: SweepItem, *, run: str, now: datetime, grace: timedelta) -> SweepResult:
    """Carry out one item and record its outcome (the record is what TallyPrune counts).

    The open-ended last slice of a removed backup also removes its staging as Cleanup does (StagingArea.remove: open
    uploads aborted, versions purged), so a versioned bucket keeps no noncurrent copy of raw database bytes."""
    ref = BackupRef.parse(item.backup)
    published = item.kind != LEFTOVER and store.head(manifest_key(ref)) is not None
    if item.kind == BACKUP and published:
        outcome, objects = REFUSED, 0
    elif item.kind == BACKUP:
        objects = _delete_pages(store, _in_slice(store, data_prefix(ref), item.after, item.until))
        outcome, objects = DELETED, objects + (0 if item.until else StagingArea(store, ref).remove(janitor))
    elif item.kind == MOVE:
        outcome, objects = (MOVED, move_objects(store, ref, item.storage_class, after=item.after, until=item.until)) if published else (GONE, 0)
    else:
        outcome, objects = COLLECTED if collect_leftover(store, ref, now, grace, janitor) else SPARED, 0
    result = SweepResult(item.n, item.kind, item.backup, outcome, objects)
    store.put(prune_result_key(run, item.n), json.dumps(result.to_json(), sort_keys=True).encode())
    return result
