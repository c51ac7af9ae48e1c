"""Staged WAL bundles on the host: `wal-push --async` stages a slot's ready segments in one PUT; readers find them.

Policy `async-bundle` (the resident pusher, braid.cli.wal_pusher; off with
BRAID_WAL_BUNDLE=off): at a backlog, the ready segments of one slot
(braid.format.wal_bundle.bundle_slot) go in ONE staging PUT, so S3 sends
one event and SQS carries one message for them. Only into an archive whose
record is version 3 (`ArchiveInfo.may_stage_bundles`: every reader of its
staging reads bundles; an older Braid refuses the record). Each member is
reported stored (exit 0) only after the bundle's PUT succeeded, and only
after the same checks a single staged file gets: its cluster against the
record, then, after the PUT, the archive (its own object or a pack's
member) and a single staged copy, compared by SHA-256 (WalConflictError
naming both sums when the bytes differ: the archive and the worker keep
the first copy). A slot has at most one bundle (create-only): when it is
there already, its members go one object each (compared with it).

Readers: `bundled_sha256` (the sync `wal-push`'s check: a ranged GET of the
slot's head, answered 404 in the common case), `fetch_bundled` (`wal-fetch`
of a segment still in staging), `staged_bundle_members` (the `-X none`
gate), and the WAL worker (braid.ops.wal_bundle_process).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from braid.errors import AlreadyExistsError, BackupError, InputError, NotFoundError
from braid.format.layout import wal_staging_bundle_key, wal_staging_key
from braid.format.repository import Repository
from braid.format.wal import SEGMENT, WalFile
from braid.format.wal_bundle import HEAD_READ, BundleIndex, BundleWriter, WalBundle, bundle_slot, head_length, parse_head
from braid.ops.wal import ArchiveInfo, read_archive_info
from braid.ops.wal_packed import PackListing
from braid.ops.wal_push import ALREADY, PushResult
from braid.ports.store import ObjectStore
from braid.ports.wal_staging import WalStaging

BUNDLED = "staged in a bundle"


def read_bundle_head(store: ObjectStore, key: str) -> BundleIndex | None:
    """The checked head of the staged bundle at `key` (one ranged GET, two for a long index); None when it is not there."""
    where = f"staged WAL bundle {store.url}/{key}"
    try:
        head = store.get_range(key, 0, HEAD_READ)
        needed = head_length(head, where)
        if needed > len(head):
            head = store.get_range(key, 0, needed)
    except NotFoundError:
        return None
    return parse_head(head, where)


def bundled_sha256(store: ObjectStore, name: str, file: WalFile) -> str | None:
    """The SHA-256 a staged bundle records for segment `file`, or None when no staged bundle holds it."""
    if file.kind != SEGMENT:
        return None
    index = read_bundle_head(store, wal_staging_bundle_key(name, bundle_slot(file)))
    entry = None if index is None else index.entry(file.name)
    return None if entry is None else entry.sha256


def fetch_bundled(staging: WalStaging, name: str, file: WalFile) -> bytes | None:
    """The verified raw bytes of segment `file` from its slot's staged bundle, or None when no bundle holds it."""
    if file.kind != SEGMENT:
        return None
    key = wal_staging_bundle_key(name, bundle_slot(file))
    staged = staging.read_staged(key)  # the whole object: S3 checks its SHA-256, the index checks the member's
    if staged is None or staged.data is None:
        return None
    bundle = WalBundle.parse(staged.data, f"staged WAL bundle {key}")
    entry = bundle.index.entry(file.name)
    return None if entry is None else bundle.member(entry)


def staged_bundle_members(store: ObjectStore, key: str) -> list[str]:
    """The segment names the staged bundle at `key` holds ([] when it is gone)."""
    index = read_bundle_head(store, key)
    return [] if index is None else index.names


def _read_into(path: Path, view: memoryview) -> None:
    """The file's bytes into `view`, which is its size when it was listed: InputError when it is not that size now."""
    try:
        with open(path, "rb", buffering=0) as handle:
            filled = 0
            while filled < len(view):
                got = handle.readinto(view[filled:])
                if not got:
                    break
                filled += got
            if filled != len(view) or handle.read(1):
                raise InputError(f"WAL file {path} changed size while it was read (was {len(view)} bytes): not a finished WAL file")
    except FileNotFoundError:
        raise InputError(f"WAL file {path} not found") from None
    except OSError as exc:
        raise InputError(f"cannot read WAL file {path}: {exc.strerror or exc}") from None


