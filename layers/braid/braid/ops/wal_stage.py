"""`wal-push` and `wal-fetch` with the stack: the host stages raw WAL, the WAL worker compresses and encrypts it.

A host of a repository with a pipeline holds no key. `stage_wal` stores the
file's raw bytes under `wal-staging/NAME/FILE`, create-only, with the
SHA-256 S3 verifies: once S3 acknowledges, the file is durable (exit 0) and
the WAL worker (braid.ops.wal_process) makes the archived object. The same
rules as braid.ops.wal_push hold without a key, by SHA-256: the file
archived or staged with the same bytes is accepted; with other bytes it is
refused (WalConflictError naming both checksums) and nothing is replaced.
The archive is checked again after a staged PUT, so a file the worker
stored between the first check and the PUT is still compared. In an
archive whose record says it may hold packs (version 2), a file with no
object of its own is looked for in its directory's packs (one LIST of
`wal/NAME/DIR/pack-`; the async pusher lists a directory once, PackListing)
and compared with the plaintext SHA-256 the pack's index records (a ranged
GET of the pack's head: the index is not encrypted, so no key is needed).

`fetch_staged` serves a file the worker has not processed yet, checked
against its SHA-256 (the archived form is preferred: braid.ops.wal_fetch),
alone or from its slot's staged bundle (braid.ops.wal_bundled).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from braid.errors import AlreadyExistsError, IntegrityError, WalConflictError
from braid.format.layout import wal_key, wal_staging_key
from braid.format.repository import Repository
from braid.format.wal import SEGMENT, WalFile
from braid.ops.wal import ArchiveInfo, read_archive_info
from braid.ops.wal_packed import PackListing, read_pack_head
from braid.ops.wal_push import ALREADY, PushResult, check_cluster, read_wal_file, segment_identity_of
from braid.ports.wal_staging import WalStaging

STAGED = "staged"


def check_staged_identity(
    repository: Repository, name: str, file: WalFile, data: bytes | memoryview, recorded: ArchiveInfo | None = None
) -> ArchiveInfo | None:
    """braid.ops.wal_push.check_identity without writing (the worker records the first segment's cluster), against
    `recorded` when the caller has the archive's record, else the one in the repository (None before the first segment).
    Returns the record it checked against (None for a file that is not a segment, or before the first segment)."""
    identity = segment_identity_of(file, data)
    if identity is None:
        return None
    if recorded is None:
        recorded = read_archive_info(repository.store, name)
    if recorded is not None:
        check_cluster(name, file, identity, recorded)
    return recorded


def conflict(file: WalFile, name: str, where: str, stored: str, pushed: str) -> WalConflictError:
    return WalConflictError(
        f"{file.name} is already {where} under {name!r} with different content ({where} sha256:{stored}, pushed sha256:{pushed});"
        " nothing was overwritten: a second cluster writing to the same name?"
    )


def _compare_staged(staging: WalStaging, name: str, file: WalFile, digest: str, size: int) -> PushResult | None:
    """ALREADY when `file` is staged with these bytes; None when it is not staged; WalConflictError when with others."""
    staged_key = wal_staging_key(name, file)
    staged = staging.staged(staged_key)
    if staged is None:
        return None
    if staged.sha256 != digest:
        raise conflict(file, name, "staged", staged.sha256, digest)
    return PushResult(file.name, staged_key, ALREADY, size, staged.size)


def _check_archived(staging: WalStaging, name: str, file: WalFile, digest: str) -> bool:
    """Whether `file` is archived (with these bytes: WalConflictError when with others)."""
    archived = staging.archived_sha256(wal_key(name, file))
    if archived is None:
        return False
    if archived == "":  # stored by a host with a key: its SHA-256 is inside the encryption
        raise IntegrityError(
            f"{file.name} is archived under {name!r} without a recorded checksum (stored by a host with the key):"
            " push it from a host that holds the repository's key to compare it"
        )
    if archived != digest:
        raise conflict(file, name, "archived", archived, digest)
    return True


def _check_packed(repository: Repository, name: str, file: WalFile, digest: str, packs: PackListing) -> bool:
    """Whether a pack holds `file` (with these bytes: WalConflictError naming both checksums when with others), by
    the plaintext SHA-256 its index records; the first pack whose head parses answers (IntegrityError when none does)."""
    first: IntegrityError | None = None
    for key in packs.holding(repository.store, name, file):
        try:
            entry = read_pack_head(repository.store, name, key).entry(file.name, f"WAL pack {repository.store.url}/{key}")[1]
        except IntegrityError as exc:
            first = first or exc
            continue
        if entry.sha256 != digest:
            raise conflict(file, name, "archived", entry.sha256, digest)
        return True
    if first is not None:
        raise first
    return False


def already_stored(
    repository: Repository, staging: WalStaging, name: str, file: WalFile, digest: str, recorded: ArchiveInfo | None,
    packs: PackListing | None, *, bundled: bool = True,
) -> bool:
    """Whether `file` is archived (its own object: a HEAD; else, where the record allows packs, a pack's member) or,
    with `bundled` where the record allows bundles, in its slot's staged bundle (a ranged GET of its head), with
    these bytes; WalConflictError naming both SHA-256 sums when with others."""
    if _check_archived(staging, name, file, digest):
        return True
    if recorded is not None and recorded.may_hold_packs and _check_packed(repository, name, file, digest, packs or PackListing()):
        return True
    if not (bundled and recorded is not None and recorded.may_stage_bundles):
        return False
    from braid.ops.wal_bundled import bundled_sha256

    found = bundled_sha256(repository.store, name, file)
    if found is not None and found != digest:
        raise conflict(file, name, "staged", found, digest)
    return found is not None


def _in_bundle(repository: Repository, name: str, file: WalFile, digest: str, recorded: ArchiveInfo | None) -> str | None:
    """The key of `file`'s slot's staged bundle when it holds `file` with these bytes (one ranged GET, where the record
    allows bundles), else None; WalConflictError naming both SHA-256 sums when it holds other bytes."""
    if file.kind != SEGMENT or recorded is None or not recorded.may_stage_bundles:
        return None
    from braid.format.layout import wal_staging_bundle_key
    from braid.format.wal_bundle import bundle_slot
    from braid.ops.wal_bundled import bundled_sha256

    found = bundled_sha256(repository.store, name, file)
    if found is not None and found != digest:
        raise conflict(file, name, "staged", found, digest)
    return None if found is None else wal_staging_bundle_key(name, bundle_slot(file))


def stage_wal(
    repository: Repository, staging: WalStaging, name: str, path: Path, packs: PackListing | None = None, *, bundle_checked: bool = False
) -> PushResult:
    """Stage the WAL file at `path` for `name`; returns once S3 holds it (or it was archived or staged with these bytes).

    The PUT comes first (create-only), but for the look at the bundle: the common case is one PUT and one HEAD of the archive (and, in an archive
    that may hold packs, one LIST of the file's directory's packs, or `packs`' listing kept by the caller; in one
    that may stage bundles, a ranged GET of the segment's slot's bundle head, a 404 but at a backlog). A
    duplicate of a file already processed is staged again and found archived; the worker then removes the copy
    (braid.ops.wal_process, braid.ops.wal_pack_process). The bundle is looked at before the PUT (a file a bundle
    holds is not staged again), unless the caller did (`bundle_checked`: braid.ops.wal_lookahead).
    """
    file = WalFile.parse(path.name)
    data = read_wal_file(path)
    recorded = check_staged_identity(repository, name, file, data)
    digest = hashlib.sha256(data).hexdigest()
    key = wal_staging_key(name, file)
    outcome = STAGED
    bundle = None if bundle_checked else _in_bundle(repository, name, file, digest, recorded)
    if bundle is not None:  # staged in its slot's bundle (by a look-ahead push, or the async pusher): no PUT
        return PushResult(file.name, bundle, ALREADY, len(data), len(data))
    try:
        staging.put_staged(key, data, digest)
    except AlreadyExistsError:  # staged before (PostgreSQL pushes again after a crash), or by another pusher
        found = _compare_staged(staging, name, file, digest, len(data))
        if found is not None:
            return found
        if not already_stored(repository, staging, name, file, digest, recorded, packs):  # pragma: no cover - processed meanwhile
            raise
        return PushResult(file.name, key, ALREADY, len(data), len(data))
    # Archived before (this push was a duplicate, or another push won): that copy stays, and must hold these bytes.
    if already_stored(repository, staging, name, file, digest, recorded, packs, bundled=False):  # the bundle: looked at above
        outcome = ALREADY
    return PushResult(file.name, key, outcome, len(data), len(data))


def fetch_staged(staging: WalStaging, name: str, file: WalFile) -> bytes | None:
    """The verified raw bytes of a `file` still in staging (alone, else in its slot's bundle), or None when it is not staged."""
    staged = staging.read_staged(wal_staging_key(name, file))
    if staged is not None:
        return staged.data
    from braid.ops.wal_bundled import fetch_bundled

    return fetch_bundled(staging, name, file)
