"""The WAL worker's step for a staged bundle (braid.format.wal_bundle): its members to their final form, then no raw byte left.

One S3 event names `wal-staging/NAME/SLOT.bundle` (its version). The
bundle's head is read with a ranged GET of that version and checked (its
index's SHA-256); each member is then read with its own ranged GET and
checked against its recorded SHA-256 and its cluster against the
archive's record. One LIST of the members' directory finds copies
archived already (a redelivery after the pack's PUT, a duplicate push;
policy `worker-list-once`, off with BRAID_WAL_LIST_ONCE=off: one LIST per
directory for all the batch's bundles, taken after its single staged
files are processed; the packs its earlier bundles write hold other
slots' segments, and a slot met twice is listed again):
compared by their authenticated bytes (same: ALREADY; other: CONFLICT,
the archive keeps its copy). The others become ONE WAL pack (policy
`wal-pack`: one PUT, one KMS data key), each member encoded as it arrives
while a second lane reads the next (policy `worker-overlap`, as for a
batch's staged files), or one object each with the policy off, or when
one is left.

The bundle's version is deleted by its id only once every member is in
its final encrypted form (stored, already archived, or refused as a
conflict). A member that cannot be read or checked is left out of the
pack (the others are packed again without it, as braid.ops.wal_pack_process
does) and fails the message: the good members are stored first, so a
redelivery finds them archived and compares them, and the bundle stays
(the bad member's raw bytes with it) until a person answers the
dead-letter queue's alarm, as a single staged file that fails does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from braid.errors import AlreadyExistsError, BackupError, WalConflictError
from braid.format.keys import encryption_context
from braid.format.layout import directory_prefix, wal_staging_bundle_key
from braid.format.wal import WalFile
from braid.format.wal_bundle import HEAD_READ, BundleEntry, BundleIndex, WalBundleError, head_length, parse_head
from braid.format.wal_pack import encode_pack, pack_basename, pack_context_name
from braid.ops.wal import archived_files, read_archive_info
from braid.ops.wal_pack_process import Batch, Result, same_bytes
from braid.ops.wal_process import ALREADY, CONFLICT, GONE, STORED, Processed, archive_object, check_staged


class _Staged:
    """The bundle being processed: its key, version and checked head; reads a member's checked bytes."""

    def __init__(self, batch: Batch, key: str, version: str | None, index: BundleIndex, where: str) -> None:
        self.batch, self.key, self.version, self.index, self.where = batch, key, version, index, where

    def read(self, entry: BundleEntry) -> bytes:
        """The member's raw bytes (one ranged GET), checked against its SHA-256, its cluster against the record."""
        b = self.batch
        data = b.staging.read_staged_range(self.key, self.version, self.index.data_at + entry.offset, entry.length)
        if data is None or len(data) != entry.length or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise WalBundleError(f"{self.where}: member {entry.name} does not match its SHA-256 ({entry.sha256}): damaged or removed")
        check_staged(b.repository, b.name, WalFile.parse(entry.name), data, b.known)
        return data


def _head(batch: Batch, key: str, version: str | None, where: str) -> BundleIndex | None:
    head = batch.staging.read_staged_range(key, version, 0, HEAD_READ)
    if head is None:
        return None
    needed = head_length(head, where)
    if needed > len(head):
        head = batch.staging.read_staged_range(key, version, 0, needed)
        if head is None:
            return None
    return parse_head(head, where)


def process_bundle(batch: Batch, slot: WalFile, version: str | None, *, pack_files: int, overlap: bool = True) -> Result:
    """Store every member of the staged bundle of `slot` (its `version`), then remove it; one result for the bundle:
    a Processed whose `members` say each file's outcome, or the first member's error (the bundle then stays)."""
    b = batch
    key = wal_staging_bundle_key(b.name, slot.name)
    label, where = f"{slot.name}.bundle", f"staged WAL bundle {b.repository.store.url}/{key}"
    try:
        if version is None:  # an event without a version (an unversioned store): the current one
            current = b.staging.staged(key)
            version = None if current is None else current.version
        index = _head(b, key, version, where)
        if index is None:
            return Processed(b.name, label, GONE)
        copies = _copies(b, slot)
    except BackupError as exc:
        return exc
    bundle = _Staged(b, key, version, index, where)
    done: list[Processed] = []
    failed: list[BackupError] = []
    for entry in index.members:
        if entry.name in copies:
            try:
                done.append(_compared(b, WalFile.parse(entry.name), bundle.read(entry), copies[entry.name]))
            except BackupError as exc:
                failed.append(exc)
    new = [entry for entry in index.members if entry.name not in copies]
    try:
        done += _store(bundle, new, pack_files, overlap, failed)
    except BackupError as exc:
        failed.append(exc)
    if failed:
        return failed[0]
    try:
        b.staging.remove_staged(key, version)  # every member is in its final form: the raw bytes go
    except BackupError as exc:  # the redelivery finds every member archived, compares them and removes it
        return exc
    outcome = STORED if any(d.outcome == STORED for d in done) else ALREADY
    return Processed(b.name, label, outcome, sum(d.size for d in done), sum(d.stored_size for d in done), members=tuple(done))


