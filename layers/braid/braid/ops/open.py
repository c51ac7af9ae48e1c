"""Opening a published backup: the one way to get a manifest worth trusting.

Restore, deep verify and the scheduled maintenance job all need the same four
steps in the same order: resolve NAME@latest, read the manifest and check its
own checksum, unwrap its data key with the key service, and authenticate the
manifest under that key. Only then may its chunk list and checksums be used
to judge chunk bytes. Doing this in one place keeps the order (and the error
each step raises) the same on every path.
"""

from __future__ import annotations

from typing import NamedTuple

from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.manifest import Manifest
from braid.format.repository import Repository
from braid.ports.keys import KeyService


class OpenedBackup(NamedTuple):
    """An authenticated manifest and the data key that authenticated it."""

    manifest: Manifest
    key: DataKey


def open_backup(repository: Repository, ref: BackupRef, keys: KeyService) -> OpenedBackup:
    """Resolve, load, unwrap, authenticate.

    Raises NotFoundError (no such backup), IntegrityError (manifest corrupt,
    moved from another repository, or failing authentication) or
    KeyAccessError (the key service cannot unwrap this backup's data key).
    """
    sealed = repository.load(ref)
    key = keys.unwrap(sealed.manifest.key)
    return OpenedBackup(sealed.authenticate(key), key)


def read_manifest(repository: Repository, ref: BackupRef) -> Manifest:
    """The manifest checked against its own checksum only, without a key.

    Enough to list, show or quick-verify a backup (the stored chunk checksums
    it lists are compared, nothing is decrypted); never enough to trust the
    plaintext a chunk decodes to: use `open_backup` for that.
    """
    return repository.load(ref).manifest
