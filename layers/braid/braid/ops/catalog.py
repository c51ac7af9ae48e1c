"""The catalog: what `braid list` reads, so it stays fast at 10,000 backups.

Design (docs/format.md, Catalog). Three kinds of object, all below
`catalog/`, none a source of truth:

- a **summary** per backup (braid.format.summary), written by the finalizer
  (`write_summary`, from braid.engine.finalize, which both the local engine
  and the cloud Finalize call) just *before* the manifest, and removed by
  prune and forget (`record_removal`) just before the manifest;
- a **log marker** per event (`published` with the summary, `removed` with
  the removal), an empty object whose key says when, which backup and what,
  grouped by UTC day;
- a **snapshot** (braid.format.catalog): every summary known at its
  `through` time, in one object, written by a reader when the log since the
  last one grows long, or when there is none: `list` on a local repository;
  for an s3:// one the scheduled prune run rebuilds it daily, at its end
  (braid.pipeline.prune_tally), since hosts' roles only read `catalog/`.

`list` reads the newest snapshot, lists the log's days since its `through`
(minus `MARGIN` for writers' clock skew and slow PUTs), and for each
`published` marker there checks that the manifest exists (HEAD) and reads
the summary; so it touches a handful of objects whatever the repository's
size, in parallel. Why not just read every summary? Any per-backup read,
even a LIST of the manifest keys (10 pages of 1,000 at 10,000 backups), takes
seconds on the emulated S3 and is linear everywhere; why not only an index
rebuilt on demand? Then the first `list` after every backup would have to
find the new manifests, which again means listing them all. The log is what
makes "what changed since the snapshot" cheap to ask.

Why it stays right:
- The summary and marker precede the manifest, so no published backup is
  ever missing from the log; a marker whose manifest never appeared (a
  failed or crashed publish) is skipped because its HEAD finds nothing.
- A removal's marker precedes the manifest's deletion, so a removed backup
  leaves `list` before it loses anything (an interrupted prune or forget
  hides a backup it has not deleted yet; running it again finishes it).
- A summary that is missing, corrupt or names another backup or repository
  is never shown: the manifest is read instead, and a backup whose manifest
  does not read is listed as unreadable, as before.
- No snapshot that checks (none yet, all corrupt, or older than
  `MAX_LOG_DAYS`), or `list --rebuild-catalog`: the catalog is rebuilt from
  the manifests (listing them all, reading and checking each manifest and
  its summary, in parallel) and a new snapshot written. A manifest that
  fails its checksum is listed as unreadable even when its summary checks,
  and stays so in the snapshot (retried, manifest included, on every list). That is also the repair path after
  anything went round Braid (a manifest deleted by hand).

Trust is the same as `list`'s before: checksums, no key (a host in the cloud
holds none). Summaries also carry a MAC for those who hold the data key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import TYPE_CHECKING, TypeVar

from braid.errors import AlreadyExistsError, BackupError, IntegrityError, NotFoundError, PermissionDeniedError
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.layout import (
    CATALOG_INDEX,
    CATALOG_LOG,
    PUBLISHED,
    REMOVED,
    index_key,
    log_day_prefix,
    log_marker_key,
    manifest_key,
    parse_log_marker,
    summary_key,
)
from braid.format.manifest import Manifest
from braid.format.repository import Repository
from braid.format.summary import BackupSummary, catalog_stamp, open_summary, parse_catalog_stamp
from braid.ports.store import ObjectStore, child_prefixes

if TYPE_CHECKING:
    from braid.format.catalog import CatalogSnapshot

MARGIN = timedelta(minutes=15)  # writers' clocks and slow PUTs: markers this far before `through` are read again
PENDING = timedelta(hours=1)  # a snapshot folds in only markers older than this: their manifest had time to appear
MAX_LOG_DAYS = 31  # a snapshot older than this is not worth catching up on: rebuild
COMPACT_AFTER = 64  # markers read since the snapshot before `list` writes a new one
KEEP_SNAPSHOTS = 2  # the newest and the one before, which a concurrent reader may still be reading
WORKERS = 16

T = TypeVar("T")
R = TypeVar("R")


def parallel(items: list[T], work: Callable[[T], R], workers: int = WORKERS) -> list[R]:
    """`work` over `items` on a few threads, results in order: reads of small objects wait on the network, not the CPU."""
    if len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="braid-catalog") as pool:
        return list(pool.map(work, items))


# Writers ------------------------------------------------------------------


def write_summary(store: ObjectStore, manifest: Manifest, key: DataKey) -> list[str]:
    """Before publishing `manifest`: its summary, then its `published` marker; returns both keys (to withdraw)."""
    ref = BackupRef.parse(manifest.backup)
    target = summary_key(ref)
    store.put(target, BackupSummary.of(manifest).seal(key))
    marker = log_marker_key(catalog_stamp(), ref, PUBLISHED)
    store.put(marker, b"")
    return [target, marker]


def ensure_summary(store: ObjectStore, manifest: Manifest, key: DataKey) -> None:
    """For a manifest found already published (a retried Finalize): write the catalog records if they are missing."""
    if store.head(summary_key(BackupRef.parse(manifest.backup))) is None:
        write_summary(store, manifest, key)


def record_removal(store: ObjectStore, ref: BackupRef) -> None:
    """Before deleting `ref`'s manifest: its `removed` marker, then drop its summary."""
    store.put(log_marker_key(catalog_stamp(), ref, REMOVED), b"")
    store.delete([summary_key(ref)])