def _copies(batch: Batch, slot: WalFile) -> dict[str, str]:
    """The archived copies (file name -> key) in `slot`'s directory: one LIST, or with worker-list-once the batch's
    listing of it (listed again for a slot processed since: a second message of one bundle sees what the first stored)."""
    prefix = directory_prefix(batch.name, slot.name)
    cached = None if batch.listings is None else batch.listings.get(prefix)
    if cached is not None and slot.name not in cached[1]:
        cached[1].add(slot.name)
        return cached[0]
    copies: dict[str, str] = {}
    for file, archived_key in archived_files(batch.repository.store, batch.name, prefix):
        copies.setdefault(file.name, archived_key)
    if batch.listings is not None:
        batch.listings[prefix] = (copies, {slot.name})
    return copies


def _compared(batch: Batch, file: WalFile, data: bytes, key: str) -> Processed:
    try:
        same_bytes(batch, file, data, key)
    except WalConflictError as exc:  # the archive keeps what it has; the refused raw bytes go with the bundle
        return Processed(batch.name, file.name, CONFLICT, len(data), 0, str(exc))
    return Processed(batch.name, file.name, ALREADY, len(data))


def _alone(bundle: _Staged, entry: BundleEntry) -> Processed:
    b, file = bundle.batch, WalFile.parse(entry.name)
    data = bundle.read(entry)
    try:
        outcome, stored = archive_object(b.repository, b.keys, b.staging, b.name, file, data, entry.sha256, b.level)
    except WalConflictError as exc:  # archived meanwhile with other bytes: the archive keeps its copy
        return Processed(b.name, file.name, CONFLICT, len(data), 0, str(exc))
    return Processed(b.name, file.name, outcome, len(data), stored)


def _reads(bundle: _Staged, group: Sequence[BundleEntry], overlap: bool) -> Iterator[tuple[BundleEntry, Callable[[], bytes]]]:
    """Each member with its read: with `overlap`, the next member's read already runs on a second lane."""
    if not overlap:
        for entry in group:
            yield entry, partial(bundle.read, entry)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-bundle-read") as lane:
        pending: list[Future[bytes]] = []
        try:
            for position, entry in enumerate(group):
                while len(pending) < 2 and position + len(pending) < len(group):  # this member's read and the next one's
                    pending.append(lane.submit(bundle.read, group[position + len(pending)]))
                yield entry, pending.pop(0).result
        finally:
            for future in pending:
                future.cancel()


def _store(bundle: _Staged, new: list[BundleEntry], pack_files: int, overlap: bool, failed: list[BackupError]) -> list[Processed]:
    """The members not archived yet: one pack where the policy and the record allow, else one object each; a member
    that fails is left out (its error in `failed`) and the pack made again without it."""
    b = bundle.batch
    info = (b.known.get(b.name) if b.known is not None else None) or read_archive_info(b.repository.store, b.name)
    group = list(new)
    while len(group) > 1 and pack_files >= len(group) and info is not None and info.may_hold_packs:
        files = [WalFile.parse(entry.name) for entry in group]
        directory, basename = files[0].name[:16], pack_basename(files)
        key = f"{directory_prefix(b.name, files[0].name)}{basename}"
        bound = pack_context_name(b.name, directory, basename)
        left_out: dict[str, BackupError] = {}

        def members(group: list[BundleEntry] = group, left_out: dict[str, BackupError] = left_out) -> Iterator[tuple[str, bytes]]:
            for entry, read in _reads(bundle, group, overlap):
                try:
                    data = read()
                except BackupError as exc:
                    left_out[entry.name] = exc
                    continue
                yield entry.name, data
                del data

        data_key, wrapped = b.keys.generate_data_key(encryption_context(b.repository.config.id, bound))
        blob = encode_pack(data_key, wrapped, bound, members(), b.level)
        if left_out:  # the key names members that are not in it: pack the others again, without those
            del blob
            failed += left_out.values()
            group = [entry for entry in group if entry.name not in left_out]
            continue
        try:
            b.staging.put_archived(key, blob, "")
        except AlreadyExistsError:  # the same pack from an earlier delivery: its members compared one by one
            return [_compared(b, WalFile.parse(entry.name), bundle.read(entry), key) for entry in group]
        stored = len(blob) // len(group)
        return [Processed(b.name, entry.name, STORED, entry.length, stored) for entry in group]
    out = []
    for entry in group:
        try:
            out.append(_alone(bundle, entry))
        except BackupError as exc:
            failed.append(exc)
    return out
