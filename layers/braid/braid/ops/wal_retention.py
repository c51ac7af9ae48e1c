"""Which archived WAL the kept backups need: what prune may remove, and where verify --wal finds gaps.

A backup needs, to reach consistency and then to roll forward, the WAL from
its start (the manifest's `wal.start_lsn` on `wal.timeline`, recorded from
pg_basebackup's stream) onwards. So per timeline, prune removes the WAL
files (segments, .partial and .backup files) before the oldest kept
backup's start on that timeline, and every file of a timeline older than
every kept backup's. It never removes:

- a file of a timeline later than some kept backup's (a descendant, or
  perhaps one: recovery from that backup may follow it);
- a `.history` file (a few hundred bytes each; recovery reads them to follow
  timelines, so those on the path to a kept timeline must stay);
- anything of a name with a kept backup whose start is unknown (no `wal`
  field: an older or unreadable manifest) or with no kept backup at all.

Object Lock (braid.format.lock): a backup the rules let go but its
retention keeps counts as kept, so the WAL it needs stays; the plan says
which files only such backups need (`for_lock`). And an archived object
still under its own retention (S3's retain-until date, read by a HEAD of
each object about to go, only in a repository with a lock) is not deleted:
S3 would only hide it behind a delete marker, the locked version staying
and billed; it is reported with its date (`locked`), as a locked backup is,
and a pack that stays keeps its members.

The host's `braid prune` and the scheduled prune in the cloud
(braid.pipeline.prune_plan) both plan with `plans_for_prune`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from braid.errors import BackupError, StorageError
from braid.format.ids import BackupRef
from braid.format.layout import WAL
from braid.format.repository import Repository
from braid.format.timestamps import format_timestamp
from braid.format.wal import HISTORY, WalFile, segment_name, segment_of
from braid.ops.wal import archived_files, segment_size_of
from braid.ports.store import ObjectStore, child_prefixes

if TYPE_CHECKING:
    from braid.ops.retention import PrunePlan


@dataclass(frozen=True)
class BackupStart:
    """Where a kept backup's WAL begins: its timeline and the number of its start segment."""

    ref: BackupRef
    timeline: int
    segno: int


def wal_start(manifest: Any) -> tuple[int, int] | None:
    """(timeline, start LSN) from a manifest's `wal` field, or None when it records neither (braid.format.pg_backup)."""
    info = getattr(manifest, "wal", None)
    timeline, start = getattr(info, "timeline", None), getattr(info, "start_lsn", None)
    return (timeline, start) if isinstance(timeline, int) and isinstance(start, int) else None


LOCKED_LINES = 3  # objects under their own retention named one per line; more are summed up in one


@dataclass(frozen=True)
class LockedWal:
    """An archived object (a file, or a pack of several) under its own Object Lock retention until `until`: not deleted."""

    key: str
    files: tuple[str, ...]
    until: datetime

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "files": list(self.files), "until": format_timestamp(self.until)}


