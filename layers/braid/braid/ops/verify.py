"""Verification of stored backups, quick and deep.

Quick: every stored object (pack) holding a selected chunk exists with its
recorded size and the stored checksum (the store's own where it keeps one,
as S3 does; otherwise read and computed): one HEAD per pack, not per chunk. Deep: every chunk is fetched, authenticated, decompressed and its
plaintext checked against the manifest's keyed checksum, and each input's
chained checksum recomputed, as pgBackRest's verify does for its files.

A chunk the store will not hand over (permission denied, an I/O error) is
not evidence of corruption: it is reported apart, as unreadable, so the CLI
says "storage error" (exit 7) for it, as restore does, and "integrity
error" (exit 6) only for what was read and found wrong. Any other error
(the backup removed while being read, a key that does not open it) stops
the check and reaches the caller as itself.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from braid.errors import IntegrityError, PermissionDeniedError, StorageError
from braid.format.buffers import new_buffer
from braid.format.checksum import stored_checksum
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.layout import data_prefix
from braid.format.manifest import ChunkEntry, Manifest
from braid.format.repository import Repository
from braid.format.stored import StoredObject, group_packs, stored_object
from braid.format.verification import Selection
from braid.ops.chunk_reader import ChunkReader
from braid.ops.metadata import read_metadata
from braid.ops.open import open_backup, read_manifest
from braid.ports.keys import KeyService
from braid.ports.store import ObjectInfo, ObjectStore


def listed_objects(store: ObjectStore, ref: BackupRef) -> dict[str, ObjectInfo]:
    """Every object under the backup's data prefix, with its size, from LIST (S3: 1,000 keys a request).

    S3's LIST names each object's checksum algorithm but not its value, so
    the stored checksum still takes a HEAD per object (`check_object`: per
    pack, not per chunk); what LIST settles alone, a missing or resized
    object, costs no request per object.
    """
    return {info.key: info for info in store.list(data_prefix(ref))}


def check_object(store: ObjectStore, ref: BackupRef, stored: StoredObject, *, read_if_unknown: bool = True, listed: dict[str, ObjectInfo] | None = None) -> None:
    """Presence, size, and checksum of one stored object (a pack, or a chunk alone in its object).

    With `listed` (`listed_objects`), presence and size come from the listing
    and only the checksum from a HEAD; `read_if_unknown` reads objects whose
    store keeps no checksum. The pack's checksum is the one the manifest's
    frame checksums combine to (braid.format.stored), as S3 computes it.
    """
    key, where = stored.key, f"{stored.label} of backup {ref}"
    if listed is not None:
        seen = listed.get(key)
        if seen is None:
            raise IntegrityError(f"{where} is missing from the repository ({key})")
        if seen.size != stored.size:
            raise IntegrityError(f"{where} is {seen.size} bytes, manifest says {stored.size}")
    info = store.head(key)
    if info is None:
        raise IntegrityError(f"{where} is missing from the repository ({key})")
    if info.size != stored.size:
        raise IntegrityError(f"{where} is {info.size} bytes, manifest says {stored.size}")
    checksum = info.checksum
    if checksum is None:
        if not read_if_unknown:
            return
        checksum = stored_checksum(store.get(key))
    if checksum != stored.checksum:
        raise IntegrityError(f"{where}: stored checksum mismatch (corrupt in the repository)")


@dataclass
class VerifyReport:
    backup: str
    mode: str
    chunks_total: int
    chunks_checked: int = 0
    bytes_checked: int = 0
    failures: list[str] = field(default_factory=list)  # every problem, in chunk order
    unreadable: list[str] = field(default_factory=list)  # those where the store failed the read: unchecked, not known bad
    denied: bool = False  # some read was refused by permissions (another user's files): not a result to record

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def corrupt(self) -> bool:
        """Something was read and found wrong (not merely unreadable)."""
        return len(self.failures) > len(self.unreadable)

    def to_json(self) -> dict[str, object]:
        return {
            "backup": self.backup,
            "mode": self.mode,
            "ok": self.ok,
            "chunks_total": self.chunks_total,
            "chunks_checked": self.chunks_checked,
            "bytes_checked": self.bytes_checked,
            "failures": self.failures,
            "unreadable": self.unreadable,
        }


def select_chunks(manifest: Manifest, sample_percent: float | None) -> list[ChunkEntry]:
    """The chunks to check: all, or a fresh random sample each run, so repeated sampled runs cover the whole backup."""
    return selected_chunks(manifest, Selection.sample(sample_percent))


def selected_chunks(manifest: Manifest, selection: Selection) -> list[ChunkEntry]:
    """The chunks `selection` names, in chunk order: all, a random sample, or one part of a rotation.

    A rotation's part k of t is every chunk whose index is k-1 modulo t:
    spread over the whole backup (each input, each region of the disk), and
    t runs of parts 1..t check every chunk exactly once.
    """
    chunks = list(manifest.chunks())
    if selection.kind == "rotation":
        assert selection.part is not None and selection.of is not None
        return [c for c in chunks if c.index % selection.of == selection.part - 1]
    if selection.kind != "sample" or selection.percent is None or selection.percent >= 100:
        return chunks
    count = max(1, round(len(chunks) * selection.percent / 100)) if chunks else 0
    return sorted(random.SystemRandom().sample(chunks, count), key=lambda c: c.index)


def verify_backup(
    store: ObjectStore,
    manifest: Manifest,
    key: DataKey | None,
    *,
    deep: bool,
    sample_percent: float | None = None,
    workers: int = 4,
    selection: Selection | None = None,
) -> VerifyReport:
    """Check a backup and report every failure (not just the first); `selection` overrides `sample_percent`."""
    chunks = selected_chunks(manifest, selection or Selection.sample(sample_percent))
    report = check_entries(store, manifest, key, chunks, deep=deep, workers=workers)
    if deep and key is not None and len(chunks) == manifest.chunk_count and report.ok:
        report.failures.extend(input_checksum_failures(manifest, key))
    if deep and key is not None:
        report.failures.extend(metadata_failures(store, manifest, key))
    return report


def metadata_failures(store: ObjectStore, manifest: Manifest, key: DataKey) -> list[str]:
    """Each metadata object the manifest names (a captured backup_manifest) read, authenticated and checked against its entry."""
    failures = []
    for kind in sorted(manifest.metadata):
        try:
            read_metadata(store, manifest, key, kind)
        except IntegrityError as exc:
            failures.append(str(exc))
    return failures


def input_checksum_failures(manifest: Manifest, key: DataKey) -> list[str]:
    """Each input's chained checksum recomputed from its chunks' keyed checksums (the manifest's own, no chunk read):
    with every chunk's plaintext checked against those, this proves each input whole and in order."""
    return [
        f"backup {manifest.backup}: input {entry.index} whole-input checksum mismatch"
        for entry in manifest.inputs
        if key.input_mac(entry.index, entry.length, [c.mac for c in entry.chunks]) != entry.mac
    ]


def check_entries(
    store: ObjectStore, manifest: Manifest, key: DataKey | None, chunks: Iterable[ChunkEntry], *, deep: bool, workers: int = 4
) -> VerifyReport:
    """Check these chunks of a backup (quick, or deep with its data key): the report of what was found.

    Shared by the host-side verify and the cloud's verify workers, which
    each check one group of chunks (braid.pipeline.verify_worker).
    """
    ref = BackupRef.parse(manifest.backup)
    report = VerifyReport(str(ref), "deep" if deep else "quick", manifest.chunk_count)
    failed: list[tuple[int, str]] = []  # (chunk index, message): sorted by index, not as text ("10" < "2")
    unreadable: list[tuple[int, str]] = []
    lock = threading.Lock()
    readers = threading.local()
    listed = None if deep else listed_objects(store, ref)
    selected = list(chunks)
    packs: dict[int, StoredObject] = {}
    if not deep:
        wanted = {entry.pack for entry in selected}
        packs = {frames[0].pack: stored_object(ref, frames) for frames in group_packs(manifest.chunks()) if frames[0].pack in wanted}

    def deep_check(entry: ChunkEntry) -> None:
        assert key is not None
        reader = getattr(readers, "reader", None)
        if reader is None:
            reader = readers.reader = ChunkReader(store, manifest, key)
            readers.plaintext = new_buffer(manifest.chunk_size)
        stored = reader.fetch(entry)
        if len(stored) != entry.stored_length or stored_checksum(stored) != entry.checksum:
            raise IntegrityError(f"chunk {entry.index} of backup {ref}: stored size or checksum mismatch (corrupt in the repository)")
        reader.decode(stored, entry, readers.plaintext)

    def run(group: list[ChunkEntry]) -> None:
        """Deep: one chunk (a group of one); quick: the selected chunks of one pack, checked as that whole pack."""
        first = group[0]
        try:
            if deep:
                deep_check(first)
            else:
                check_object(store, ref, packs[first.pack], listed=listed)
        except IntegrityError as exc:
            with lock:
                failed.append((first.index, str(exc)))
            return
        except StorageError as exc:  # the object could not be read: unchecked, not known bad
            with lock:
                unreadable.append((first.index, str(exc)))
                report.denied = report.denied or isinstance(exc, PermissionDeniedError)
            return
        with lock:
            report.chunks_checked += len(group)
            report.bytes_checked += sum(entry.length for entry in group)

    groups = [[entry] for entry in selected] if deep else group_packs(selected)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(run, groups))
    report.failures = [message for _, message in sorted(failed + unreadable)]
    report.unreadable = [message for _, message in sorted(unreadable)]
    return report


def verify_published(
    repository: Repository,
    ref: BackupRef,
    keys: KeyService | None,
    *,
    sample_percent: float | None = None,
    workers: int = 4,
    selection: Selection | None = None,
) -> VerifyReport:
    """Open a published backup and check it: deep when given the key service.

    Deep verify must not trust a manifest it has not authenticated (a forged
    chunk list would "verify" forged chunks), so it goes through
    `open_backup`; quick verify compares stored checksums only and needs no
    key, so a host without key access can still run it.
    """
    if keys is None:
        manifest = read_manifest(repository, ref)
        return verify_backup(repository.store, manifest, None, deep=False, sample_percent=sample_percent, workers=workers, selection=selection)
    manifest, key = open_backup(repository, ref, keys)
    return verify_backup(repository.store, manifest, key, deep=True, sample_percent=sample_percent, workers=workers, selection=selection)
