"""Leftovers: data of backups that never published, and interrupted writes.

A backup that crashed, was killed, or lost its Step Functions execution
leaves chunks under `data/NAME/ID/` (and, in the cloud, raw parts under
`staging/NAME/ID/`) with no manifest; a local put killed mid-write leaves
a `.tmp-*` file. Nobody will ever read them, but they take space, and
staging holds plaintext. They look exactly like the data of a backup that
is still running, so collecting them is only safe with three rules:

- Age is measured from the backup's last sign of life, never from its id's
  start time: the newest of its lease (braid.format.lease), every object's
  modification time, and the id itself. A two-day backup still writing is
  not abandoned.
- The grace period is at least `MIN_ORPHAN_GRACE_HOURS`, so clock skew
  between hosts and a pause between a backup's writes are never mistaken
  for abandonment.
- Immediately before deleting, the backup is looked at again: a manifest
  that appeared since the listing, or activity since, spares it. Finalize
  re-lists a backup's chunks just after publishing and withdraws the
  manifest if any went missing (braid.engine.finalize), so a backup that
  publishes during the deletion itself does not survive half-deleted
  either; and prune says so if it sees one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from braid.errors import BackupError, IntegrityError
from braid.format.ids import BackupRef
from braid.format.layout import DATA, STAGING, data_prefix, lease_key, manifest_key, ref_under, staging_prefix, summary_key
from braid.format.lease import LeaseRecord
from braid.format.staging.keys import agent_lease_key
from braid.ports.pipeline import StagingJanitor
from braid.ports.store import ObjectInfo, ObjectStore, TemporaryFiles, child_prefixes

MIN_ORPHAN_GRACE_HOURS = 1.0


@dataclass(frozen=True)
class Leftover:
    ref: BackupRef
    last_activity: datetime


def _lease_time(store: ObjectStore, ref: BackupRef, key: str) -> datetime | None:
    """The refresh time the backup host wrote into the lease at `key` (None: no readable lease)."""
    try:
        record = LeaseRecord.from_bytes(store.get(key))
    except (BackupError, ValueError):
        return None
    return record.refreshed_at if record.backup == str(ref) else None


def last_activity(store: ObjectStore, ref: BackupRef, objects: Iterable[ObjectInfo]) -> datetime:
    """The newest sign of life of an unpublished backup: id, object times, lease.

    The lease body is read only when the lease object is there; its own
    modification time counts regardless, so a lease body written by a
    skewed clock can only make the backup look younger, never older.
    """
    newest = ref.started
    leases = (lease_key(ref), agent_lease_key(ref))  # the local engine's, the cloud agent's
    found: list[str] = []
    for info in objects:
        if info.modified is not None and info.modified > newest:
            newest = info.modified
        if info.key in leases:
            found.append(info.key)
    for key in found:
        written = _lease_time(store, ref, key)
        if written is not None and written > newest:
            newest = written
    return newest


def find_leftovers(store: ObjectStore, published: set[BackupRef], now: datetime, grace: timedelta) -> list[Leftover]:
    """Unpublished backups whose last sign of life is older than `grace`, oldest first.

    The candidates come from prefixes alone (leftover_candidates); only
    their own objects are listed to judge them, never the chunks of the
    published backups, which are nearly all of a repository's objects.
    """
    leftovers = []
    for ref in leftover_candidates(store, published, now, grace):
        objects = _backup_objects(store, ref)
        if not objects:
            continue
        active = last_activity(store, ref, objects)
        if now - active > grace:
            leftovers.append(Leftover(ref, active))
    return sorted(leftovers, key=lambda leftover: leftover.ref)


def leftover_candidates(store: ObjectStore, published: set[BackupRef], now: datetime, grace: timedelta) -> list[BackupRef]:
    """Unpublished backups with data or staging that started longer than `grace` ago, by prefixes alone.

    One LIST with a delimiter per root and per name, never a listing of any
    backup's chunks: a backup's last activity is never before its start, so
    one that started within the grace cannot be idle past it; the others
    are judged (objects, lease) only when collected (`collect_leftover`).
    """
    found: set[BackupRef] = set()
    for root in (DATA, STAGING):
        for name_prefix in child_prefixes(store, root):
            for backup_prefix in child_prefixes(store, name_prefix):
                ref = ref_under(root, f"{backup_prefix}-")
                if ref is not None and ref not in published and now - ref.started > grace:
                    found.add(ref)
    return sorted(found)


def _backup_objects(store: ObjectStore, ref: BackupRef) -> list[ObjectInfo]:
    return [*store.list(data_prefix(ref)), *store.list(staging_prefix(ref))]


def collect_leftover(store: ObjectStore, ref: BackupRef, now: datetime, grace: timedelta, janitor: StagingJanitor | None = None) -> bool:
    """Delete one leftover's objects, unless it shows life again; True if collected.

    `now` is when the leftover was judged: any activity after it spares the
    backup, however long the prune has been running since. With a `janitor`
    (the cloud prune's Sweep) its staging's open uploads are aborted first and
    the versions a versioned bucket keeps of it purged after.
    """
    if store.head(manifest_key(ref)) is not None:
        return False  # published since the listing: a backup, not a leftover
    objects = _backup_objects(store, ref)
    if now - last_activity(store, ref, objects) <= grace:
        return False
    if janitor is not None:
        janitor.abort_uploads(staging_prefix(ref))
    store.delete([*(info.key for info in objects), summary_key(ref)])  # and the summary of a publish that crashed before its manifest
    if janitor is not None:
        janitor.purge_versions(staging_prefix(ref))
    if store.head(manifest_key(ref)) is not None:
        raise IntegrityError(
            f"backup {ref} was published while prune was collecting its data as a leftover of an incomplete backup;"
            f" its chunks may be gone: run 'braid verify {ref}' and, if it fails, 'braid forget {ref}'"
        )
    return True


def temporary_files(store: ObjectStore) -> Iterator[ObjectInfo]:
    """Every leftover temporary file of the store (none where the store has no such files)."""
    if isinstance(store, TemporaryFiles):
        yield from store.list_temporary("")


def find_temporary(store: ObjectStore, now: datetime, grace: timedelta) -> list[str]:
    """Temporary files of interrupted writes, untouched for longer than `grace`.

    A put rewrites its temporary file continuously and renames it within
    seconds, so one this old belongs to a process that died mid-write.
    """
    return [info.key for info in temporary_files(store) if info.modified is not None and now - info.modified > grace]


def collect_temporary(store: ObjectStore, keys: Iterable[str], now: datetime, grace: timedelta) -> list[str]:
    """Delete those of `keys` still there and still idle; returns what was deleted."""
    stale = []
    for key in keys:
        info = store.head(key)
        if info is not None and info.modified is not None and now - info.modified > grace:
            stale.append(key)
    store.delete(stale)
    return stale
