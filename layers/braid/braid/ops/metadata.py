"""Reading a backup's metadata objects (braid.format.metadata): PostgreSQL's backup_manifest, captured from its stream.

Only through an authenticated manifest (braid.ops.open): the manifest names
each object's exact bytes, and the object authenticates under the backup's
data key; anything else is an IntegrityError (exit 6), and a manifest that
names no such object is a NotFoundError (exit 8) naming the backup and kind.
"""

from __future__ import annotations

from braid.errors import IntegrityError, NotFoundError
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.layout import metadata_key
from braid.format.manifest import Manifest
from braid.format.metadata import open_metadata
from braid.format.repository import Repository
from braid.ops.open import open_backup
from braid.ports.keys import KeyService
from braid.ports.store import ObjectStore

__all__ = ["read_backup_metadata", "read_metadata"]


def read_metadata(store: ObjectStore, manifest: Manifest, key: DataKey, kind: str) -> bytes:
    """The plaintext of the backup's `kind` metadata; `manifest` must be authenticated under `key`."""
    entry = manifest.metadata.get(kind)
    if entry is None:
        raise NotFoundError(f"backup {manifest.backup} has no {kind} (it was not a PostgreSQL tar stream, or was taken before Braid captured it)")
    ref = BackupRef.parse(manifest.backup)
    try:
        stored = store.get(metadata_key(ref, kind))
    except NotFoundError:
        raise IntegrityError(f"{kind} of backup {ref} is missing from the repository ({metadata_key(ref, kind)})") from None
    return open_metadata(key, manifest.backup, kind, stored, entry)


def read_backup_metadata(repository: Repository, backup: BackupRef | str, kind: str, keys: KeyService) -> bytes:
    """Open `backup` (NAME@ID or NAME@latest) and return its `kind` metadata, verified."""
    ref = backup if isinstance(backup, BackupRef) else BackupRef.parse(backup)
    manifest, key = open_backup(repository, ref, keys)
    return read_metadata(repository.store, manifest, key, kind)
