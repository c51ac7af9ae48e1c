"""Copy: a published backup into a second repository, its chunks as stored (`braid copy`).

A chunk's authenticated header names its backup (NAME@ID), not its
repository, and its keys derive from the backup's data key: so a copy keeps
NAME@ID, copies every stored object byte for byte (never decrypted), and
only the data key is re-wrapped, for the target's master key and the
target's encryption context (braid.ports.keys.DataKeyCopier). Per backup:

1. open the source backup: manifest checksum, unwrap, authenticate
   (braid.ops.open);
2. copy the backups it needs first (a chain's `parent`, `_parents`: the one
   place that knows of chains), so the target never holds an incremental
   without its ancestors;
3. a manifest already in the target must open under the target's key and
   describe the same chunks: then the backup is done (idempotent);
4. every stored object the target lacks with its size (one LIST) is read
   from the source, checked against the manifest's checksum (a corrupt
   source chunk is never propagated) and written with that checksum for the
   target store to check; a rerun after an interruption sends only what is
   missing (resumable);
5. the copy's manifest is the source's BODY with the target's repository id,
   the re-wrapped key and `copied` (every other byte kept, chain fields and
   labels included), sealed with the same data key; the re-wrapped key is
   first checked to unwrap under the target's key to that data key. Then
   the catalog summary, the manifest create-only, read back and compared,
   and the chunks listed again (braid.engine.finalize's order): published
   last and verified.

An interrupted copy leaves chunks without a manifest in the target: not a
backup; a rerun completes it, and the target's prune collects it once idle
for its grace period if it is never rerun. `stop` (the scheduled copy's
Lambda deadline, braid.ops.copy_pending) is asked before each object:
once it says so, CopyInterrupted leaves the copy unpublished for the next
run. A backup whose objects are all there is published (the deadline's
margin covers it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from braid.engine.finalize import check_chunks_listed, check_chunks_still_listed
from braid.errors import AlreadyExistsError, BackupError, IntegrityError, NotFoundError, StorageError, UsageError
from braid.format.canonical import canonical_json
from braid.format.checksum import stored_checksum
from braid.format.ids import BackupRef
from braid.format.keys import DataKey, WrappedKey, encryption_context
from braid.format.layout import data_prefix, manifest_key
from braid.format.manifest import Manifest, open_manifest, seal_body
from braid.format.repository import Repository
from braid.format.stored import StoredObject, stored_objects
from braid.format.timestamps import utc_now
from braid.ops.catalog import write_summary
from braid.ops.open import open_backup
from braid.ports.keys import DataKeyCopier, KeyService

DEFAULT_WORKERS = 4


class CopyInterrupted(Exception):
    """`stop` said so before the copy of `backup` was published: nothing of it is published; a rerun resumes it."""

    def __init__(self, backup: str) -> None:
        super().__init__(f"the copy of {backup} was interrupted before it was published; the next run resumes it")
        self.backup = backup


def _never() -> bool:
    return False


@dataclass
class CopyReport:
    target: str
    copied: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    failed: list[tuple[str, BackupError]] = field(default_factory=list)
    objects: int = 0  # stored objects written to the target (those it already had are not counted)
    bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "copied": self.copied,
            "already": self.already,
            "failed": [{"backup": b, "error": str(e)} for b, e in self.failed],
            "objects_copied": self.objects,
            "bytes_copied": self.bytes,
        }


@dataclass(frozen=True)
class CopyTarget:
    """The second repository, its key service (to check the re-wrapped key) and what re-wraps data keys for it."""

    repository: Repository
    keys: KeyService
    copier: DataKeyCopier


def _parents(body: dict[str, Any]) -> list[BackupRef]:
    """The backups this one needs to be restored (an incremental's `parent`; docs/format.md, Chains): copied first.

    The one place `braid copy` knows of chains: a full backup, or a manifest
    written before chains existed, has none.
    """
    parent = body.get("parent")
    return [BackupRef.parse(parent)] if isinstance(parent, str) else []


def copy_backup(
    source: Repository,
    source_keys: KeyService,
    target: CopyTarget,
    ref: BackupRef,
    report: CopyReport,
    *,
    workers: int = DEFAULT_WORKERS,
    progress: Callable[[str, str], None] = lambda backup, outcome: None,
    stop: Callable[[], bool] = _never,
    _seen: frozenset[BackupRef] = frozenset(),
) -> None:
    """Copy `ref` (and, first, what it needs) into `target`; records the outcome in `report` (see the module docstring)."""
    ref = source.resolve(ref)
    if ref in _seen:
        raise IntegrityError(f"backup {ref}'s chain names itself as an ancestor; the repository's manifests are inconsistent")
    if str(ref) in report.copied or str(ref) in report.already:
        return
    sealed = source.load(ref)
    key = source_keys.unwrap(sealed.manifest.key)
    manifest = sealed.authenticate(key)
    body = json.loads(sealed.body)
    for parent in _parents(body):
        copy_backup(source, source_keys, target, parent, report, workers=workers, progress=progress, stop=stop, _seen=_seen | {ref})
    if _already_copied(target, ref, manifest):
        report.already.append(str(ref))
        progress(str(ref), "already")
        return
    objects = stored_objects(manifest)
    written, size = _copy_objects(source, target.repository, ref, objects, workers, stop)
    report.objects += written
    report.bytes += size
    _publish(source, target, ref, manifest, key, body, objects)
    report.copied.append(str(ref))
    progress(str(ref), "copied")


def _already_copied(target: CopyTarget, ref: BackupRef, manifest: Manifest) -> bool:
    """True if the target holds this backup, opening under its key with the source's chunks; IntegrityError if it holds another."""
    try:
        theirs = open_backup(target.repository, ref, target.keys).manifest
    except NotFoundError:
        return False
    if theirs.inputs != manifest.inputs:
        raise IntegrityError(f"{target.repository.url} already holds a different {ref} (other chunks); it was not copied")
    return True


def _copy_objects(
    source: Repository, target: Repository, ref: BackupRef, objects: list[StoredObject], workers: int, stop: Callable[[], bool]
) -> tuple[int, int]:
    """Write every object the target lacks with its recorded size; (objects written, bytes written).

    An absent object is written create-only (a Braid stack's bucket lets no
    chunk be overwritten); one found written meanwhile (a concurrent copy of
    the same backup) counts as copied, the listing before publishing checks it.
    """
    present = {info.key: info.size for info in target.store.list(data_prefix(ref))}
    missing = [stored for stored in objects if present.get(stored.key) != stored.size]

    def one(stored: StoredObject) -> int:
        if stop():
            raise CopyInterrupted(str(ref))
        try:
            data = source.store.get(stored.key)
        except NotFoundError:
            raise IntegrityError(f"{stored.label} of backup {ref} is missing from {source.url} ({stored.key}); nothing was copied of it") from None
        checksum = stored_checksum(data)
        if len(data) != stored.size or checksum != stored.checksum:
            raise IntegrityError(
                f"{stored.label} of backup {ref} in {source.url} does not match its manifest (corrupt); not copied:"
                f" run braid verify --deep {ref} there"
            )
        try:
            target.store.put(stored.key, data, checksum=checksum, durable=False, create_only=stored.key not in present)
        except AlreadyExistsError:
            return 0
        return len(data)

    if len(missing) <= 1:
        sizes = [one(stored) for stored in missing]
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(missing)), thread_name_prefix="braid-copy") as pool:
            sizes = list(pool.map(one, missing))
    target.store.sync(stored.key for stored in missing)
    return len(missing), sum(sizes)