def stage_bundle(
    repository: Repository, staging: WalStaging, name: str, paths: Sequence[Path], packs: PackListing | None = None, *,
    recorded: ArchiveInfo | None = None, archived_checked: frozenset[Path] = frozenset(),
) -> list[PushResult | BackupError]:
    """Stage the whole segments at `paths` (one slot, ascending) in one bundle; one result per path, in order: a
    PushResult once the bundle is durable in staging (or the file was archived or staged with these bytes), else
    the file's error. Fewer than two members, an archive that may not stage bundles, or a slot whose bundle is
    there already: each file goes alone (braid.ops.wal_stage.stage_wal). `recorded`: the archive's record when the
    caller has read it (else it is read here); `archived_checked`: paths the caller found not archived just before
    (braid.ops.wal_lookahead), whose archive is not looked at again after the PUT (their single staged copy is)."""
    from braid.ops.wal_stage import already_stored, check_staged_identity, stage_wal

    def alone(indices: Sequence[int]) -> dict[int, PushResult | BackupError]:
        out: dict[int, PushResult | BackupError] = {}
        for i in indices:
            try:
                out[i] = stage_wal(repository, staging, name, paths[i], packs)
            except BackupError as exc:
                out[i] = exc
        return out

    files = [WalFile.parse(p.name) for p in paths]
    recorded = recorded or read_archive_info(repository.store, name)
    if len(paths) < 2 or recorded is None or not recorded.may_stage_bundles:
        done = alone(range(len(paths)))
        return [done[i] for i in range(len(paths))]
    results: dict[int, PushResult | BackupError] = {}
    sizes: dict[int, int] = {}
    for i, path in enumerate(paths):
        try:
            sizes[i] = path.stat().st_size
        except FileNotFoundError:
            results[i] = InputError(f"WAL file {path} not found")
        except OSError as exc:
            results[i] = InputError(f"cannot read WAL file {path}: {exc.strerror or exc}")
    members = sorted(sizes)
    if len(members) < 2:
        results.update(alone(members))
        return [results[i] for i in range(len(paths))]
    writer = BundleWriter([files[i].name for i in members], [sizes[i] for i in members])
    for position, i in enumerate(members):  # each file read in place: the pusher holds the bundle once
        try:
            with writer.member(position) as view:
                _read_into(paths[i], view)
                check_staged_identity(repository, name, files[i], view, recorded)
        except BackupError as exc:
            results[i] = exc
    if any(i in results for i in members):  # a file that cannot be bundled: the others again, without it
        del writer
        rest = [i for i in members if i not in results]
        again = stage_bundle(repository, staging, name, [paths[i] for i in rest], packs, recorded=recorded, archived_checked=archived_checked)
        results.update(zip(rest, again, strict=True))
        return [results[i] for i in range(len(paths))]
    key = wal_staging_bundle_key(name, writer.slot)
    blob = writer.finish()
    digests = dict(zip(members, writer.digests, strict=True))
    del writer
    try:
        staging.put_staged(key, blob, hashlib.sha256(blob).hexdigest())
    except AlreadyExistsError:  # the slot's bundle was staged before (an earlier pusher): each file alone, compared with it
        del blob
        results.update(alone(members))
        return [results[i] for i in range(len(paths))]
    except BackupError as exc:
        return [results.get(i, exc) for i in range(len(paths))]
    del blob
    for i, digest in digests.items():  # durable now; each member compared with what the archive and staging hold
        file = files[i]
        try:
            stored = paths[i] not in archived_checked and already_stored(repository, staging, name, file, digest, recorded, packs, bundled=False)
            outcome = ALREADY if stored else BUNDLED
            single = staging.staged(wal_staging_key(name, file))
            if single is not None and single.sha256 != digest:
                from braid.ops.wal_stage import conflict

                raise conflict(file, name, "staged", single.sha256, digest)
            results[i] = PushResult(file.name, key, outcome, sizes[i], sizes[i])
        except BackupError as exc:
            results[i] = exc
    return [results[i] for i in range(len(paths))]
