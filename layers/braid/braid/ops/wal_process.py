"""The WAL worker's step: one staged raw WAL file to its archived form, then no raw byte left.

For `wal-staging/NAME/FILE` (the version an S3 event names, else the
current one): read it, checked against the SHA-256 S3 kept; check a
segment's cluster against `wal/NAME/archive.json` (the first segment
records it; `known` caches it per name, as it never changes); encode it
exactly as a host with a key does (braid.ops.wal_push: a fresh data key
under the context `NAME@wal/FILE`, one chunk frame, the keyed checksum) and
store it create-only under `wal/`, recording the plaintext's SHA-256 for
keyless hosts' duplicate checks; then delete the staged version by its id.

An object already archived is never replaced: the same bytes (a duplicate
push or a redelivered event) make the step a no-op but for the removal;
other bytes (a push its host refused after its staged PUT, or two clusters
racing) leave the archive as it is and remove the refused bytes too
(CONFLICT, which the handler counts). Any failure before the removal leaves
the staged object for the retry: nothing is lost.

Requests per file, the common case: one GET (the staged bytes), one KMS
GenerateDataKey, one PUT, one DELETE (free); scripts/bench_lib/wal_model.py
counts them by running this code.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from braid.errors import AlreadyExistsError, WalConflictError
from braid.format.keys import encryption_context
from braid.format.layout import wal_key, wal_staging_key
from braid.format.repository import Repository
from braid.format.wal import WalFile, wal_context_name
from braid.format.wal_object import encode_wal
from braid.ops.wal import ArchiveInfo
from braid.ops.wal_push import check_identity, compare_archived
from braid.ops.wal_stage import check_staged_identity
from braid.ports.keys import KeyService
from braid.ports.wal_staging import WalStaging

STORED = "stored"
ALREADY = "already archived"
GONE = "not staged"  # processed by an earlier delivery of the same event
CONFLICT = "conflict"


@dataclass(frozen=True)
class Processed:
    name: str
    file: str
    outcome: str
    size: int = 0
    stored_size: int = 0
    detail: str = ""
    members: tuple[Processed, ...] = ()  # a staged bundle's (braid.ops.wal_bundle_process): each member's outcome

    def files(self) -> tuple[Processed, ...]:
        """The WAL files this result is about: a bundle's members, else itself."""
        return self.members or (self,)


def process_staged(
    repository: Repository,
    keys: KeyService,
    staging: WalStaging,
    name: str,
    file: WalFile,
    version: str | None = None,
    *,
    level: int = 3,
    known: dict[str, ArchiveInfo] | None = None,
) -> Processed:
    """Store the staged `file` of `name` (its `version`) in the archive and remove it from staging."""
    staged_key = wal_staging_key(name, file)
    staged = staging.read_staged(staged_key, version)
    if staged is None or staged.data is None:
        return Processed(name, file.name, GONE)
    check_staged(repository, name, file, staged.data, known)
    return archive_alone(repository, keys, staging, name, file, staged.data, staged.version, level)


def check_staged(repository: Repository, name: str, file: WalFile, data: bytes, known: dict[str, ArchiveInfo] | None) -> ArchiveInfo | None:
    """A segment's cluster against the archive's record (the first segment writes it); the record, cached in `known`."""
    if known is not None and name in known:
        check_staged_identity(repository, name, file, data, known[name])
        return known[name]
    info = check_identity(repository, name, file, data)
    if known is not None and info is not None:
        known[name] = info
    return info


def archive_alone(
    repository: Repository, keys: KeyService, staging: WalStaging, name: str, file: WalFile, data: bytes, version: str | None, level: int = 3
) -> Processed:
    """Store `file` as one object (create-only; a copy already there is compared), then remove its staged `version`."""
    digest = hashlib.sha256(data).hexdigest()
    try:
        outcome, stored_size = archive_object(repository, keys, staging, name, file, data, digest, level)
        detail = ""
    except WalConflictError as exc:  # the archive keeps what it has; the refused raw bytes go all the same
        outcome, stored_size, detail = CONFLICT, 0, str(exc)
    staging.remove_staged(wal_staging_key(name, file), version)
    return Processed(name, file.name, outcome, len(data), stored_size, detail)


def archive_object(
    repository: Repository, keys: KeyService, staging: WalStaging, name: str, file: WalFile, data: bytes, digest: str, level: int
) -> tuple[str, int]:
    bound = wal_context_name(name, file.name)
    data_key, wrapped = keys.generate_data_key(encryption_context(repository.config.id, bound))
    blob = encode_wal(data_key, wrapped, bound, data, level)
    try:
        staging.put_archived(wal_key(name, file), blob, digest)
    except AlreadyExistsError:  # archived before (a duplicate, a redelivery): authenticated, raises on other bytes
        compare_archived(repository, keys, name, file, data)
        return ALREADY, 0
    return STORED, len(blob)
