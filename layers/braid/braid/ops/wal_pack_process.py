"""The WAL worker's batch for one archive: staged files to archived objects, whole segments packed.

Two policies, each with an off switch (the function's environment, contract.ENV_WAL_PACK and ENV_WAL_OVERLAP):

- `wal-pack` stores the batch's whole segments that share a directory as
  packs of up to `pack_files` (braid.format.wal_pack): one PUT and one KMS
  data key per pack instead of per file. It packs only into an archive whose
  record is version 2 (`ArchiveInfo.may_hold_packs`: a reader that predates
  packs refuses it); `.partial`, `.backup` and `.history` files, a segment
  alone in its directory, a batch before the archive's record exists, and
  every file with the policy off are stored one object each
  (braid.ops.wal_process).
- `worker-overlap` reads the next member of a pack (a second lane) while
  this one is checked and encoded, so the staged GET waits behind the codec
  instead of after it; off, the reads and the codec take turns.

A pack's members are fixed before they are read (its key, and so its
encryption context, names them): each member is encoded as it arrives and
its raw bytes let go of. A member that cannot be read or checked fails its
message alone and the others are packed again without it (read again from
staging: the rare path pays, not the common one). Before packing, one LIST
per directory finds copies archived already (a redelivery after the pack's
PUT, a duplicate push): they are compared by their authenticated bytes
(same: ALREADY; other: CONFLICT, nothing archived) and never packed again,
so a file is in at most one pack but for a race of two deliveries, whose
packs then hold the same bytes (fetch takes the first that decodes, prune
counts files by name). A pack's PUT failing fails its files alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from braid.errors import AlreadyExistsError, BackupError, WalConflictError
from braid.format.keys import encryption_context
from braid.format.layout import directory_prefix, wal_staging_key
from braid.format.repository import Repository
from braid.format.wal import SEGMENT, WalFile
from braid.format.wal_pack import encode_pack, pack_basename, pack_context_name
from braid.ops.wal import ArchiveInfo, archived_files, read_archive_info
from braid.ops.wal_packed import read_packed
from braid.ops.wal_process import ALREADY, CONFLICT, GONE, STORED, Processed, check_staged, process_staged
from braid.ops.wal_push import compare_archived
from braid.ports.keys import KeyService
from braid.ports.wal_staging import StagedWal, WalStaging

Result = Processed | BackupError


@dataclass(frozen=True)
class Batch:
    """One archive's part of a batch and how to process it."""

    repository: Repository
    keys: KeyService
    staging: WalStaging
    name: str
    level: int = 3
    known: dict[str, ArchiveInfo] | None = None
    # Policy worker-list-once (braid.ops.wal_bundle_process): each directory's archived copies listed once for the
    # batch's bundles, with the slots processed since; None when off (a LIST per bundle).
    listings: dict[str, tuple[dict[str, str], set[str]]] | None = None


@dataclass(frozen=True)
class _Staged:
    index: int  # its place in the batch
    file: WalFile
    version: str | None


def process_staged_files(
    repository: Repository,
    keys: KeyService,
    staging: WalStaging,
    name: str,
    files: Sequence[tuple[WalFile, str | None]],
    *,
    pack_files: int,
    overlap: bool = True,
    level: int = 3,
    known: dict[str, ArchiveInfo] | None = None,
) -> list[Result]:
    """Process the staged `files` ((file, version)) of `name`; one result per file, in order."""
    batch = Batch(repository, keys, staging, name, level, known)
    try:
        info = known[name] if known is not None and name in known else read_archive_info(repository.store, name)
    except BackupError as exc:
        return [exc] * len(files)
    results: dict[int, Result] = {}
    first = next((i for i, (file, _v) in enumerate(files) if file.kind == SEGMENT), None)
    if info is None and pack_files > 1 and first is not None:  # the archive's first batch: its first segment records it
        results[first] = _alone(batch, _Staged(first, *files[first]))
        info = _recorded(repository, name)
    if info is not None and known is not None:
        known[name] = info
    packing = pack_files > 1 and info is not None and info.may_hold_packs
    by_directory: dict[str, list[_Staged]] = {}
    for i, (file, version) in enumerate(files):
        if i in results:
            continue
        if packing and file.kind == SEGMENT:
            by_directory.setdefault(file.name[:16], []).append(_Staged(i, file, version))
        else:
            results[i] = _alone(batch, _Staged(i, file, version))
    for directory, items in by_directory.items():
        results.update(_pack_directory(batch, directory, items, pack_files, overlap))
    return [results[i] for i in range(len(files))]


def _recorded(repository: Repository, name: str) -> ArchiveInfo | None:
    try:
        return read_archive_info(repository.store, name)
    except BackupError:
        return None  # each file's own check reports it


def _guard(step: Callable[[], Result]) -> Result:
    try:
        return step()
    except BackupError as exc:
        return exc


def _alone(batch: Batch, item: _Staged) -> Result:
    b = batch
    return _guard(partial(process_staged, b.repository, b.keys, b.staging, b.name, item.file, item.version, level=b.level, known=b.known))


