"""Port: the object store a repository lives in (a directory, or S3).

Deliberately small, as restic's backends are: the repository format is built
on these few operations, so every backend behaves the same and one set of
conformance tests (tests/test_store_conformance.py) runs against all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from braid.format.buffers import WritableBuffer
from braid.format.lock import ObjectLock

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    checksum: str | None = None  # "crc64nvme:<base64>" when the store keeps it
    modified: datetime | None = None  # last written, by the store's clock (UTC), when the store says
    # This exact object's tag from `head` (S3's ETag): `put(..., replacing=version)` replaces it
    # only if it is still this one. None from `list`, and from stores that keep none.
    version: str | None = None
    # The object's storage class where the store has them (S3: from LIST and HEAD, "STANDARD" when S3 names none).
    storage_class: str | None = None
    # The object's Object Lock retain-until date (S3: from HEAD, given s3:GetObjectRetention); None: none, or not said.
    retain_until: datetime | None = None


class ObjectStore(Protocol):
    @property
    def url(self) -> str:
        """Where the repository lives, as the user names it (`/path`, `s3://bucket/prefix`)."""
        ...

    def put(
        self, key: str, data: Buffer, *, checksum: str | None = None, create_only: bool = False, durable: bool = True, replacing: str | None = None
    ) -> None:
        """Store an object atomically: readers see all of it or none.

        `checksum` ("crc64nvme:...") makes the store verify what it received.
        `create_only` raises AlreadyExistsError instead of replacing, so a
        late or retried worker can never overwrite a published object.
        `replacing` (a `head` version) replaces the object only if it is
        still that version, else IntegrityError and nothing written: the
        one way to rewrite a published object (rekey), and on S3 the one
        the bucket's create-only policy lets through for manifests.
        `durable=False` lets a store return before the object is on stable
        storage; `sync` must then come before anything depends on it.
        """
        ...

    def sync(self, keys: Iterable[str]) -> None:
        """Make objects put with `durable=False` durable (S3: already are)."""
        ...

    def get(self, key: str) -> bytes:
        """The whole object; NotFoundError if missing."""
        ...

    def get_range(self, key: str, start: int, length: int) -> bytes: ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Objects under `prefix`, in key order."""
        ...

    def delete(self, keys: Iterable[str]) -> None:
        """Remove objects; missing ones are not an error."""
        ...


@runtime_checkable
class RetainingStore(Protocol):
    """A store that can make objects immutable until a date (S3 Object Lock).

    Set once, for the whole store, so that every writer (worker, Finalize,
    the local engine, rekey) puts each chunk and manifest with the
    repository's retention without knowing of it (braid.format.lock says
    which keys and until when). A directory store has no such thing, and a
    repository that asks for it there is refused when opened.
    """

    @property
    def object_lock(self) -> ObjectLock | None:
        """The retention chunks and manifests are put with now (None: none)."""
        ...

    def use_object_lock(self, lock: ObjectLock) -> None: ...


@dataclass(frozen=True)
class Retained:
    """What `extend_retention` found and left: the date the object carried (None: none) and the one it carries now."""

    key: str
    before: datetime | None
    until: datetime

    @property
    def extended(self) -> bool:
        return self.before is None or self.until > self.before


@runtime_checkable
class RetentionExtending(Protocol):
    """A store whose objects' retain-until dates can be lengthened in place (S3 Object Lock's PutObjectRetention).

    Only ever lengthened: COMPLIANCE forbids a shorter date to everyone, and
    GOVERNANCE allows one only with a bypass this port never asks for.
    """

    def extend_retention(self, key: str, until: datetime) -> Retained | None:
        """Keep the current version of `key` at least until `until`: its date read first, a new one set only when
        `until` is later (in the object's own mode, the store's when it has none). None when `key` does not exist;
        StorageError (naming the permission) when the store refuses."""
        ...


@runtime_checkable
class StorageClasses(Protocol):
    """A store whose objects have storage classes that can change in place (S3).

    A directory store has none and does not offer this: asking for a class
    there is braid.format.storage_class.StorageClassError (exit 2).
    """

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """Move one existing object to `storage_class` (braid.format.storage_class.MOVABLE), same key, same bytes.

        NotFoundError if it is gone; StorageError if the store refuses.
        """
        ...