@dataclass
class WalPrunePlan:
    """The WAL of one name that no kept backup needs, or why none is removed."""

    name: str
    remove: list[tuple[WalFile, str]] = field(default_factory=list)  # (file, key), in key order
    kept_from: list[BackupStart] = field(default_factory=list)
    reason: str | None = None  # set when nothing is removed on purpose
    stays: set[str] = field(default_factory=set)  # files with another copy kept (in a pack a kept backup needs)
    for_lock: list[str] = field(default_factory=list)  # files only backups under Object Lock retention need
    held_until: dict[str, datetime] = field(default_factory=dict)  # the locked backups (NAME@ID) that need them, with their dates
    locked: list[LockedWal] = field(default_factory=list)  # objects that would go but are under their own retention
    error: str | None = None  # the deletion failed (the scheduled prune reports it; the files stay for the next run)

    def files(self) -> list[str]:
        """The names of the files removed, once each (a file may be archived twice: alone and in a pack), in order."""
        return sorted({file.name for file, _key in self.remove} - self.stays)

    def describe(self) -> str:
        if not self.remove:
            return f"no WAL of {self.name} to remove" + (f" ({self.reason})" if self.reason else "")
        names = self.files()
        starts = ", ".join(f"{s.ref} from timeline {s.timeline}" for s in self.kept_from)
        return f"{len(names)} WAL file(s) of {self.name}, {names[0]} .. {names[-1]}, that no kept backup needs (kept: {starts})"

    def describe_lock(self) -> list[str]:
        """One line for the files kept for locked backups; one per object under its own retention, or, beyond
        LOCKED_LINES of them (WAL written locked: every recent object), one line for them all with their dates' range."""
        lines = []
        if self.for_lock:
            held = ", ".join(f"{ref} until {format_timestamp(until)}" for ref, until in sorted(self.held_until.items()))
            lines.append(
                f"kept {len(self.for_lock)} WAL file(s) of {self.name}, {self.for_lock[0]} .. {self.for_lock[-1]}, for backups under"
                f" Object Lock retention ({held}); a prune after their dates removes them"
            )
        if len(self.locked) > LOCKED_LINES:
            files = sorted(f for entry in self.locked for f in entry.files)
            dates = sorted(entry.until for entry in self.locked)
            lines.append(
                f"kept {len(self.locked)} WAL object(s) of {self.name} holding {files[0]} .. {files[-1]}: under Object Lock retention"
                f" until {format_timestamp(dates[0])} .. {format_timestamp(dates[-1])}; a prune after those dates removes them (--json lists each)"
            )
            return lines
        for entry in self.locked:
            lines.append(f"kept WAL object {entry.key}: under Object Lock retention until {format_timestamp(entry.until)}; a prune after that date removes it")
        return lines

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "files": self.files(),
            "kept_from": [{"backup": str(s.ref), "timeline": s.timeline, "segno": s.segno} for s in self.kept_from],
            **({"reason": self.reason} if self.reason else {}),
        }
        if self.for_lock:
            doc["kept_for_lock"] = {"files": list(self.for_lock), "backups": {b: format_timestamp(t) for b, t in sorted(self.held_until.items())}}
        if self.locked:
            doc["locked"] = [entry.to_json() for entry in self.locked]
        if self.error:
            doc["error"] = self.error
        return doc


def removable(file: WalFile, starts: Sequence[BackupStart], segment_size: int) -> bool:
    """Whether no kept backup can need `file` (see the module's rules)."""
    if file.kind == HISTORY or not starts:
        return False
    segno = file.segno(segment_size)
    return all(file.timeline < s.timeline or (file.timeline == s.timeline and segno < s.segno) for s in starts)


def plan_wal_prune(
    repository: Repository,
    name: str,
    kept: Iterable[BackupRef],
    unknown: Iterable[BackupRef] = (),
    *,
    held: Mapping[BackupRef, datetime] | None = None,
    now: datetime | None = None,
) -> WalPrunePlan:
    """The WAL of `name` no backup in `kept` needs; `unknown`: kept backups whose manifest could not be read;
    `held`: those of `kept` kept only by Object Lock retention, with their dates (see the module's rules)."""
    from braid.ops.open import read_manifest

    store = repository.store
    plan = WalPrunePlan(name)
    if list(unknown):
        plan.reason = "a kept backup's manifest could not be read: its WAL start is unknown"
        return plan
    refs = [ref for ref in kept if ref.name == name]
    if not refs:
        plan.reason = "no backup of this name is kept"
        return plan
    size = segment_size_of(store, name)
    for ref in refs:
        try:
            start = wal_start(read_manifest(repository, ref))
        except BackupError as exc:
            plan.reason = f"{ref} could not be read ({exc})"
            return plan
        if start is None:
            plan.reason = f"{ref} records no WAL start (a backup taken before Braid recorded it, or not from pg_basebackup)"
            return plan
        plan.kept_from.append(BackupStart(ref, start[0], segment_of(start[1], size)))
    by_key: dict[str, list[WalFile]] = {}
    for file, key in archived_files(store, name):
        by_key.setdefault(key, []).append(file)
    gone = _unneeded(by_key, plan.kept_from, size)
    held = {ref: until for ref, until in (held or {}).items() if ref.name == name}
    if held:
        free = _unneeded(by_key, [s for s in plan.kept_from if s.ref not in held], size)
        for_lock = [f for key in free - gone for f in by_key[key]]
        plan.for_lock = sorted({f.name for f in for_lock})
        needing = [s.ref for s in plan.kept_from if s.ref in held and any(not removable(f, [s], size) for f in for_lock)]
        plan.held_until = {str(ref): held[ref] for ref in needing}
    if repository.object_lock is not None:
        plan.locked = _under_retention(store, sorted(gone), by_key, now or datetime.now(UTC))
        gone -= {entry.key for entry in plan.locked}
    plan.remove = [(file, key) for key, files in by_key.items() if key in gone for file in files]
    plan.stays = {file.name for key, files in by_key.items() if key not in gone for file in files}
    return plan


