"""Finalize: turn stored chunks into a published, verified backup.

Shared by the local engine and the Finalize Lambda. The order is the safety
argument: check every chunk the manifest will name (present with its
recorded size, by LIST: 1,000 chunks per request), under Object Lock keep
the history file of its PostgreSQL timeline as long as the backup, seal
the manifest, publish it create-only (so two
finalizers can never both win), read it back and compare it with the sealed
bytes, and check by LIST that no chunk went meanwhile. Only then is the
backup complete; until then it does not exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

from braid.errors import AlreadyExistsError, IntegrityError, StorageError
from braid.format.algorithms import algorithms
from braid.format.chain import Lineage
from braid.format.digests import sha256
from braid.format.ids import BackupRef
from braid.format.keys import DataKey, WrappedKey
from braid.format.layout import chunk_key, data_prefix, manifest_key, metadata_key
from braid.format.manifest import ChunkEntry, InputEntry, Manifest
from braid.format.metadata import MetadataEntry, open_metadata, seal_metadata
from braid.format.pg_backup import WalInfo
from braid.format.stored import StoredObject, stored_objects
from braid.format.timestamps import utc_now
from braid.format.usage import Usage
from braid.ops.catalog import write_summary
from braid.ops.wal_history_lock import STAT as HISTORY_STAT
from braid.ops.wal_history_lock import retain_history
from braid.ports.store import ObjectStore


@dataclass(frozen=True)
class InputRecord:
    """One input as the reader saw it: what the user named and how long it was."""

    index: int
    source: str
    length: int


def assemble_inputs(key: DataKey, inputs: Sequence[InputRecord], entries: Iterable[ChunkEntry], backup: str) -> tuple[InputEntry, ...]:
    """Group chunk results by input, in offset order, and check they tile each input exactly."""
    by_input: dict[int, list[ChunkEntry]] = {record.index: [] for record in inputs}
    for entry in entries:
        if entry.input_index not in by_input:
            raise IntegrityError(f"{backup}: chunk {entry.index} names input {entry.input_index}, which the backup does not have")
        by_input[entry.input_index].append(entry)
    assembled = []
    for record in sorted(inputs, key=lambda r: r.index):
        chunks = sorted(by_input[record.index], key=attrgetter("offset"))
        covered = sum([c.length for c in chunks])
        if covered != record.length:
            raise IntegrityError(
                f"{backup}: input {record.index} ({record.source}) is {record.length} bytes but its stored chunks cover {covered};"
                " chunks are missing or duplicated"
            )
        mac = key.input_mac(record.index, record.length, [c.mac for c in chunks])
        assembled.append(InputEntry(record.index, record.source, record.length, mac, tuple(chunks)))
    return tuple(assembled)


def finalize_backup(
    store: ObjectStore,
    *,
    ref: BackupRef,
    repository_id: str,
    key: DataKey,
    wrapped: WrappedKey,
    chunk_size: int,
    inputs: Sequence[InputRecord],
    entries: Iterable[ChunkEntry],
    level: int,
    created: str,
    timings: dict[str, float],
    engine: str,
    stats: dict[str, Any] | None = None,
    usage: Callable[[Manifest], Usage] | None = None,
    lineage: Lineage | None = None,
    wal: WalInfo | None = None,
    metadata: Mapping[str, bytes] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Manifest:
    """Check, seal, publish and verify the manifest; `usage`: what the backup used, asked for once every
    chunk is checked (the finalizer's own requests so far included), sealed into the manifest.

    `wal` is recorded as it is (and, under Object Lock, its timeline's history file kept as long as the backup,
    recorded in `stats`: braid.ops.wal_history_lock); each of `metadata` (kind -> bytes) is stored encrypted beside the chunks
    (braid.format.metadata) before the manifest that names it, and removed with them on failure."""
    entries_by_kind = {kind: _store_metadata(store, key, ref, kind, plaintext) for kind, plaintext in sorted((metadata or {}).items())}
    manifest = Manifest(
        repository=repository_id,
        backup=str(ref),
        created=created,
        completed=utc_now(),
        chunk_size=chunk_size,
        key=wrapped,
        inputs=assemble_inputs(key, inputs, entries, str(ref)),
        algorithms=algorithms(level),
        timings=timings,
        engine=engine,
        stats=stats or {},
        lineage=lineage or Lineage(),
        wal=wal,
        metadata=entries_by_kind,
        labels=dict(labels) if labels else None,
    )
    manifest.check_structure()
    # Presence and size of every object (pack), by LIST (one request per 1,000
    # objects, not a HEAD each). Each pack's checksum was verified where it
    # was written: S3 checked the CRC64NVME sent with the PUT, a local store
    # checked it in `put` from the very buffer it wrote, and the entry
    # records that same checksum; reading it back here would add a request
    # per chunk (S3) or only measure the page cache (local).
    # Computed once for the checks before and after publishing and the sync:
    # only the usage changes below, and it names no chunk.
    objects = stored_objects(manifest)
    check_chunks_listed(store, ref, objects, when="before publishing")
    store.sync([*(stored.key for stored in objects), *(metadata_key(ref, kind) for kind in entries_by_kind)])
    # Under Object Lock, the history file of the backup's timeline is kept as
    # long as the backup before it is published (braid.ops.wal_history_lock):
    # a failure fails the backup here, with nothing published.
    history = retain_history(store, ref, wal)
    if history is not None:
        manifest = replace(manifest, stats={**manifest.stats, HISTORY_STAT: history})
    if usage is not None:
        manifest = replace(manifest, usage=usage(manifest))
    sealed = manifest.seal(key)
    target = manifest_key(ref)
    # The catalog's records come first (braid.ops.catalog): a backup whose
    # manifest is published is then never missing from `list`.
    catalog = write_summary(store, manifest, key)
    try:
        store.put(target, sealed, create_only=True)
    except AlreadyExistsError:
        raise StorageError(f"a manifest for {ref} is already published; refusing to replace it") from None
    except BaseException:
        # The write may have landed before it failed (an answer lost, an
        # interrupt): withdraw it too, or the caller's removal of the chunks
        # would leave a listed manifest without them (tests/test_faults.py).
        store.delete([target, *catalog])
        raise
    try:
        # The stored bytes must be exactly those sealed: then their checksum and
        # MAC are the ones just computed under `key`, and they open to the
        # manifest sealed (tests/test_manifest.py, tests/test_local_engine.py),
        # so re-opening them would only parse again what `seal` just wrote.
        if store.get(target) != sealed:
            raise IntegrityError(f"manifest of {ref} read back differently from what was written")
        check_chunks_still_listed(store, ref, objects)
    except BaseException:
        # Not verified, so not a backup: withdraw it before anyone lists it,
        # and before the caller removes the chunks it names.
        store.delete([target, *catalog])
        raise
    return manifest


def _store_metadata(store: ObjectStore, key: DataKey, ref: BackupRef, kind: str, plaintext: bytes) -> MetadataEntry:
    """One metadata object, create-only like the chunks beside it (the bucket refuses anything else under data/).
    One already there (a retried Finalize's) is adopted when it opens under this key to exactly `plaintext`."""
    stored, entry = seal_metadata(key, str(ref), kind, plaintext)
    try:
        store.put(metadata_key(ref, kind), stored, create_only=True)
        return entry
    except AlreadyExistsError:
        found = store.get(metadata_key(ref, kind))
        adopted = MetadataEntry(len(plaintext), len(found), sha256(found).hex())
        if open_metadata(key, str(ref), kind, found, adopted) != plaintext:
            raise IntegrityError(f"{kind} of backup {ref} is already stored with other content; refusing to replace it") from None
        return adopted


def check_chunks_listed(store: ObjectStore, ref: BackupRef, objects: Iterable[StoredObject], *, when: str) -> None:
    """Every object (pack) the manifest names (`objects`: its `stored_objects`) is stored with its recorded size
    (one LIST per 1,000 objects)."""
    listed = {info.key: info.size for info in store.list(data_prefix(ref))}
    for stored in objects:
        size = listed.get(stored.key)
        if size is None:
            raise IntegrityError(f"{stored.label} of backup {ref} is missing from the repository ({stored.key}) {when}")
        if size != stored.size:
            raise IntegrityError(f"{stored.label} of backup {ref} is {size} bytes, manifest says {stored.size} ({when})")


def check_chunks_still_listed(store: ObjectStore, ref: BackupRef, objects: Iterable[StoredObject]) -> None:
    """After publishing: every chunk is still there (one LIST per 1,000 chunks); `objects`: the manifest's `stored_objects`.

    A prune that took this backup's data for an abandoned backup's (it
    looked before the manifest existed) may have deleted chunks after the
    presence check above; the manifest is then withdrawn, so a backup with
    missing chunks is never left published. Prune looks for the manifest
    just before deleting and again after (braid.ops.leftovers), so a
    collision is avoided or reported, never silent.
    """
    listed = {info.key for info in store.list(data_prefix(ref))}
    for stored in objects:
        if stored.key not in listed:
            raise IntegrityError(
                f"{stored.label} of backup {ref} disappeared while the backup was being published"
                " (a concurrent prune or forget?); the backup was withdrawn: run it again"
            )


def discard_backup_data(store: ObjectStore, ref: BackupRef, indexes: Iterable[int] | None = None) -> None:
    """Remove a failed backup's chunks (all under its data prefix, or the given ones)."""
    if indexes is None:
        store.delete([info.key for info in store.list(data_prefix(ref))])
    else:
        store.delete([chunk_key(ref, i) for i in indexes])