# Readers ------------------------------------------------------------------


@dataclass(frozen=True)
class Unreadable:
    """A published backup whose summary and manifest would not read."""

    ref: BackupRef
    error: BackupError


Entry = BackupSummary | Unreadable


def _summary_of(repository: Repository, ref: BackupRef, *, check_manifest: bool = False) -> Entry:
    """The backup's summary if it checks and matches, else one derived from its manifest; NotFoundError if it has no manifest.

    `check_manifest`: the manifest is read and checked (checksum, no key)
    even when the summary checks, and a manifest that does not is listed as
    unreadable whatever its summary says (a rebuild, and each retry of a
    backup once found unreadable).
    """
    store = repository.store
    manifest: Manifest | None = None
    if check_manifest:
        try:
            manifest = repository.load(ref).manifest
        except NotFoundError:
            raise
        except BackupError as exc:  # one bad manifest must not hide the others
            return Unreadable(ref, exc)
    try:
        summary = open_summary(store.get(summary_key(ref)), f"summary of {ref}").summary
        if summary.backup == str(ref) and summary.repository == repository.config.id:
            return summary
    except (NotFoundError, IntegrityError, PermissionDeniedError):
        pass  # a summary this user may not read (another user's run left it): the manifest, else the backup is unreadable
    try:
        return BackupSummary.of(manifest or repository.load(ref).manifest)
    except NotFoundError:
        raise
    except BackupError as exc:  # one bad manifest must not hide the others
        return Unreadable(ref, exc)


def _confirmed(repository: Repository, ref: BackupRef, *, check_manifest: bool = False) -> Entry | None:
    """For a `published` marker: the backup's entry if its manifest exists, else None."""
    if repository.store.head(manifest_key(ref)) is None:
        return None
    try:
        return _summary_of(repository, ref, check_manifest=check_manifest)
    except NotFoundError:
        return None  # removed since the HEAD


def _snapshots_that_check(repository: Repository, keys: list[str]) -> Iterator[tuple[str, CatalogSnapshot]]:
    """(key, snapshot) of each of `keys` that reads, checks and is this repository's, newest first, read as asked for."""
    from braid.format.catalog import open_snapshot  # readers only: publishing a backup (write_summary) needs no snapshot

    for key in reversed(keys):
        try:
            snapshot = open_snapshot(repository.store.get(key), key)
        except (NotFoundError, IntegrityError, PermissionDeniedError):
            continue  # removed since the listing (a prune collected it), corrupt, or another user's: the next older one
        if snapshot.repository == repository.config.id:
            yield key, snapshot


