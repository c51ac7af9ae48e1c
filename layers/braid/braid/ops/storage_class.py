"""Old backups' chunks into cheaper S3 storage classes: which to move, moving them, and what prune's deletions cost.

The policy of a name is its stored policy's `storage` (braid.format.policy),
else the stack's default (`braid:storageClass`, given by the caller). A kept
backup old enough, with no storage record yet, is moved: each object under
its `data/NAME/ID/` is copied onto itself in the class (the store's
`set_storage_class`), and when all are, one record says so
(`storage/NAME/ID/STAMP~CLASS`, braid.format.layout). A run interrupted
midway leaves no record, so the next run moves what is left (objects in the
class already are skipped). Manifests, the catalog and staging never move.

Readers (`list`, `show`, prune's early-deletion charge) take a backup's
class and the day it moved from the records, never from ages. A backup
moves once: a policy changed later applies to backups not moved yet.

A directory repository has no storage classes: saving a policy with one,
or moving, is StorageClassError (exit 2); `list`/`show` say "local".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from braid.errors import NotFoundError
from braid.format.ids import BackupRef
from braid.format.layout import LEASE, POLICIES, data_prefix, name_from_policy_key, parse_storage_record_key, storage_prefix, storage_record_key
from braid.format.policy import parse_storage
from braid.format.prices import PriceTable, significant
from braid.format.repository import Repository
from braid.format.storage_class import LOCAL, STANDARD, Placement, StorageClassError, StoragePolicy, early_deletion_charge, remaining_days
from braid.format.summary import catalog_stamp, parse_catalog_stamp
from braid.ports.store import ObjectStore, StorageClasses, list_after


def has_storage_classes(store: ObjectStore) -> bool:
    return isinstance(store, StorageClasses)


def refuse_local(store: ObjectStore, what: str) -> None:
    """StorageClassError (exit 2) unless `store` has storage classes."""
    if not has_storage_classes(store):
        raise StorageClassError(
            f"{what}: {store.url} is a directory repository, which has no storage classes (S3 only);"
            " its chunks stay where they are: leave the storage class out for it"
        )


def placements(store: ObjectStore, ref: BackupRef | None = None) -> dict[BackupRef, Placement]:
    """Each moved backup's newest storage record (or only `ref`'s), from record keys alone: one LIST, no GET."""
    found: dict[BackupRef, tuple[str, Placement]] = {}
    for info in store.list(storage_prefix(ref)):
        parsed = parse_storage_record_key(info.key)
        if parsed is None:
            continue
        backup, stamp, storage_class = parsed
        try:
            since = parse_catalog_stamp(stamp)
        except ValueError:
            continue
        if backup not in found or stamp > found[backup][0]:
            found[backup] = (stamp, Placement(storage_class, since))
    return {backup: placement for backup, (_, placement) in found.items()}


def placement_of(store: ObjectStore, ref: BackupRef, known: Mapping[BackupRef, Placement]) -> Placement:
    """Where `ref`'s chunks are: its record's class, Standard without one, "local" in a directory repository."""
    if not has_storage_classes(store):
        return Placement(LOCAL)
    return known.get(ref, Placement(STANDARD))


def load_storage_policies(repository: Repository) -> dict[str, StoragePolicy]:
    """The names whose stored policy sets a storage class; IntegrityError for a malformed policy (as retention)."""
    found: dict[str, StoragePolicy] = {}
    for info in repository.store.list(POLICIES):
        name = name_from_policy_key(info.key)
        if name is None:
            continue
        try:
            raw = repository.store.get(info.key)
        except NotFoundError:
            continue
        policy = parse_storage(raw, name, f"{repository.url}/{info.key}")
        if policy is not None:
            found[name] = policy
    return found


@dataclass(frozen=True)
class Move:
    ref: BackupRef
    storage_class: str

    def to_json(self) -> dict[str, str]:
        return {"backup": str(self.ref), "class": self.storage_class}


def plan_moves(
    kept: Iterable[BackupRef],
    policies: Mapping[str, StoragePolicy],
    default: StoragePolicy | None,
    known: Mapping[BackupRef, Placement],
    now: datetime,
) -> list[Move]:
    """The kept backups old enough under their name's policy (else `default`) that have not moved yet, oldest first."""
    moves = []
    for ref in sorted(set(kept), key=lambda r: (r.started, str(r))):
        policy = policies.get(ref.name, default)
        if policy is not None and ref not in known and policy.due(ref.started, now):
            moves.append(Move(ref, policy.storage_class))
    return moves


