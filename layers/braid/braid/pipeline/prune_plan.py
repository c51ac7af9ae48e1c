"""PlanPrune: the first step of a scheduled prune run, and the only one that decides.

    Identify ─► PlanPrune ─► anything to sweep? ─yes─► Sweep (Distributed Map) ─┐
                                   │ no                                          │
                                   └──────────────────────────► TallyPrune ◄─────┘

It plans with braid.ops.retention's own `plan_prune(..., from_catalog=True)`
(every guarantee there applies, docs/cloud.md), then removes the manifests
of the backups let go, all of them before any chunk is touched. The rest is
written to S3 as the map's items: slices of each removed backup's
`data/NAME/ID/` (`slice_chunks` chunks each, by key range), one item per
leftover candidate (judged again by braid.pipeline.sweep), and "move" slices
(MOVE_SLICE_CHUNKS) of kept backups due a cheaper storage class
(braid.ops.storage_class). The plan, with the early-deletion charges
computed before the manifests went, stays beside the items for TallyPrune.

WAL: once the manifests are gone, it removes the archived WAL that no
backup the plan keeps (by rule or by Object Lock) needs, with the host's
own planning (braid.ops.wal_retention.plans_for_prune: per timeline,
nothing from the oldest kept start on, no `.history` file, a pack only
when no kept backup needs a member, nothing under its own retention). The
plan records it under "wal"; a failed deletion is recorded there too and
TallyPrune reports it as a failure (the files stay for the next run).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from braid import contract
from braid.errors import IntegrityError, UsageError
from braid.format.fields import Fields
from braid.format.ids import BackupRef
from braid.format.layout import chunk_key, prune_items_key, prune_plan_key, prune_run_prefix
from braid.format.policy import COUNT_RULES, Duration
from braid.format.repository import Repository
from braid.format.storage_class import MOVABLE, StoragePolicy
from braid.ops.catalog import Unreadable, parallel, read_catalog
from braid.ops.prices import load_prices
from braid.ops.retention import PrunePlan, RetentionPolicy, plan_prune, remove_manifest
from braid.ops.storage_class import StoragePlan, plan_storage
from braid.ops.verification import failed_verifications
from braid.ops.wal_retention import WalPrunePlan, execute_wal_prune, plans_for_prune
from braid.pipeline.failure import invalid_input
from braid.ports.keys import KeyService
from braid.ports.pipeline import EventPublisher

BACKUP = "backup"  # item kind: a slice of a removed backup's chunks
LEFTOVER = "leftover"  # item kind: data of a backup that never published, judged again before deletion
MOVE = "move"  # item kind: a slice of a kept backup's chunks, to move to `storage_class`


@dataclass(frozen=True)
class SweepItem:
    """One map item: `n` numbers its result record; `after`/`until` bound a slice's keys ("": open)."""

    n: int
    kind: str
    backup: str
    after: str = ""
    until: str = ""
    storage_class: str = ""  # a move item's target class

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"n": self.n, "kind": self.kind, "backup": self.backup, "after": self.after, "until": self.until}
        if self.storage_class:
            doc["storage_class"] = self.storage_class
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SweepItem:
        with invalid_input("not a prune map item", IntegrityError, KeyError, TypeError, ValueError):
            f = Fields(dict(doc), "prune map item", ("n", "kind", "backup"), ("after", "until", "storage_class"))
            item = cls(f.count("n"), f.text("kind"), f.text("backup"), *(str(doc.get(name, "")) for name in ("after", "until", "storage_class")))
        if item.kind not in (BACKUP, LEFTOVER, MOVE):
            raise UsageError(f"not a prune map item: unknown kind {item.kind!r}")
        if (item.kind == MOVE) != (item.storage_class in MOVABLE):
            raise UsageError(f"not a prune map item: a {item.kind} item with storage class {item.storage_class!r}")
        BackupRef.parse(item.backup)
        return item


def slices(ref: BackupRef, chunks: int, slice_chunks: int) -> list[tuple[str, str]]:
    """Key ranges (after, until] covering `data/NAME/ID/` whatever its keys, `slice_chunks` chunk keys apart; the last
    is open above, so an object of any other name (the lease) is still swept, by exactly one slice."""
    bounds = [chunk_key(ref, end - 1) for end in range(slice_chunks, chunks, slice_chunks)]
    lows = ["", *bounds]
    highs = [*bounds, ""]
    return list(zip(lows, highs, strict=True))


def policy_from_event(event: Mapping[str, Any]) -> RetentionPolicy:
    """The run's retention settings: any of {"keep_last", "keep_hourly", "keep_daily",
    "keep_weekly", "keep_monthly", "keep_yearly", "keep_within" (a DURATION such as "1y"),
    "keep_days"}, and "orphan_grace_hours".

    An event with no keep rule applies each name's policy stored in the
    repository (`braid prune --name NAME --keep-... --save-policy`); a name
    without one keeps every backup. So a schedule with no policy configured
    removes no backup (it still collects leftovers of backups that never
    completed: those are not backups).
    """
    with invalid_input("the schedule's retention settings are not numbers", TypeError, ValueError):
        counts = {rule: int(event[rule]) for rule in COUNT_RULES if event.get(rule) is not None}
        within = event.get("keep_within")
        keep_days = event.get("keep_days")
        policy = RetentionPolicy.of(
            keep_days=float(keep_days) if keep_days is not None else None,
            orphan_grace_hours=float(event.get("orphan_grace_hours", 48)),
            keep_within=Duration.parse(str(within)) if within is not None else None,
            stored=not counts and within is None and keep_days is None,
            **counts,
        )
    return policy