def _newest_snapshot(repository: Repository) -> tuple[CatalogSnapshot | None, list[str]]:
    """The newest snapshot that checks, and every snapshot key (oldest first)."""
    keys = [info.key for info in repository.store.list(CATALOG_INDEX)]
    for _key, snapshot in _snapshots_that_check(repository, keys):
        return snapshot, keys
    return None, keys


def _log_days(since: datetime, until: datetime) -> list[str]:
    day = since.replace(hour=0, minute=0, second=0, microsecond=0)
    prefixes = []
    while day <= until:
        prefixes.append(log_day_prefix(catalog_stamp(day)))
        day += timedelta(days=1)
    return prefixes


def _read_log(store: ObjectStore, since: datetime, until: datetime) -> list[tuple[str, BackupRef, str]]:
    """Markers stamped at or after `since`, oldest first (one LIST per day, in parallel)."""
    floor = catalog_stamp(since)
    listed = parallel(_log_days(since, until), lambda prefix: [info.key for info in store.list(prefix)])
    markers = [m for keys in listed for m in map(parse_log_marker, keys) if m is not None and m[0] >= floor]
    return sorted(markers, key=lambda m: m[0])


@dataclass
class Catalog:
    """What `list` shows, and how it was found (for the benchmark and the tests)."""

    entries: list[Entry]
    source: str  # "snapshot" or "rebuilt"
    markers_read: int = 0
    snapshot_written: str | None = None


def _write_snapshot(repository: Repository, entries: Iterable[Entry], through: datetime, old_keys: list[str]) -> str | None:
    """Best effort: a reader without write access (an agent host in the cloud) simply does not cache."""
    from braid.format.catalog import CatalogSnapshot

    store = repository.store
    listed = list(entries)
    summaries = tuple(e for e in listed if isinstance(e, BackupSummary))
    unreadable = tuple(str(e.ref) for e in listed if isinstance(e, Unreadable))
    stamp = catalog_stamp(through)
    key = index_key(stamp, os.urandom(4).hex())
    try:
        store.put(key, CatalogSnapshot(repository.config.id, stamp, summaries, unreadable).to_bytes(), create_only=True)
        stale = [k for k in sorted([*old_keys, key]) if k < key][: -(KEEP_SNAPSHOTS - 1) or None]
        store.delete(stale)
    except (AlreadyExistsError, BackupError):
        return None
    return key


def rebuild_catalog(repository: Repository, *, write: bool = True, now: datetime | None = None) -> Catalog:
    """From the manifests: list them all, check each and read its summary, in parallel; write a snapshot."""
    moment = now or datetime.now(UTC)

    def entry(ref: BackupRef) -> Entry | None:
        try:
            return _summary_of(repository, ref, check_manifest=True)
        except NotFoundError:
            return None  # removed since the listing

    refs = repository.backups()
    entries = [e for e in parallel(refs, entry) if e is not None]
    written = None
    if write:
        # Markers of the last PENDING may name manifests that appear after our listing: readers go over them again.
        _snapshot, old = _newest_snapshot(repository)
        written = _write_snapshot(repository, entries, moment - PENDING, old)
    return Catalog(entries, "rebuilt", 0, written)


