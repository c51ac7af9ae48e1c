"""Policy `sync-bundle`: a plain `wal-push` at a backlog stages its segment's ready slot-mates with it, in ONE PUT.

PostgreSQL runs archive_command once per segment, one at a time, so a
synchronous push stages one object per segment: a PUT, an S3 event, an SQS
message and a worker GET each, which alone cost about the backup path's
whole TiB (docs/design/wal-archive.md, "Synchronous wal-push's cost"). At a
backlog the segments after this one in its slot
(braid.format.wal_bundle.bundle_slot) are complete and marked ready
(`pg_wal/archive_status/FILE.ready` beside the file): this call stages them
with its own as one bundle (braid.ops.wal_bundled.stage_bundle, the async
pusher's code) and returns once the bundle is durable in staging.
PostgreSQL's next calls find their segment in the bundle
(braid.ops.wal_stage: a ranged GET of its head, before any PUT) and exit 0
without staging.

A file is bundled only if the archive does not hold it yet (its own
object's HEAD and the directory's packs, listed once for the call): a
slot-mate that is archived, with the same bytes or other ones, is left for
its own call, and this call's own file, if archived, is staged alone as
before; either is reported as before (exit 0, or exit 7 naming both sums).
After the PUT each member's single staged copy is compared, as the async
pusher does, but not its archive again: a copy archived between that check
and the PUT (another pusher's, staged and processed within the bundle's
upload) is compared by the WAL worker, which refuses other bytes (metric
WalConflicts, its alarm). A
quiet cluster (no ready slot-mate), a file that is not a whole segment, an
archive whose record does not allow bundles (version 3), a slot bundled
already, or the policy off (BRAID_WAL_SYNC_BUNDLE=off, contract.
ENV_WAL_SYNC_BUNDLE): the file is staged alone, as before.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from braid.errors import BackupError
from braid.format.layout import wal_staging_bundle_key
from braid.format.repository import Repository
from braid.format.wal import SEGMENT, WalFile
from braid.format.wal_bundle import BUNDLE_FILES, BundleIndex, bundle_slot
from braid.ops.wal import ArchiveInfo, read_archive_info
from braid.ops.wal_bundled import read_bundle_head, stage_bundle
from braid.ops.wal_packed import PackListing
from braid.ops.wal_push import ALREADY, PushResult, read_wal_file
from braid.ops.wal_stage import already_stored, conflict, stage_wal
from braid.ports.store import ObjectStore
from braid.ports.wal_staging import WalStaging


def ready_slot_mates(path: Path) -> list[Path]:
    """The segments after `path`'s in its slot that PostgreSQL marked ready (`archive_status/FILE.ready` beside it), ascending."""
    file = WalFile.parse(path.name)
    if file.kind != SEGMENT:
        return []
    slot = bundle_slot(file)
    low, last = int(file.name[16:24], 16), int(slot[16:24], 16) + BUNDLE_FILES - 1
    status = path.parent / "archive_status"
    mates = []
    for n in range(low + 1, last + 1):
        name = f"{file.name[:16]}{n:08X}"
        if (status / f"{name}.ready").exists() and (path.parent / name).is_file():
            mates.append(path.parent / name)
    return mates


def _not_archived(repository: Repository, staging: WalStaging, name: str, mate: Path, recorded: ArchiveInfo, packs: PackListing) -> bool:
    """Whether the archive holds no copy of `mate` (a HEAD, and the call's one listing of the directory's packs)."""
    try:
        data = mate.read_bytes()
        return not already_stored(repository, staging, name, WalFile.parse(mate.name), hashlib.sha256(data).hexdigest(), recorded, packs, bundled=False)
    except (BackupError, OSError):
        return False  # archived with other bytes, or unreadable: its own call reports it


@dataclass(frozen=True)
class Looked:
    """What a call read of its segment's slot's bundle: its head (None: no bundle), and the answer when it holds the segment."""

    index: BundleIndex | None
    result: PushResult | None = None


def look_in_bundle(store: ObjectStore, name: str, path: Path) -> Looked | None:
    """The slot's bundle head for the segment at `path` (one ranged GET, needing no config: only the stack stages
    bundles) and, when it holds the segment, the answer: ALREADY with the same SHA-256, WalConflictError naming both
    with other bytes. None for a file that is not a whole segment, or when the bucket could not be read (the caller's
    repository open then says why)."""
    file = WalFile.parse(path.name)
    if file.kind != SEGMENT:
        return None
    key = wal_staging_bundle_key(name, bundle_slot(file))
    try:
        index = read_bundle_head(store, key)
    except BackupError:  # unreadable, or a damaged head: the usual path reads it again and says why
        return None
    entry = None if index is None else index.entry(file.name)
    if index is None or entry is None:
        return Looked(index)
    data = read_wal_file(path)
    digest = hashlib.sha256(data).hexdigest()
    if entry.sha256 != digest:
        raise conflict(file, name, "staged", entry.sha256, digest)
    return Looked(index, PushResult(file.name, key, ALREADY, len(data), len(data)))


def stage_with_mates(
    repository: Repository, staging: WalStaging, name: str, path: Path, *, bundle: bool = True, looked: Looked | None = None
) -> PushResult:
    """Stage the WAL file at `path`, with its ready slot-mates in one bundle where the policy and the archive allow;
    returns once `path`'s bytes are durable in staging (or archived or staged already with these bytes).

    A segment's slot's bundle is looked at first (one ranged GET, or `looked`, the caller's: a 404 but at a backlog,
    the one the plain push made after its PUT before this policy): a call whose segment a look-ahead staged answers
    from it alone."""
    file = WalFile.parse(path.name)
    if not bundle or file.kind != SEGMENT:
        return stage_wal(repository, staging, name, path)
    if looked is None:
        looked = look_in_bundle(repository.store, name, path)
    if looked is not None and looked.result is not None:  # staged by an earlier call's look-ahead (or the async pusher)
        return looked.result
    index = None if looked is None else looked.index
    mates = ready_slot_mates(path) if looked is not None and index is None else []  # a slot is bundled once
    recorded = read_archive_info(repository.store, name) if mates else None
    if recorded is None or not recorded.may_stage_bundles:  # quiet, or an archive whose readers may predate bundles
        return stage_wal(repository, staging, name, path, bundle_checked=looked is not None)
    packs = PackListing()  # the directory's packs listed once for this call
    if not _not_archived(repository, staging, name, path, recorded, packs):  # archived: alone, compared and reported as before
        return stage_wal(repository, staging, name, path, packs, bundle_checked=True)
    checked = frozenset([path, *(m for m in mates if _not_archived(repository, staging, name, m, recorded, packs))])
    members = [path, *(m for m in mates if m in checked)]
    result = stage_bundle(repository, staging, name, members, packs, recorded=recorded, archived_checked=checked)[0]
    if isinstance(result, BackupError):
        raise result
    return result
