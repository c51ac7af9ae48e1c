"""Reading WAL packs (braid.format.wal_pack): which packs hold a file, and one member's verified bytes.

A pack's key names its members, so finding the packs that hold a file is one
LIST of its directory; reading a member is two ranged GETs (the head with
the key and index, then the member's frame), never the whole pack. A file
may be archived more than once (a single object beside a pack, or two
packs after a redelivery raced): every copy holds the same bytes (the WAL
worker compares before it packs), and a reader takes the first copy that
decodes.
"""

from __future__ import annotations

import threading

from braid.errors import IntegrityError
from braid.format.layout import directory_prefix, wal_prefix
from braid.format.repository import Repository
from braid.format.wal import SEGMENT, WalFile
from braid.format.wal_pack import PACK_PREFIX, StoredPack, pack_context_name, pack_members
from braid.ports.keys import KeyService
from braid.ports.store import ObjectStore

HEAD_READ = 16 * 1024  # a pack's key and index of 10 members take about 2 KiB


def packed_members(name: str, key: str) -> list[WalFile] | None:
    """The segments the pack at archive key `key` holds, or None when `key` is not a pack of `name`'s archive."""
    prefix = wal_prefix(name)
    if not key.startswith(prefix):
        return None
    directory, slash, base = key[len(prefix) :].partition("/")
    if not slash or "/" in base or len(directory) != 16:
        return None
    return pack_members(directory, base)


def packs_holding(store: ObjectStore, name: str, file: WalFile) -> list[str]:
    """The keys of the packs that hold `file` (a segment), in key order: one LIST of its directory."""
    if file.kind != SEGMENT or file.segment is None:
        return []
    return _holding(name, file, [info.key for info in store.list(directory_prefix(name, file.segment))])


def _holding(name: str, file: WalFile, keys: list[str]) -> list[str]:
    return [key for key in keys if any(m.name == file.name for m in packed_members(name, key) or ())]


class PackListing:
    """The pack keys of each directory, listed once and kept (the async pusher: one LIST per directory in its life).
    A pack written after its directory was listed is not seen (the WAL worker still compares before it packs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[tuple[str, str], list[str]] = {}

    def holding(self, store: ObjectStore, name: str, file: WalFile) -> list[str]:
        """packs_holding, from this listing (listed on the first look at `file`'s directory)."""
        if file.kind != SEGMENT or file.segment is None:
            return []
        with self._lock:  # the pusher's threads share it: one LIST per directory, not one per thread
            keys = self._keys.get((name, file.name[:16]))
            if keys is None:
                keys = [info.key for info in store.list(directory_prefix(name, file.segment) + PACK_PREFIX) if packed_members(name, info.key)]
                self._keys[(name, file.name[:16])] = keys
        return _holding(name, file, keys)


def read_pack_head(store: ObjectStore, name: str, key: str) -> StoredPack:
    """The head (key and index) of the pack at `key`, checked against the members its key names."""
    members = packed_members(name, key)
    where = f"WAL pack {store.url}/{key}"
    if members is None:
        raise IntegrityError(f"{where}: not a WAL pack key")
    head = store.get_range(key, 0, HEAD_READ)
    needed = StoredPack.head_length(head)
    if needed is not None and needed > len(head):
        head = store.get_range(key, 0, needed)
    return StoredPack.parse(head, members, where)


def read_packed(repository: Repository, keys: KeyService, name: str, file: WalFile, key: str) -> memoryview:
    """`file`'s verified bytes from the pack at `key` (IntegrityError when that copy does not decode)."""
    store = repository.store
    where = f"WAL pack {store.url}/{key}"
    pack = read_pack_head(store, name, key)
    directory, _slash, base = key.rpartition("/")
    bound = pack_context_name(name, directory.rpartition("/")[2], base)
    pack.check_binding(repository.config.id, bound, where)
    _position, entry = pack.entry(file.name, where)
    frame = store.get_range(key, pack.frames_at + entry.offset, entry.stored_length)
    return pack.decode(keys.unwrap(pack.wrapped), bound, file.name, frame, where)


def fetch_packed(repository: Repository, keys: KeyService, name: str, file: WalFile) -> memoryview | None:
    """`file`'s verified bytes from the first pack holding it that decodes; None when no pack holds it;
    the first copy's IntegrityError when none decodes."""
    first: IntegrityError | None = None
    for key in packs_holding(repository.store, name, file):
        try:
            return read_packed(repository, keys, name, file, key)
        except IntegrityError as exc:
            first = first or exc
    if first is not None:
        raise first
    return None
