"""`wal-push` and `wal-fetch` with the stack: the host stages raw WAL, the WAL worker compresses and encrypts it.

A host of a repository with a pipeline holds no key. `stage_wal` stores the
file's raw bytes under `wal-staging/NAME/FILE`, create-only, with the
SHA-256 S3 verifies: once S3 acknowledges, the file is durable (exit 0) and
the WAL worker (braid.ops.wal_process) makes the archived object. The same
rules as braid.ops.wal_push hold without a key, by SHA-256: the file
archived or staged with the same bytes is accepted; with other bytes it is
refused (WalConflictError naming both checksums) and nothing is replaced.
The archive is checked again after a staged PUT, so a file the worker
stored between the first check and the PUT is still compared.

`fetch_staged` serves a file the worker has not processed yet, checked
against its SHA-256 (the archived form is preferred: braid.ops.wal_fetch).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from braid.errors import AlreadyExistsError, InputError, IntegrityError, WalConflictError
from braid.format.layout import wal_key, wal_staging_key
from braid.format.repository import Repository
from braid.format.wal import SEGMENT, WalFile, segment_identity
from braid.ops.wal import read_archive_info
from braid.ops.wal_push import ALREADY, PushResult, read_wal_file
from braid.ports.wal_staging import WalStaging

STAGED = "staged"


def check_staged_identity(repository: Repository, name: str, file: WalFile, data: bytes) -> None:
    """braid.ops.wal_push.check_identity without writing: the worker records the first segment's cluster."""
    if file.kind != SEGMENT:
        return
    identity = segment_identity(data[:64])
    if identity is None:
        raise InputError(f"{file.name} does not start with a WAL segment header: not a PostgreSQL WAL segment")
    if len(data) != identity.segment_size:
        raise InputError(f"{file.name} is {len(data)} bytes, but its header says segments are {identity.segment_size}: not a whole segment")
    if identity.page_address != file.segno(identity.segment_size) * identity.segment_size:
        raise InputError(f"{file.name} holds the WAL of another position (its header says {identity.page_address:X}): renamed or recycled")
    recorded = read_archive_info(repository.store, name)
    if recorded is not None and (recorded.system_identifier, recorded.segment_size) != (identity.system_identifier, identity.segment_size):
        raise IntegrityError(
            f"{file.name} is from the cluster with system identifier {identity.system_identifier} (segments of {identity.segment_size} bytes),"
            f" but the WAL archive of {name!r} belongs to {recorded.system_identifier} ({recorded.segment_size} bytes):"
            " archive a new cluster under a new --name"
        )


def _conflict(file: WalFile, name: str, where: str, stored: str, pushed: str) -> WalConflictError:
    return WalConflictError(
        f"{file.name} is already {where} under {name!r} with different content ({where} sha256:{stored}, pushed sha256:{pushed});"
        " nothing was overwritten: a second cluster writing to the same name?"
    )


def _compare(staging: WalStaging, name: str, file: WalFile, digest: str, size: int) -> PushResult | None:
    """ALREADY when `file` is archived or staged with these bytes; None when neither; WalConflictError when with others."""
    key = wal_key(name, file)
    archived = staging.archived_sha256(key)
    if archived:
        if archived != digest:
            raise _conflict(file, name, "archived", archived, digest)
        return PushResult(file.name, key, ALREADY, size, 0)
    if archived == "":  # stored by a host with a key (--engine local): its SHA-256 is inside the encryption
        raise IntegrityError(
            f"{file.name} is archived under {name!r} without a recorded checksum (stored by a host with the key):"
            " push it from a host that holds the repository's key to compare it"
        )
    staged_key = wal_staging_key(name, file)
    staged = staging.staged(staged_key)
    if staged is None:
        return None
    if staged.sha256 != digest:
        raise _conflict(file, name, "staged", staged.sha256, digest)
    return PushResult(file.name, staged_key, ALREADY, size, staged.size)


def stage_wal(repository: Repository, staging: WalStaging, name: str, path: Path) -> PushResult:
    """Stage the WAL file at `path` for `name`; returns once S3 holds it (or it was archived or staged with these bytes)."""
    file = WalFile.parse(path.name)
    data = read_wal_file(path)
    check_staged_identity(repository, name, file, data)
    digest = hashlib.sha256(data).hexdigest()
    found = _compare(staging, name, file, digest, len(data))
    if found is not None:
        return found
    key = wal_staging_key(name, file)
    try:
        staging.put_staged(key, data, digest)
    except AlreadyExistsError:  # staged meanwhile by another pusher: the same rule as finding it first
        again = _compare(staging, name, file, digest, len(data))
        if again is None:  # pragma: no cover - processed and gone between the PUT and the look
            raise
        return again
    # The worker may have stored an earlier push of this name between the first look and the PUT: that one wins.
    archived = staging.archived_sha256(wal_key(name, file))
    if archived and archived != digest:
        raise _conflict(file, name, "archived", archived, digest)
    return PushResult(file.name, key, STAGED, len(data), len(data))


def fetch_staged(staging: WalStaging, name: str, file: WalFile) -> bytes | None:
    """The verified raw bytes of a `file` still in staging, or None when it is not staged."""
    staged = staging.read_staged(wal_staging_key(name, file))
    return None if staged is None else staged.data
