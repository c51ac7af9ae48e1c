"""Backups in progress or abandoned: what `braid list --incomplete` shows.

A backup exists for `list` only once its manifest is published; until then
(or forever, if it died) it is objects under `data/NAME/ID/` (chunks, the
local engine's lease) and, on the cloud path, `staging/NAME/ID/` (the
agent's session, staged segments, the pipeline's plan and results). A user
needs to see those to continue an interrupted cloud upload (`--resume` wants
the exact NAME@ID) and to know what `braid prune` will collect, so this
reads them without a key: two listings (one per root), and per backup at
most the session, the stream-end record and the lease.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from itertools import chain

from braid.errors import BackupError
from braid.format.ids import BackupRef
from braid.format.layout import DATA, STAGING, lease_key, ref_under
from braid.format.lease import LEASE_REFRESH_SECONDS, LeaseRecord
from braid.format.repository import Repository
from braid.format.staging import StagingArea, parse_segment_key
from braid.format.timestamps import format_timestamp
from braid.ports.store import ObjectInfo, TemporaryFiles

# A lease refreshed within this long means the backup's process was alive then:
# a few missed refreshes (a stalled disk) must not call a running backup abandoned.
ACTIVE_WITHIN = timedelta(seconds=3 * LEASE_REFRESH_SECONDS)

PRUNE_HINT = "'braid prune' collects it once inactive for longer than --orphan-grace-hours (default 48)"


@dataclass
class _Found:
    """What the two listings say about one unpublished backup."""

    where: list[str] = field(default_factory=list)
    objects: int = 0
    stored_bytes: int = 0
    last_modified: datetime | None = None
    has_lease: bool = False
    staged_bytes: int = 0  # completed segment objects (raw parts the agent uploaded)

    def add(self, info: ObjectInfo) -> None:
        self.objects += 1
        self.stored_bytes += info.size
        if info.modified is not None and (self.last_modified is None or info.modified > self.last_modified):
            self.last_modified = info.modified


@dataclass(frozen=True)
class IncompleteBackup:
    """One backup that has objects but no manifest, and what to do about it."""

    backup: str
    where: tuple[str, ...]  # "data" and/or "staging"
    state: str  # uploading | processing | running | abandoned
    started: str  # from the id: when the backup began
    last_activity: str | None  # newest sign of life the repository holds, when it keeps times
    objects: int
    stored_bytes: int
    hint: str
    inputs: tuple[str, ...] = ()  # cloud session: the inputs as the agent named them
    staged_bytes: int | None = None  # cloud session: raw bytes in completed segments so far
    host: str | None = None  # local engine's lease: where the backup runs or ran
    pid: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "backup": self.backup,
            "where": list(self.where),
            "state": self.state,
            "started": self.started,
            "last_activity": self.last_activity,
            "objects": self.objects,
            "stored_bytes": self.stored_bytes,
            "staged_bytes": self.staged_bytes,
            "inputs": list(self.inputs),
            "host": self.host,
            "pid": self.pid,
            "hint": self.hint,
        }


def _scan(repository: Repository, root: str, name: str | None, found: dict[BackupRef, _Found]) -> None:
    store = repository.store
    listed: Iterable[ObjectInfo] = store.list(root)
    if root == DATA and isinstance(store, TemporaryFiles):  # a folder of only `.tmp-*` files is a backup that died too
        listed = chain(listed, store.list_temporary(root))
    for info in listed:
        ref = ref_under(root, info.key)
        if ref is None or (name is not None and ref.name != name):
            continue
        entry = found.setdefault(ref, _Found())
        if root.rstrip("/") not in entry.where:
            entry.where.append(root.rstrip("/"))
        entry.add(info)
        if root == DATA and info.key == lease_key(ref):
            entry.has_lease = True
        if root == STAGING and parse_segment_key(ref, info.key) is not None:
            entry.staged_bytes += info.size


def _lease(repository: Repository, ref: BackupRef) -> LeaseRecord | None:
    """The local engine's lease, or None when it is gone or unreadable (it is only a hint)."""
    try:
        record = LeaseRecord.from_bytes(repository.store.get(lease_key(ref)))
    except (BackupError, ValueError):
        return None
    return record if record.backup == str(ref) else None


def _gone_from_here(lease: LeaseRecord) -> bool:
    """The lease names a process of this host that no longer exists (killed, or the host rebooted)."""
    if lease.host != os.uname().nodename:
        return False
    try:
        os.kill(lease.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, as another user
    return False


def _newest(*moments: datetime | None) -> datetime | None:
    known = [m for m in moments if m is not None]
    return max(known) if known else None


def _describe(repository: Repository, ref: BackupRef, entry: _Found, now: datetime) -> IncompleteBackup:
    lease = _lease(repository, ref) if entry.has_lease else None
    last = _newest(entry.last_modified, lease.refreshed_at if lease else None)
    found = IncompleteBackup(
        backup=str(ref),
        where=tuple(entry.where),
        state="abandoned",
        started=format_timestamp(ref.started),
        last_activity=format_timestamp(last) if last else None,
        objects=entry.objects,
        stored_bytes=entry.stored_bytes,
        hint=PRUNE_HINT,
        host=lease.host if lease else None,
        pid=lease.pid if lease else None,
    )
    if STAGING.rstrip("/") in entry.where and repository.config.cloud:  # only a pipeline's repository resumes
        return _cloud_session(repository, ref, entry, found)
    if lease is not None and now - lease.refreshed_at <= ACTIVE_WITHIN:
        if _gone_from_here(lease):
            return replace(found, hint=f"its process (pid {lease.pid} on {lease.host}) is gone; {PRUNE_HINT}")
        return replace(found, state="running", hint=f"running on {lease.host} (pid {lease.pid}); if that process is gone, {PRUNE_HINT}")
    return found


def _cloud_session(repository: Repository, ref: BackupRef, entry: _Found, found: IncompleteBackup) -> IncompleteBackup:
    """A staging area: an upload to resume, a pipeline to follow, or (no session) leftovers."""
    area = StagingArea(repository.store, ref)
    try:
        session = area.read_session()
        stream_end = area.read_stream_end()
    except BackupError:  # no session (removed first, or never written whole): nothing to resume
        return found
    found = replace(found, inputs=tuple(session.inputs), staged_bytes=entry.staged_bytes, last_activity=found.last_activity or session.created)
    if stream_end is None:
        return replace(found, state="uploading", hint=f"if its agent is gone, continue with 'braid backup --resume {ref}' and the same inputs")
    return replace(found, state="processing", hint=f"fully staged; the pipeline publishes it or failed: see 'braid status {ref}'")


def incomplete_backups(repository: Repository, name: str | None = None, now: datetime | None = None) -> list[IncompleteBackup]:
    """Every backup with data or staging but no manifest, oldest first."""
    now = now or datetime.now(UTC)
    found: dict[BackupRef, _Found] = {}
    for root in (DATA, STAGING):
        _scan(repository, root, name, found)
    published: Iterable[BackupRef] = repository.backups(name)
    for ref in published:
        found.pop(ref, None)
    return [_describe(repository, ref, found[ref], now) for ref in sorted(found, key=lambda r: (r.id, r.name))]