def read_catalog(repository: Repository, *, write: bool = True, rebuild: bool = False, now: datetime | None = None) -> Catalog:
    """Every published backup's entry: snapshot + log since, or a rebuild (see the module docstring)."""
    moment = now or datetime.now(UTC)
    if rebuild:
        return rebuild_catalog(repository, write=write, now=moment)
    try:
        snapshot, old_keys = _newest_snapshot(repository)
    except BackupError:
        snapshot, old_keys = None, []  # e.g. a role that may not read catalog/: the manifests are still there
    if snapshot is None or moment - parse_catalog_stamp(snapshot.through) > timedelta(days=MAX_LOG_DAYS):
        return rebuild_catalog(repository, write=write, now=moment)
    markers = _read_log(repository.store, parse_catalog_stamp(snapshot.through) - MARGIN, moment + MARGIN)
    state: dict[BackupRef, Entry | None] = {BackupRef.parse(s.backup): s for s in snapshot.backups}
    removed = {ref for _stamp, ref, event in markers if event == REMOVED}
    retry = {BackupRef.parse(text) for text in snapshot.unreadable}
    fresh = sorted((retry | {ref for _stamp, ref, event in markers if event == PUBLISHED and ref not in state}) - removed)
    for ref, found in zip(fresh, parallel(fresh, lambda r: _confirmed(repository, r, check_manifest=r in retry)), strict=True):
        state[ref] = found
    for ref in removed:
        state.pop(ref, None)
    entries = [e for e in state.values() if e is not None]
    written = None
    fold_until = moment - PENDING
    if write and len(markers) >= COMPACT_AFTER and fold_until > parse_catalog_stamp(snapshot.through):
        # Fold in only what is older than PENDING: a younger `published` marker
        # whose manifest is not there yet stays in the log for the next reader.
        recent = catalog_stamp(fold_until)
        young = {ref for stamp, ref, event in markers if event == PUBLISHED and stamp >= recent}
        keep = [e for ref, e in state.items() if e is not None and ref not in young]
        written = _write_snapshot(repository, keep, fold_until, old_keys)
    return Catalog(entries, "snapshot", len(markers), written)


# Collecting the catalog's own leftovers --------------------------------------

LOG_GRACE = timedelta(days=2)  # log days younger than this stay, whatever the snapshots say


@dataclass
class CatalogLeftovers:
    """What `collect_catalog_leftovers` removed (or, planned only, would remove)."""

    snapshots: list[str]
    log_days: list[str]  # day prefixes, every marker below each removed

    def to_json(self) -> dict[str, list[str]]:
        return {"snapshots": list(self.snapshots), "log_days": list(self.log_days)}


def catalog_leftovers(repository: Repository, now: datetime | None = None) -> CatalogLeftovers:
    """Snapshots superseded by the newest `KEEP_SNAPSHOTS` that check, and log days every kept snapshot has folded in.

    A reader takes the newest snapshot that checks and reads the log from
    its `through` minus `MARGIN`; one that listed the index just before a
    newer snapshot appeared is still reading the one before. So the newest
    two that check stay, and so does every log day a reader of either
    could still ask for, plus `LOG_GRACE`. With no snapshot that checks
    nothing is collected: a reader must rebuild from the manifests anyway.
    A reader that lost the race regardless finds its snapshot gone and takes
    the next (or rebuilds), and a log day gone under it lists as empty:
    every marker in it is older than what both kept snapshots fold in.
    """
    moment = now or datetime.now(UTC)
    store = repository.store
    keys = [info.key for info in store.list(CATALOG_INDEX)]
    kept = [(key, parse_catalog_stamp(snapshot.through)) for key, snapshot in islice(_snapshots_that_check(repository, keys), KEEP_SNAPSHOTS)]
    if not kept:
        return CatalogLeftovers([], [])
    oldest_kept = min(key for key, _through in kept)
    stale = [key for key in keys if key < oldest_kept]
    cutoff = min(min(through for _key, through in kept) - MARGIN, moment - LOG_GRACE)
    first_day_kept = log_day_prefix(catalog_stamp(cutoff))  # the day of the cutoff holds markers on both sides: it stays
    days = [prefix for prefix in child_prefixes(store, CATALOG_LOG) if prefix < first_day_kept]
    return CatalogLeftovers(stale, days)


def collect_catalog_leftovers(repository: Repository, leftovers: CatalogLeftovers) -> None:
    """Delete what `catalog_leftovers` found: snapshots, then each log day's markers."""
    store = repository.store
    store.delete(leftovers.snapshots)
    for day in leftovers.log_days:
        store.delete(info.key for info in store.list(day))