def _pack_directory(batch: Batch, directory: str, items: list[_Staged], pack_files: int, overlap: bool) -> dict[int, Result]:
    try:
        copies: dict[str, list[str]] = {}
        for file, key in archived_files(batch.repository.store, batch.name, directory_prefix(batch.name, items[0].file.name)):
            copies.setdefault(file.name, []).append(key)
    except BackupError as exc:
        return {item.index: exc for item in items}
    results: dict[int, Result] = {}
    new: dict[str, _Staged] = {}
    for item in items:
        if item.file.name in new:  # the same file twice in one batch (two events): the first one's copy is enough
            results[item.index] = Processed(batch.name, item.file.name, GONE)
        elif item.file.name in copies:
            results[item.index] = _guard(partial(_compare_staged, batch, item, copies[item.file.name][0]))
        else:
            new[item.file.name] = item
    ordered = [new[n] for n in sorted(new)]
    for start in range(0, len(ordered), pack_files):
        results.update(_store_pack(batch, directory, ordered[start : start + pack_files], overlap))
    return results


def same_bytes(batch: Batch, file: WalFile, data: bytes, key: str) -> None:
    """Nothing when the archived copy at `key` holds `data`; WalConflictError when it holds other bytes."""
    if key.rpartition("/")[2] == file.name:
        compare_archived(batch.repository, batch.keys, batch.name, file, data)
        return
    archived = bytes(read_packed(batch.repository, batch.keys, batch.name, file, key))
    if archived != data:
        raise WalConflictError(
            f"{file.name} is already archived under {batch.name!r} with different content (archived sha256:{hashlib.sha256(archived).hexdigest()},"
            f" pushed sha256:{hashlib.sha256(data).hexdigest()}); nothing was overwritten: a second cluster writing to the same name?"
        )


def _compare_staged(batch: Batch, item: _Staged, key: str) -> Processed:
    """A staged file already archived at `key` (alone or in a pack): compared, then its staged copy removed."""
    staged = batch.staging.read_staged(wal_staging_key(batch.name, item.file), item.version)
    if staged is None or staged.data is None:
        return Processed(batch.name, item.file.name, GONE)
    check_staged(batch.repository, batch.name, item.file, staged.data, batch.known)
    try:
        same_bytes(batch, item.file, staged.data, key)
        outcome, detail = ALREADY, ""
    except WalConflictError as exc:  # the archive keeps what it has; the refused raw bytes go all the same
        outcome, detail = CONFLICT, str(exc)
    batch.staging.remove_staged(wal_staging_key(batch.name, item.file), staged.version)
    return Processed(batch.name, item.file.name, outcome, len(staged.data), 0, detail)


def _reads(staging: WalStaging, name: str, group: list[_Staged], overlap: bool) -> Iterator[tuple[_Staged, Callable[[], StagedWal | None]]]:
    """Each member with its read: with `overlap`, the next member's read already runs on a second lane."""
    if not overlap:
        for item in group:
            yield item, partial(staging.read_staged, wal_staging_key(name, item.file), item.version)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-read") as lane:
        pending: list[Future[StagedWal | None]] = []
        try:
            for position, item in enumerate(group):
                while len(pending) < 2 and position + len(pending) < len(group):  # this member's read and the next one's
                    ahead = group[position + len(pending)]
                    pending.append(lane.submit(staging.read_staged, wal_staging_key(name, ahead.file), ahead.version))
                yield item, pending.pop(0).result
        finally:
            for future in pending:
                future.cancel()


def _store_pack(batch: Batch, directory: str, group: list[_Staged], overlap: bool) -> dict[int, Result]:
    if len(group) == 1:
        return {group[0].index: _alone(batch, group[0])}
    basename = pack_basename([item.file for item in group])
    key = f"{directory_prefix(batch.name, group[0].file.name)}{basename}"
    bound = pack_context_name(batch.name, directory, basename)
    left_out: dict[int, Result] = {}
    packed: list[tuple[_Staged, str | None, int]] = []

    def members() -> Iterator[tuple[str, bytes]]:
        for item, read in _reads(batch.staging, batch.name, group, overlap):
            try:
                staged = read()
                if staged is None or staged.data is None:
                    left_out[item.index] = Processed(batch.name, item.file.name, GONE)
                    continue
                check_staged(batch.repository, batch.name, item.file, staged.data, batch.known)
            except BackupError as exc:
                left_out[item.index] = exc
                continue
            packed.append((item, staged.version, len(staged.data)))
            yield item.file.name, staged.data
            del staged

    try:
        data_key, wrapped = batch.keys.generate_data_key(encryption_context(batch.repository.config.id, bound))
        blob = encode_pack(data_key, wrapped, bound, members(), batch.level)
        if left_out:  # the key names members that are not in it: pack the others again, without those
            del blob
            return left_out | _store_pack(batch, directory, [item for item, _v, _n in packed], overlap)
        try:
            batch.staging.put_archived(key, blob, "")
        except AlreadyExistsError:  # the same pack from an earlier delivery: its members are compared one by one
            return {item.index: _guard(partial(_compare_staged, batch, item, key)) for item in group}
        stored = len(blob) // len(group)
        del blob
    except BackupError as exc:  # the staged objects stay: the redelivery packs them again
        return {item.index: exc for item in group}
    return {item.index: _guard(partial(_removed, batch, item, version, size, stored)) for item, version, size in packed}


def _removed(batch: Batch, item: _Staged, version: str | None, size: int, stored: int) -> Processed:
    """A member stored: its staged version removed (a removal that fails fails its message; the redelivery finds the pack)."""
    batch.staging.remove_staged(wal_staging_key(batch.name, item.file), version)
    return Processed(batch.name, item.file.name, STORED, size, stored)