@runtime_checkable
class TemporaryFiles(Protocol):
    """A store whose interrupted writes can leave files outside the repository.

    LocalStore writes each object to a `.tmp-*` file first; a process killed
    mid-put leaves it behind, invisible to `list`. Retention collects them
    (once older than its grace period) through this; S3 has none.
    """

    def list_temporary(self, prefix: str) -> Iterator[ObjectInfo]:
        """Leftover temporary files under `prefix`, with their modification times; `delete` removes them."""
        ...


@runtime_checkable
class PrefixListing(Protocol):
    """A store that can list the "directories" below a prefix without listing what is in them.

    Finding the backups under `data/NAME/` must not mean listing every
    chunk of every backup (5.7 million keys for 35 backups of 10 TiB): S3
    answers it with a LIST with a delimiter, a directory with one readdir.
    """

    def list_prefixes(self, prefix: str) -> Iterator[str]:
        """Each distinct `prefix + SEGMENT + "/"` that has objects below it, in key order (`prefix` ends with "/")."""
        ...


def child_prefixes(store: ObjectStore, prefix: str) -> list[str]:
    """The `prefix + SEGMENT + "/"` prefixes below `prefix`; by a full listing only where the store offers nothing better."""
    if isinstance(store, PrefixListing):
        return list(store.list_prefixes(prefix))
    found: set[str] = set()
    for info in store.list(prefix):
        segment, slash, _rest = info.key[len(prefix) :].partition("/")
        if slash:
            found.add(f"{prefix}{segment}/")
    return sorted(found)


@runtime_checkable
class ListingAfter(Protocol):
    """A store that can start a listing after a key (S3's StartAfter), so a slice of a big prefix costs only its own pages."""

    def list_after(self, prefix: str, after: str) -> Iterator[ObjectInfo]:
        """Objects under `prefix` whose key sorts after `after`, in key order."""
        ...


def list_after(store: ObjectStore, prefix: str, after: str) -> Iterator[ObjectInfo]:
    """Objects under `prefix` after the key `after` ("": all); by filtering a full listing where the store offers nothing better."""
    if after and isinstance(store, ListingAfter):
        yield from store.list_after(prefix, after)
        return
    for info in store.list(prefix):
        if info.key > after:
            yield info


@runtime_checkable
class PiecewisePut(Protocol):
    """A store that can write one object from several buffers without joining them (S3: one PutObject body)."""

    def put_pieces(self, key: str, pieces: Sequence[Buffer], *, checksum: str | None = None, create_only: bool = False) -> None: ...


def put_pieces(store: ObjectStore, key: str, pieces: Sequence[Buffer], *, checksum: str | None = None, create_only: bool = False) -> None:
    """`put` of `pieces` laid end to end: from their own buffers where the store can (a pack's frames, braid.engine.chunk_worker),
    else joined first (a directory store's write copies through the page cache anyway)."""
    if len(pieces) == 1:
        store.put(key, pieces[0], checksum=checksum, create_only=create_only)
    elif isinstance(store, PiecewisePut):
        store.put_pieces(key, pieces, checksum=checksum, create_only=create_only)
    else:
        store.put(key, b"".join(pieces), checksum=checksum, create_only=create_only)


def read_object(store: ObjectStore, key: str, buffer: WritableBuffer) -> memoryview | bytes:
    """The whole object, into a reused buffer where the store offers `get_into`.

    Restore and deep verify read thousands of 64 MiB chunks; a fresh buffer
    for each costs page faults comparable to decrypting it.
    """
    get_into = getattr(store, "get_into", None)
    return get_into(key, buffer) if get_into else store.get(key)


def read_range(store: ObjectStore, key: str, start: int, length: int, buffer: WritableBuffer) -> memoryview | bytes:
    """`length` bytes of an object from `start`, into a reused buffer where the store offers `get_range_into`.

    The worker reads every chunk of a backup as a ranged GET of its staging
    segment: a fresh 64 MiB `bytes` per chunk is that many pages faulted in
    and freed again, plus the copy that joins the response body, all billed
    worker CPU outside the codec (scripts/bench cloud-model measures it).
    Like `get_range`, a range past the end of the object is cut short.
    """
    get_range_into = getattr(store, "get_range_into", None)
    return get_range_into(key, start, length, buffer) if get_range_into else store.get_range(key, start, length)


def prefetch_object(store: ObjectStore, key: str) -> None:
    """Tell a store that offers `prefetch` the object will be read soon; never fails.

    A local store has the kernel read the file in the background, so a
    restore's disk reads overlap the decoding of the chunks before instead
    of each decoder waiting for its own read.
    """
    prefetch = getattr(store, "prefetch", None)
    if prefetch is not None:
        prefetch(key)