def distrusted_from_event(event: Mapping[str, Any]) -> dict[BackupRef, str]:
    """{"distrusted": {"NAME@ID": reason}}: backups a verify found bad; they count towards no rule and are not removed."""
    given = event.get("distrusted") or {}
    if not isinstance(given, Mapping):
        raise UsageError("the prune's 'distrusted' must map NAME@ID to a reason")
    return {BackupRef.parse(str(ref)): str(reason) for ref, reason in given.items()}


def slice_chunks_from_event(event: Mapping[str, Any]) -> int:
    value = event.get("slice_chunks", contract.PRUNE_SLICE_CHUNKS)
    if type(value) is not int or not 1 <= value <= contract.PRUNE_SLICE_CHUNKS:
        raise UsageError(f"slice_chunks must be a whole number from 1 to {contract.PRUNE_SLICE_CHUNKS} (got {value!r})")
    return value


def announce_unreadable(repository: Repository, events: EventPublisher, plan: PrunePlan, distrusted: Mapping[BackupRef, str]) -> None:
    """A "Verify Failed" event per unreadable backup (retention leaves it alone, so a person must look),
    except those the caller distrusted: whoever verified them announced them already."""
    for u in plan.unreadable:
        if u.ref in distrusted:
            continue
        events.publish(contract.VERIFY_FAILED, {"repository": repository.url, "backup": str(u.ref), "failures": [str(u.error)]})


def plan_run(
    repository: Repository,
    keys: KeyService,
    events: EventPublisher,
    *,
    run: str,
    prefix: str = "",
    policy: RetentionPolicy,
    distrusted: Mapping[BackupRef, str] | None = None,
    slice_chunks: int = contract.PRUNE_SLICE_CHUNKS,
    now: datetime | None = None,
    storage_default: StoragePolicy | None = None,
) -> dict[str, Any]:
    """Plan, announce, remove the manifests, write the plan and the map's items; returns the state for the map.

    `prefix` is the repository's key prefix in the bucket, passed on to the
    items (an execution started by hand may leave it out: the bucket root).
    `storage_default`: the stack's storage class policy, for names whose stored policy sets none.
    """
    moment = now or datetime.now(UTC)
    store = repository.store
    prune_run_prefix(run)  # a usable run id, before anything is removed
    # Backups whose newest verify record failed count towards no rule and are never removed, whoever started
    # the run; their recorder announced them already. The caller's own (an execution's input) come on top.
    distrusted = {**failed_verifications(repository), **(distrusted or {})}
    plan = plan_prune(repository, policy, keys, moment, distrusted=distrusted, from_catalog=True)
    announce_unreadable(repository, events, plan, distrusted)  # before anything is removed: a run that fails midway must not swallow them
    storage, sizes = _storage(repository, plan, moment, storage_default)  # before the manifests go: their storage records go with them
    wal = plans_for_prune(repository, plan)  # reads only kept backups' manifests
    parallel(plan.forget, lambda ref: remove_manifest(store, ref))
    execute_wal_prune(repository, wal, keep_going=True)  # after the manifests: a backup still listed keeps its WAL
    items: list[SweepItem] = []
    for ref in plan.forget:
        for after, until in slices(ref, plan.chunks.get(ref, 0), slice_chunks):
            items.append(SweepItem(len(items), BACKUP, str(ref), after, until))
    for ref in plan.orphans:
        items.append(SweepItem(len(items), LEFTOVER, str(ref)))
    for move in storage.moves:
        for after, until in slices(move.ref, sizes.get(move.ref, (0, 0))[1], contract.MOVE_SLICE_CHUNKS):
            items.append(SweepItem(len(items), MOVE, str(move.ref), after, until, move.storage_class))
    record = plan.to_json()
    record.update({"run": run, "repository": repository.url, "now": moment.isoformat(), "items": len(items)})
    record["storage"] = storage.to_json(load_prices(store).currency)
    record["wal"] = [w.to_json() for w in wal]
    store.put(prune_plan_key(run), json.dumps(record, sort_keys=True).encode())
    store.put(prune_items_key(run), json.dumps([item.to_json() for item in items]).encode())
    return {
        "run": run,
        "prefix": prefix,
        "items_object": prune_items_key(run),
        "items": len(items),
        "max_concurrency": contract.PRUNE_MAX_CONCURRENCY,
        "now": moment.isoformat(),
        "grace_hours": policy.orphan_grace_hours,
        "pruned": len(plan.forget),
        "unreadable": len(plan.unreadable),
        "moves": len(storage.moves),
        "wal": [wal_summary(w) for w in wal],
    }


def wal_summary(plan: WalPrunePlan) -> dict[str, Any]:
    """What one archive's prune did, in a few fields (the run's state and the planner's log; the plan record has it all)."""
    files = plan.files()
    return {
        "name": plan.name, "files": len(files), "first": files[0] if files else None, "last": files[-1] if files else None,
        "kept_for_lock": len(plan.for_lock), "locked_objects": len(plan.locked), "reason": plan.reason, "error": plan.error,
    }


def _storage(
    repository: Repository, plan: PrunePlan, now: datetime, default: StoragePolicy | None
) -> tuple[StoragePlan, dict[BackupRef, tuple[int, int]]]:
    """The moves due and the early-deletion charges, with (stored bytes, chunks) of the backups they concern, from the catalog."""
    kept = [*plan.keep, *(entry.ref for entry in plan.locked)]
    sizes: dict[BackupRef, tuple[int, int]] = {}
    for entry in read_catalog(repository, write=False).entries:  # the catalog plan_prune just read: a snapshot and a day or two of log
        if not isinstance(entry, Unreadable):
            sizes[BackupRef.parse(entry.backup)] = (entry.stored_bytes, entry.chunks)
    storage = plan_storage(repository, kept, plan.forget, {ref: size[0] for ref, size in sizes.items()}, now, load_prices(repository.store), default)
    return storage, sizes
