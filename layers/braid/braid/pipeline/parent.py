"""Prepare's part in an incremental on the cloud path: open the parent's chain, hand its values to the agent.

The agent on the database host holds no key: it picks the parent by its
manifest (plaintext, checked by its SHA-256) and names it in its session with
the placeholders its producer uses (`parent_values`). Prepare, which may
decrypt data keys under each backup's own encryption context, authenticates
every link of the parent's chain (braid.ops.chain.open_chain), reads the
parent's encrypted metadata, and writes `parent.json` (and, for
`{parent_manifest}`, `parent/backup_manifest`) to the backup's own staging
(braid.format.staging.chain). A chain that is missing or does not
authenticate is `refused` (the agent exits 6 and abandons the stream; nothing
is published), a value the parent lacks is `unavailable` (exit 2): both
before the agent starts the producer. Finalize or Cleanup remove both
objects with the rest of staging, every version of each.
"""

from __future__ import annotations

from braid.engine.xbstream import CHECKPOINTS, to_lsn
from braid.errors import IntegrityError, NotFoundError
from braid.format.digests import sha256
from braid.format.ids import BackupRef
from braid.format.metadata import BACKUP_MANIFEST
from braid.format.repository import Repository
from braid.format.staging import SessionRecord, StagingArea
from braid.format.staging.chain import ParentRecord
from braid.ops.chain import open_chain
from braid.ops.metadata import read_metadata
from braid.ops.open import OpenedBackup
from braid.ports.keys import KeyService

__all__ = ["hand_over_parent"]


def hand_over_parent(repository: Repository, keys: KeyService, area: StagingArea, session: SessionRecord) -> ParentRecord | None:
    """For an incremental's session, write (once) and return Prepare's answer; None for a full backup."""
    if not session.lineage.is_incremental:
        return None
    found = area.read_parent()
    if found is not None:  # a retried Prepare: the agent may already have acted on the first answer
        return found[0]
    parent = str(session.lineage.parent)
    try:
        links = open_chain(repository, BackupRef.parse(parent), keys, purpose="the incremental's parent")
        if links[0].manifest.backup != session.lineage.chain_full:
            raise IntegrityError(f"{parent} belongs to the chain of {links[0].manifest.backup}, not of {session.lineage.chain_full}")
    except NotFoundError as exc:
        record = ParentRecord(parent, refused=f"the incremental's parent is missing: {parent} not found ({exc}); refusing the incremental")
    except IntegrityError as exc:
        record = ParentRecord(parent, refused=f"the incremental's parent {parent} is unreadable: {exc}; refusing the incremental")
    else:
        record, manifest = _values(repository, links[-1], session.parent_values)
        area.write_parent(record, manifest)
        return record
    area.write_parent(record)
    return record


def _values(repository: Repository, parent: OpenedBackup, names: list[str]) -> tuple[ParentRecord, bytes | None]:
    """The parent's `{parent_lsn}` and `{parent_manifest}` the agent asked for (braid.ops.chain_placeholders says the same)."""
    backup = parent.manifest.backup
    lsn = manifest = None
    try:
        if "parent_lsn" in names:
            lsn = to_lsn(_read(repository, parent, CHECKPOINTS, "parent_lsn", "a MariaDB xbstream"))
            if lsn is None:
                return ParentRecord(backup, unavailable=f"{{parent_lsn}}: the xtrabackup_checkpoints of the parent {backup} names no to_lsn"), None
        if "parent_manifest" in names:
            manifest = _read(repository, parent, BACKUP_MANIFEST, "parent_manifest", "a PostgreSQL tar stream (pg_basebackup -Ft -D -)")
    except _Unavailable as missing:
        return ParentRecord(backup, unavailable=str(missing)), None
    except IntegrityError as exc:
        return ParentRecord(backup, refused=f"the incremental's parent {backup} is unreadable: {exc}; refusing the incremental"), None
    digest = (len(manifest), sha256(manifest).hex()) if manifest is not None else None
    return ParentRecord(backup, lsn=lsn, manifest=digest), manifest


class _Unavailable(Exception):
    pass


def _read(repository: Repository, parent: OpenedBackup, kind: str, name: str, source: str) -> bytes:
    try:
        return read_metadata(repository.store, parent.manifest, parent.key, kind)
    except NotFoundError:
        raise _Unavailable(
            f"{{{name}}}: the parent {parent.manifest.backup} has no {kind} (its stream was not {source}); nothing was started"
        ) from None