def _publish(
    source: Repository, target: CopyTarget, ref: BackupRef, manifest: Manifest, key: DataKey, body: dict[str, Any], objects: list[StoredObject]
) -> None:
    """The copy's manifest, sealed with the backup's data key, published last and verified (module docstring, 5)."""
    repository = target.repository
    context = encryption_context(repository.config.id, str(ref))
    wrapped = target.copier.copy_wrapped(manifest.key, context)
    _check_rewrapped(target.keys, wrapped, key, ref)
    body = {k: v for k, v in body.items() if k != "rekeyed"}  # the source's key history is not the copy's
    body.update(repository=repository.config.id, key=wrapped.to_json(), copied={"at": utc_now(), "from": source.config.id})
    new_body = canonical_json(body)
    sealed = seal_body(new_body, key.manifest_mac(new_body))
    copy = open_manifest(sealed, f"copy of {ref}").authenticate(key)
    check_chunks_listed(repository.store, ref, objects, when="before publishing the copy")
    target_key = manifest_key(ref)
    catalog = write_summary(repository.store, copy, key)
    try:
        repository.store.put(target_key, sealed, create_only=True)
    except AlreadyExistsError:
        raise StorageError(f"a manifest for {ref} appeared in {repository.url} during the copy (another copy?); run the copy again") from None
    except BaseException:
        repository.store.delete([target_key, *catalog])
        raise
    try:
        if repository.store.get(target_key) != sealed:
            raise IntegrityError(f"the copy's manifest of {ref} read back differently from what was written")
        check_chunks_still_listed(repository.store, ref, objects)
    except BaseException:
        repository.store.delete([target_key, *catalog])
        raise


def _check_rewrapped(keys: KeyService, wrapped: WrappedKey, key: DataKey, ref: BackupRef) -> None:
    if keys.unwrap(wrapped).fingerprint != key.fingerprint:
        raise IntegrityError(f"the re-wrapped data key of {ref} does not unwrap to the same key under the target's key; nothing was published")


def copy_backups(
    source: Repository,
    source_keys: KeyService,
    target: CopyTarget,
    refs: list[BackupRef],
    *,
    workers: int = DEFAULT_WORKERS,
    progress: Callable[[str, str], None] = lambda backup, outcome: None,
) -> CopyReport:
    """Copy each of `refs` (oldest first, so ancestors precede); a backup that fails is reported and the others still copied."""
    if source.config.id == target.repository.config.id:
        raise UsageError(f"{target.repository.url} is the source repository itself (id {source.config.id}): copy to another repository")
    report = CopyReport(target.repository.url)
    for ref in refs:
        try:
            copy_backup(source, source_keys, target, ref, report, workers=workers, progress=progress)
        except NotFoundError as exc:
            if ref.is_latest or len(refs) == 1:
                raise
            report.failed.append((str(ref), exc))  # removed since the listing
        except BackupError as exc:
            if len(refs) == 1:
                raise
            report.failed.append((str(ref), exc))
    return report
