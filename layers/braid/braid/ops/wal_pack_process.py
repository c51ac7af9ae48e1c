"""The WAL worker's batch for one archive: staged files to archived objects, whole segments packed (policy `wal-pack`).

The policy `wal-pack` (on unless the worker runs with it off, contract.ENV_WAL_PACK)
stores the whole segments of a batch that share a directory as packs of up
to `pack_files` (braid.format.wal_pack): one PUT and one KMS data key per
pack instead of per file. It packs only into an archive whose record is
version 2 (`ArchiveInfo.may_hold_packs`: a reader that predates packs
refuses it); `.partial`, `.backup` and `.history` files, a segment alone in
its directory, and every file with the policy off are stored one object
each, as braid.ops.wal_process does.

Per file, the result is its Processed or the BackupError that fails its
message (the staged object stays for the redelivery). A file the batch
could not read or check is left out of every pack. Before packing, one
LIST per directory finds copies archived already (a redelivery after the
pack's PUT, a duplicate push): they are compared by their authenticated
bytes (same: ALREADY; other: CONFLICT, nothing archived) and never packed
again, so a file is in at most one pack but for a race of two deliveries,
whose packs then hold the same bytes (fetch takes the first that decodes,
prune counts files by name). A pack's PUT failing fails its files alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

from braid.errors import AlreadyExistsError, BackupError, WalConflictError
from braid.format.keys import encryption_context
from braid.format.layout import directory_prefix, wal_staging_key
from braid.format.repository import Repository
from braid.format.wal import SEGMENT, WalFile
from braid.format.wal_pack import encode_pack, pack_basename, pack_context_name
from braid.ops.wal import ArchiveInfo, archived_files
from braid.ops.wal_packed import read_packed
from braid.ops.wal_process import ALREADY, CONFLICT, GONE, STORED, Processed, archive_alone, check_staged
from braid.ops.wal_push import compare_archived
from braid.ports.keys import KeyService
from braid.ports.wal_staging import WalStaging

Result = Processed | BackupError


@dataclass
class _Item:
    """A staged file read for packing: its place in the batch, its bytes until its frame is encoded."""

    index: int
    file: WalFile
    data: bytes
    version: str | None
    size: int = 0

    def take(self) -> bytes:
        """The bytes, let go of here (the pack's buffer holds the frame): the batch holds each file once."""
        data, self.data = self.data, b""
        return data


def process_staged_files(
    repository: Repository,
    keys: KeyService,
    staging: WalStaging,
    name: str,
    files: Sequence[tuple[WalFile, str | None]],
    *,
    pack_files: int,
    level: int = 3,
    known: dict[str, ArchiveInfo] | None = None,
) -> list[Result]:
    """Process the staged `files` ((file, version)) of `name`; one result per file, in order."""
    results: list[Result | None] = [None] * len(files)
    to_pack: dict[str, list[_Item]] = {}
    for i, (file, version) in enumerate(files):
        try:
            staged = staging.read_staged(wal_staging_key(name, file), version)
            if staged is None or staged.data is None:
                results[i] = Processed(name, file.name, GONE)
                continue
            info = check_staged(repository, name, file, staged.data, known)
            if pack_files > 1 and file.kind == SEGMENT and info is not None and info.may_hold_packs:
                to_pack.setdefault(file.name[:16], []).append(_Item(i, file, staged.data, staged.version, len(staged.data)))
            else:
                results[i] = archive_alone(repository, keys, staging, name, file, staged.data, staged.version, level)
        except BackupError as exc:
            results[i] = exc
    for directory, found in to_pack.items():
        for i, result in _pack_directory(repository, keys, staging, name, directory, found, pack_files, level):
            results[i] = result
    return [r if r is not None else BackupError("not processed") for r in results]


def _pack_directory(
    repository: Repository, keys: KeyService, staging: WalStaging, name: str, directory: str, found: list[_Item], pack_files: int, level: int
) -> list[tuple[int, Result]]:
    done: list[tuple[int, Result]] = []
    try:
        copies: dict[str, list[str]] = {}
        for file, key in archived_files(repository.store, name, directory_prefix(name, found[0].file.name)):
            copies.setdefault(file.name, []).append(key)
    except BackupError as exc:
        return [(item.index, exc) for item in found]
    new: dict[str, _Item] = {}
    for item in found:
        if item.file.name in new:  # the same file twice in one batch (two events): the first one's copy is enough
            done.append((item.index, Processed(name, item.file.name, GONE)))
        elif item.file.name in copies:
            done.append((item.index, _compare(repository, keys, staging, name, item.file, item.data, item.version, copies[item.file.name])))
        else:
            new[item.file.name] = item
    ordered = [new[n] for n in sorted(new)]
    for start in range(0, len(ordered), pack_files):
        group = ordered[start : start + pack_files]
        if len(group) == 1:
            (item,) = group
            done.append((item.index, _guard(partial(archive_alone, repository, keys, staging, name, item.file, item.take(), item.version, level))))
            continue
        done += _store_pack(repository, keys, staging, name, directory, group, level)
    return done


def _guard(step: Callable[[], Processed]) -> Result:
    try:
        return step()
    except BackupError as exc:
        return exc


def _same_bytes(repository: Repository, keys: KeyService, name: str, file: WalFile, data: bytes, key: str) -> None:
    """Nothing when the archived copy at `key` holds `data`; WalConflictError when it holds other bytes."""
    if key.rpartition("/")[2] == file.name:
        compare_archived(repository, keys, name, file, data)
        return
    archived = bytes(read_packed(repository, keys, name, file, key))
    if archived != data:
        raise WalConflictError(
            f"{file.name} is already archived under {name!r} with different content (archived sha256:{hashlib.sha256(archived).hexdigest()},"
            f" pushed sha256:{hashlib.sha256(data).hexdigest()}); nothing was overwritten: a second cluster writing to the same name?"
        )


def _compare(
    repository: Repository, keys: KeyService, staging: WalStaging, name: str, file: WalFile, data: bytes, version: str | None, at: list[str]
) -> Result:
    try:
        _same_bytes(repository, keys, name, file, data, at[0])
        outcome, detail = ALREADY, ""
    except WalConflictError as exc:  # the archive keeps what it has; the refused raw bytes go all the same
        outcome, detail = CONFLICT, str(exc)
    except BackupError as exc:
        return exc
    staging.remove_staged(wal_staging_key(name, file), version)
    return Processed(name, file.name, outcome, len(data), 0, detail)


def _store_pack(
    repository: Repository, keys: KeyService, staging: WalStaging, name: str, directory: str, group: list[_Item], level: int
) -> list[tuple[int, Result]]:
    basename = pack_basename([item.file for item in group])
    key = f"{directory_prefix(name, group[0].file.name)}{basename}"
    bound = pack_context_name(name, directory, basename)

    def taken() -> Iterator[tuple[str, bytes]]:
        for item in group:
            yield item.file.name, item.take()

    try:
        data_key, wrapped = keys.generate_data_key(encryption_context(repository.config.id, bound))
        blob = encode_pack(data_key, wrapped, bound, taken(), level)
        try:
            staging.put_archived(key, blob, "")
            stored = len(blob) // len(group)
        except AlreadyExistsError:  # the same pack from an earlier delivery: its members are compared one by one
            return [(item.index, _compare_packed(repository, keys, staging, name, item, key)) for item in group]
        finally:
            del blob
    except BackupError as exc:  # the staged objects stay: the redelivery packs them again
        return [(item.index, exc) for item in group]
    done: list[tuple[int, Result]] = []
    for item in group:  # a removal that fails fails its message: the redelivery finds the pack
        done.append((item.index, _guard(partial(_removed, staging, name, item.file, item.version, Processed(name, item.file.name, STORED, item.size, stored)))))
    return done


def _compare_packed(repository: Repository, keys: KeyService, staging: WalStaging, name: str, item: _Item, key: str) -> Result:
    """A member of a pack found stored at `key` (its bytes were let go of): the pack holds what S3 verified was staged."""
    staged = staging.read_staged(wal_staging_key(name, item.file), item.version)
    if staged is None or staged.data is None:
        return Processed(name, item.file.name, GONE)
    return _compare(repository, keys, staging, name, item.file, staged.data, item.version, [key])


def _removed(staging: WalStaging, name: str, file: WalFile, version: str | None, done: Processed) -> Processed:
    staging.remove_staged(wal_staging_key(name, file), version)
    return done