def _unneeded(by_key: Mapping[str, list[WalFile]], starts: Sequence[BackupStart], size: int) -> set[str]:
    """The keys no backup starting at `starts` needs: a pack only when no kept backup needs any file in it."""
    return {key for key, files in by_key.items() if all(removable(f, starts, size) for f in files)}


def _under_retention(store: ObjectStore, keys: list[str], by_key: Mapping[str, list[WalFile]], now: datetime) -> list[LockedWal]:
    """Of `keys`, the objects whose own Object Lock retain-until date is after `now` (a HEAD each, in parallel)."""
    from braid.ops.catalog import parallel

    found = []
    for key, info in zip(keys, parallel(keys, store.head), strict=True):
        until = info.retain_until if info is not None else None
        if until is not None and until > now:
            found.append(LockedWal(key, tuple(sorted(f.name for f in by_key[key])), until.astimezone(UTC)))
    return found


def plans_for_prune(repository: Repository, plan: PrunePlan, name: str | None = None) -> list[WalPrunePlan]:
    """Per name with a WAL archive (and a policy `plan` applied): the WAL no backup it keeps, by rule or lock, needs.

    The one planning of WAL retention: the host's `braid prune` and the scheduled prune in the cloud."""
    held = {entry.ref: entry.until for entry in plan.locked}
    kept = [*plan.keep, *held]
    names = [n for n in archive_names(repository.store) if name in (None, n) and n not in plan.unmanaged]
    unread = [u.ref for u in plan.unreadable]
    return [plan_wal_prune(repository, n, kept, [ref for ref in unread if ref.name == n], held=held, now=plan.now) for n in names]


def archive_names(store: ObjectStore) -> list[str]:
    """The names that have a WAL archive."""
    return [prefix[len(WAL) :].rstrip("/") for prefix in child_prefixes(store, WAL)]


def first_needed(start: BackupStart, segment_size: int) -> str:
    return segment_name(start.timeline, start.segno, segment_size)


def execute_wal_prune(repository: Repository, plans: Iterable[WalPrunePlan], *, keep_going: bool = False) -> None:
    """Delete each plan's objects (never a locked one: the plan left those out). A failure raises, or with
    `keep_going` (the scheduled prune) is recorded in that plan's `error` and the other names go on."""
    for plan in plans:
        try:
            repository.store.delete(dict.fromkeys(key for _file, key in plan.remove))
        except BackupError as exc:
            if not keep_going:
                raise
            plan.error = str(exc)


def wal_error(plans: Iterable[WalPrunePlan]) -> StorageError | None:
    """The one-line error a prune ends with when some WAL could not be removed (None: all went)."""
    failed = [plan for plan in plans if plan.error is not None]
    if not failed:
        return None
    first = failed[0]
    return StorageError(
        f"the WAL of {len(failed)} name(s) could not be removed; first: {first.name}: {first.error}"
        " (the backups' prune is done; the next prune removes that WAL)"
    )