def move_objects(store: ObjectStore, ref: BackupRef, storage_class: str, *, after: str = "", until: str = "") -> int:
    """Move the objects of `ref`'s data prefix in the key range (after, until] ("": open) not in `storage_class` yet; how many.

    The lease (a running backup's heartbeat) is never moved: a published backup has none.
    """
    refuse_local(store, f"moving {ref} to {storage_class}")
    assert isinstance(store, StorageClasses)
    moved = 0
    for info in list_after(store, data_prefix(ref), after):  # S3: a LIST from the slice's start (StartAfter), not the prefix's
        if until and info.key > until:
            break
        if info.key.endswith("/" + LEASE) or info.storage_class == storage_class:
            continue
        try:
            store.set_storage_class(info.key, storage_class)
        except NotFoundError:
            continue  # removed since the listing (a concurrent forget): nothing to move
        moved += 1
    return moved


def record_move(store: ObjectStore, ref: BackupRef, storage_class: str, now: datetime) -> str:
    """The record that `ref`'s chunks are all in `storage_class` since `now`; returns its key."""
    key = storage_record_key(ref, catalog_stamp(now), storage_class)
    store.put(key, b"")
    return key


def move_backup(store: ObjectStore, move: Move, now: datetime) -> int:
    """Move every object of a backup, then record it (the host's prune; the cloud fans the objects out as map items)."""
    moved = move_objects(store, move.ref, move.storage_class)
    record_move(store, move.ref, move.storage_class, now)
    return moved


@dataclass(frozen=True)
class EarlyDeletion:
    """A removed backup whose chunks had not served their class's minimum duration: the pro-rated charge S3 bills."""

    ref: BackupRef
    placement: Placement
    stored_bytes: int
    remaining_days: float
    charge: float
    currency: str

    def to_json(self) -> dict[str, Any]:
        return {
            "backup": str(self.ref),
            **{f"storage_{k}": v for k, v in self.placement.to_json().items()},
            "stored_bytes": self.stored_bytes,
            "remaining_days": round(self.remaining_days, 3),
            "charge": significant(self.charge),
            "currency": self.currency,
        }


def early_deletions(
    removed: Iterable[BackupRef], stored_bytes: Mapping[BackupRef, int], known: Mapping[BackupRef, Placement], now: datetime, prices: PriceTable
) -> list[EarlyDeletion]:
    """The removed backups whose deletion at `now` is charged for the rest of a minimum storage duration."""
    found = []
    for ref in sorted(removed):
        placement = known.get(ref)
        if placement is None:
            continue
        days = remaining_days(placement.storage_class, placement.since, now)
        if days > 0:
            size = stored_bytes.get(ref, 0)
            found.append(EarlyDeletion(ref, placement, size, days, early_deletion_charge(size, placement, now, prices.prices), prices.currency))
    return found


@dataclass
class StoragePlan:
    """What a prune does about storage classes: the backups it moves, and the charges its deletions cause."""

    moves: list[Move]
    early: list[EarlyDeletion]
    local: bool  # a directory repository: nothing moves, nothing is charged
    moved_objects: int = 0

    @property
    def charge(self) -> float:
        return sum(entry.charge for entry in self.early)

    def to_json(self, currency: str) -> dict[str, Any]:
        return {
            "storage_classes": not self.local,
            "moves": [move.to_json() for move in self.moves],
            "moved_objects": self.moved_objects,
            "early_deletion": [entry.to_json() for entry in self.early],
            "early_deletion_charge": significant(self.charge),
            "currency": currency,
        }


def plan_storage(
    repository: Repository,
    kept: Iterable[BackupRef],
    removed: Iterable[BackupRef],
    stored_bytes: Mapping[BackupRef, int],
    now: datetime,
    prices: PriceTable,
    default: StoragePolicy | None = None,
) -> StoragePlan:
    """The moves due among `kept`, and the early-deletion charges of `removed` (their sizes from `stored_bytes`)."""
    store = repository.store
    if not has_storage_classes(store):
        return StoragePlan([], [], local=True)
    known = placements(store)
    moves = plan_moves(kept, load_storage_policies(repository), default, known, now)
    return StoragePlan(moves, early_deletions(removed, stored_bytes, known, now, prices), local=False)


def execute_moves(repository: Repository, plan: StoragePlan, now: datetime) -> None:
    """The host's prune: move each planned backup in turn, recording each as it completes."""
    for move in plan.moves:
        plan.moved_objects += move_backup(repository.store, move, now)
