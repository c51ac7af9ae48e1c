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
from braid.pipeline.prune_plan import BACKUP, MOVE, SweepItem
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


def sweep_slice(store: ObjectStore, janitor: StagingJanitor, ref: BackupRef, after: str, until: str) -> str | int:
    """Delete one slice of a removed backup's objects: how many, or REFUSED if it has a manifest. The open-ended
    last slice also removes its staging as Cleanup does (StagingArea.remove: open uploads aborted, versions
    purged), so a versioned bucket keeps no noncurrent copy of raw database bytes."""
    if store.head(manifest_key(ref)) is not None:
        return REFUSED
    deleted = _delete_pages(store, _in_slice(store, data_prefix(ref), after, until))
    if not until:
        deleted += StagingArea(store, ref).remove(janitor)
    return deleted


def sweep_item(store: ObjectStore, janitor: StagingJanitor, item: SweepItem, *, run: str, now: datetime, grace: timedelta) -> SweepResult:
    """Carry out one item and record its outcome (the record is what TallyPrune counts)."""
    ref = BackupRef.parse(item.backup)
    if item.kind == BACKUP:
        done = sweep_slice(store, janitor, ref, item.after, item.until)
        result = SweepResult(item.n, item.kind, item.backup, REFUSED if done == REFUSED else DELETED, 0 if isinstance(done, str) else done)
    elif item.kind == MOVE:
        if store.head(manifest_key(ref)) is None:
            result = SweepResult(item.n, item.kind, item.backup, GONE)
        else:
            moved = move_objects(store, ref, item.storage_class, after=item.after, until=item.until)
            result = SweepResult(item.n, item.kind, item.backup, MOVED, moved)
    else:
        collected = collect_leftover(store, ref, now, grace, janitor)
        result = SweepResult(item.n, item.kind, item.backup, COLLECTED if collected else SPARED)
    store.put(prune_result_key(run, item.n), json.dumps(result.to_json(), sort_keys=True).encode())
    return result
