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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from braid.errors import BackupError
from braid.format.ids import BackupRef
from braid.format.layout import WAL
from braid.format.repository import Repository
from braid.format.wal import HISTORY, WalFile, segment_name, segment_of
from braid.ops.wal import archived_files, segment_size_of
from braid.ports.store import ObjectStore, child_prefixes


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


@dataclass
class WalPrunePlan:
    """The WAL of one name that no kept backup needs, or why none is removed."""

    name: str
    remove: list[tuple[WalFile, str]] = field(default_factory=list)  # (file, key), in key order
    kept_from: list[BackupStart] = field(default_factory=list)
    reason: str | None = None  # set when nothing is removed on purpose
    stays: set[str] = field(default_factory=set)  # files with another copy kept (in a pack a kept backup needs)

    def files(self) -> list[str]:
        """The names of the files removed, once each (a file may be archived twice: alone and in a pack), in order."""
        return sorted({file.name for file, _key in self.remove} - self.stays)

    def describe(self) -> str:
        if not self.remove:
            return f"no WAL of {self.name} to remove" + (f" ({self.reason})" if self.reason else "")
        names = self.files()
        starts = ", ".join(f"{s.ref} from timeline {s.timeline}" for s in self.kept_from)
        return f"{len(names)} WAL file(s) of {self.name}, {names[0]} .. {names[-1]}, that no kept backup needs (kept: {starts})"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "files": self.files(),
            "kept_from": [{"backup": str(s.ref), "timeline": s.timeline, "segno": s.segno} for s in self.kept_from],
            **({"reason": self.reason} if self.reason else {}),
        }


def removable(file: WalFile, starts: Sequence[BackupStart], segment_size: int) -> bool:
    """Whether no kept backup can need `file` (see the module's rules)."""
    if file.kind == HISTORY or not starts:
        return False
    segno = file.segno(segment_size)
    return all(file.timeline < s.timeline or (file.timeline == s.timeline and segno < s.segno) for s in starts)


def plan_wal_prune(repository: Repository, name: str, kept: Iterable[BackupRef], unknown: Iterable[BackupRef] = ()) -> WalPrunePlan:
    """The WAL of `name` no backup in `kept` needs; `unknown`: kept backups whose manifest could not be read."""
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
    # A pack goes only when no kept backup needs any file in it.
    plan.remove = [(file, key) for key, files in by_key.items() if all(removable(f, plan.kept_from, size) for f in files) for file in files]
    gone = {key for _file, key in plan.remove}
    plan.stays = {file.name for key, files in by_key.items() if key not in gone for file in files}
    return plan


def archive_names(store: ObjectStore) -> list[str]:
    """The names that have a WAL archive."""
    return [prefix[len(WAL) :].rstrip("/") for prefix in child_prefixes(store, WAL)]


def first_needed(start: BackupStart, segment_size: int) -> str:
    return segment_name(start.timeline, start.segno, segment_size)


def execute_wal_prune(repository: Repository, plans: Iterable[WalPrunePlan]) -> None:
    for plan in plans:
        repository.store.delete(dict.fromkeys(key for _file, key in plan.remove))
