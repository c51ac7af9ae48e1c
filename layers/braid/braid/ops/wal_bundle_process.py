"""The WAL worker's step for a staged bundle (braid.format.wal_bundle): its members to their final form, then no raw byte left.

One S3 event names `wal-staging/NAME/SLOT.bundle` (its version). The
bundle is read whole (one GET: S3 checks the object's SHA-256), its head
checked, and each member taken out against its recorded SHA-256 and its
cluster checked against the archive's record. One LIST of the members'
directory finds copies archived already (a redelivery after the pack's
PUT, a duplicate push): compared by their authenticated bytes (same:
ALREADY; other: CONFLICT, the archive keeps its copy). The others become
ONE WAL pack (policy `wal-pack`, as the batch's staged files do: one PUT,
one KMS data key), or one object each with the policy off, or when one
is left.

The staged bundle's version is deleted by its id only once every member
is in its final encrypted form (stored, already archived, or refused as a
conflict). A member that cannot be taken out or checked fails the
message: the good members are stored first, so a redelivery finds them
archived and compares them, and the bundle stays (the bad member's raw
bytes with it) until a person answers the dead-letter queue's alarm,
as a single staged file that fails does.
"""

from __future__ import annotations

import hashlib

from braid.errors import AlreadyExistsError, BackupError, WalConflictError
from braid.format.keys import encryption_context
from braid.format.layout import directory_prefix, wal_staging_bundle_key
from braid.format.wal import WalFile
from braid.format.wal_bundle import WalBundle
from braid.format.wal_pack import encode_pack, pack_basename, pack_context_name
from braid.ops.wal import archived_files, read_archive_info
from braid.ops.wal_pack_process import Batch, Result, same_bytes
from braid.ops.wal_process import ALREADY, CONFLICT, GONE, STORED, Processed, archive_object, check_staged


def process_bundle(batch: Batch, slot: WalFile, version: str | None, *, pack_files: int) -> Result:
    """Store every member of the staged bundle of `slot` (its `version`), then remove it; one result for the bundle:
    a Processed whose `members` say each file's outcome, or the first member's error (the bundle then stays)."""
    b = batch
    key = wal_staging_bundle_key(b.name, slot.name)
    label = f"{slot.name}.bundle"
    try:
        staged = b.staging.read_staged(key, version)
        if staged is None or staged.data is None:
            return Processed(b.name, label, GONE)
        staged_version = staged.version
        bundle = WalBundle.parse(staged.data, f"staged WAL bundle {b.repository.store.url}/{key}")
    except BackupError as exc:
        return exc
    failed: BackupError | None = None
    members: list[tuple[WalFile, bytes]] = []
    for entry in bundle.index.members:
        file = WalFile.parse(entry.name)
        try:
            data = bundle.member(entry)
            check_staged(b.repository, b.name, file, data, b.known)
        except BackupError as exc:
            failed = failed or exc
            continue
        members.append((file, data))
    del staged, bundle
    done: list[Processed] = []
    try:
        copies: dict[str, str] = {}
        for file, archived_key in archived_files(b.repository.store, b.name, directory_prefix(b.name, slot.name)):
            copies.setdefault(file.name, archived_key)
    except BackupError as exc:
        return exc
    new: list[tuple[WalFile, bytes]] = []
    for file, data in members:
        if file.name not in copies:
            new.append((file, data))
            continue
        try:
            done.append(_compared(b, file, data, copies[file.name]))
        except BackupError as exc:
            failed = failed or exc
    del members
    try:
        done += _store(b, slot, new, pack_files)
    except BackupError as exc:
        failed = failed or exc
    if failed is not None:
        return failed
    b.staging.remove_staged(key, staged_version)  # every member is in its final form: the raw bytes go
    stored = [d for d in done if d.outcome == STORED]
    outcome = STORED if stored else ALREADY
    return Processed(b.name, label, outcome, sum(d.size for d in done), sum(d.stored_size for d in done), members=tuple(done))


def _compared(batch: Batch, file: WalFile, data: bytes, key: str) -> Processed:
    try:
        same_bytes(batch, file, data, key)
    except WalConflictError as exc:  # the archive keeps what it has; the refused raw bytes go with the bundle
        return Processed(batch.name, file.name, CONFLICT, len(data), 0, str(exc))
    return Processed(batch.name, file.name, ALREADY, len(data))


def _store(batch: Batch, slot: WalFile, new: list[tuple[WalFile, bytes]], pack_files: int) -> list[Processed]:
    """The members not archived yet: one pack where the policy and the record allow, else one object each."""
    b = batch
    info = b.known.get(b.name) if b.known is not None else None
    info = info or read_archive_info(b.repository.store, b.name)
    if len(new) < 2 or pack_files < len(new) or info is None or not info.may_hold_packs:
        out = []
        for file, data in new:
            try:
                outcome, stored_size = archive_object(b.repository, b.keys, b.staging, b.name, file, data, hashlib.sha256(data).hexdigest(), b.level)
            except WalConflictError as exc:  # archived meanwhile with other bytes: the archive keeps its copy
                out.append(Processed(b.name, file.name, CONFLICT, len(data), 0, str(exc)))
                continue
            out.append(Processed(b.name, file.name, outcome, len(data), stored_size))
        return out
    directory = slot.name[:16]
    basename = pack_basename([file for file, _ in new])
    key = f"{directory_prefix(b.name, slot.name)}{basename}"
    bound = pack_context_name(b.name, directory, basename)
    data_key, wrapped = b.keys.generate_data_key(encryption_context(b.repository.config.id, bound))
    blob = encode_pack(data_key, wrapped, bound, ((file.name, data) for file, data in new), b.level)
    try:
        b.staging.put_archived(key, blob, "")
    except AlreadyExistsError:  # the same pack from an earlier delivery: its members compared one by one
        return [_compared(b, file, data, key) for file, data in new]
    stored = len(blob) // len(new)
    return [Processed(b.name, file.name, STORED, len(data), stored) for file, data in new]
