"""Forget: remove one backup a person has judged bad, or no longer wants.

Retention never removes a backup it cannot read, nor the newest good one of
a name (braid.ops.retention); this is how a person does. It needs no key,
so a backup whose manifest is corrupt, truncated or sealed under a lost key
can be removed too. Like prune, it removes the manifest first (from then on
the backup does not exist, so an interrupted forget never leaves a listed
backup with missing chunks), then the chunks, then any staging.

A backup still under the repository's Object Lock retention is refused
(RetentionLockError, naming the date), dry run or not, before anything is
removed: S3 would take a delete marker but keep every locked version, so
"forgotten" would only mean hidden, and the backup is still paid for and
still restorable; better to say so and leave it listed until its date.

Only an exact `NAME@ID`: which backup `NAME@latest` names changes whenever a
backup publishes, and a forget cannot be undone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from braid.errors import BackupError, DependentsError, NotFoundError, RetentionLockError, UsageError
from braid.format.chain import Lineage
from braid.format.ids import BackupRef
from braid.format.layout import data_prefix, manifest_key, rekey_key, staging_prefix, storage_prefix, verification_prefix
from braid.format.repository import Repository
from braid.format.timestamps import format_timestamp
from braid.ops.catalog import record_removal
from braid.ops.chain import descendants
from braid.ports.store import ObjectStore


@dataclass
class ForgetPlan:
    ref: BackupRef
    manifest: str  # its key
    objects: list[str]  # its chunks (and any staging), as listed when planned
    # With --with-children: the plans of every incremental built on it, newest first (removed before it).
    children: list[ForgetPlan] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"backup": str(self.ref), "manifest": self.manifest, "objects": len(self.objects)}
        if self.children:
            doc["children"] = [child.to_json() for child in self.children]
        return doc


def _objects(store: ObjectStore, ref: BackupRef) -> list[str]:
    return [info.key for prefix in (data_prefix(ref), staging_prefix(ref)) for info in store.list(prefix)]


def exact_ref(ref: BackupRef) -> BackupRef:
    """`ref`, if it names one particular backup (UsageError for `NAME@latest`)."""
    if ref.is_latest:
        raise UsageError(
            f"forget needs an exact NAME@ID, not {ref}: which backup is the latest changes whenever one publishes,"
            f" and a forget cannot be undone; find the id with 'braid list --name {ref.name}'"
        )
    return ref


def plan_forget(repository: Repository, ref: BackupRef, now: datetime | None = None, *, with_children: bool = False) -> ForgetPlan:
    """What forgetting `ref` removes; NotFoundError when it has no manifest, RetentionLockError while it (or, with
    `with_children`, a child) is locked, DependentsError when incrementals are built on it and `with_children` is not set."""
    plan = _plan_one(repository, ref, now)
    children = children_of(repository, ref)
    if children and not with_children:
        raise DependentsError(
            f"backup {ref} has {len(children)} incremental backup(s) built on it (first: {children[0]}), which restore only"
            f" on top of it: nothing was removed; remove them with it by 'braid forget {ref} --with-children'"
        )
    plan.children = [_plan_one(repository, child, now) for child in reversed(children)]
    return plan


def children_of(repository: Repository, ref: BackupRef) -> list[BackupRef]:
    """Every backup whose chain goes through `ref`, by the manifests of its name (checksummed, no key needed); oldest first.

    A manifest that does not read is skipped: its parent cannot be known (forget it first, by its exact id).
    """
    lineages: dict[BackupRef, Lineage] = {}
    for other in repository.backups(ref.name):
        if other != ref:
            try:
                lineages[other] = repository.load(other).manifest.lineage
            except BackupError:
                continue
    return descendants(ref, lineages)


def _plan_one(repository: Repository, ref: BackupRef, now: datetime | None) -> ForgetPlan:
    exact_ref(ref)
    store = repository.store
    key = manifest_key(ref)
    objects = _objects(store, ref)
    if store.head(key) is None:
        hint = (
            "; its data has no manifest (an incomplete backup): 'braid prune' collects it once it has been idle for the grace period"
            if objects
            else ""
        )
        if not hint:
            others = repository.backups(ref.name)
            hint = f"; {ref.name} has {len(others)} other backup(s): see 'braid list --name {ref.name}'" if others else repository.suggest_name(ref.name)
        raise NotFoundError(f"backup {ref} not found in {repository.url}{hint}")
    lock = repository.object_lock
    if lock is not None and lock.holds(ref, now or datetime.now(UTC)):
        raise RetentionLockError(
            f"backup {ref} is under Object Lock retention ({lock.mode}, {lock.days} days from its start) until"
            f" {format_timestamp(lock.until(ref))}: it cannot be removed before then; nothing was removed"
        )
    return ForgetPlan(ref, key, objects)


def remove_manifest(store: ObjectStore, ref: BackupRef) -> None:
    """The first step of removing a backup: out of the catalog, then its manifest; from then on it does not exist.

    Its chunks can go afterwards, at any later time, by anyone: data with no
    manifest is never restored, and a run interrupted here leaves what the
    next finds as a leftover (braid.ops.leftovers). Any copy an interrupted
    rekey left goes with the manifest (braid.ops.rekey), and so do the
    backup's verify records (braid.ops.verification) and storage class
    records (braid.ops.storage_class), which describe only it.
    """
    record_removal(store, ref)  # out of `list` first (braid.ops.catalog)
    store.delete([manifest_key(ref), rekey_key(ref)])
    store.delete(info.key for info in store.list(verification_prefix(ref)))
    store.delete(info.key for info in store.list(storage_prefix(ref)))


def execute_forget(repository: Repository, plan: ForgetPlan) -> None:
    """Catalog summary, manifest, then everything under the backup's data and staging prefixes (listed again now)."""
    store = repository.store
    for child in plan.children:  # newest first: a crash in between leaves every remaining backup's chain whole
        execute_forget(repository, child)
    remove_manifest(store, plan.ref)
    store.delete(_objects(store, plan.ref))
