"""`wal-push`: archive one WAL file, durably, compressed and encrypted, never overwriting.

PostgreSQL recycles a segment as soon as archive_command exits 0, so this
returns only once the stored object is durable in the repository (the local
store fsyncs the file and its directory; S3 acknowledges a PUT once stored).
A file already archived with the same bytes is accepted (PostgreSQL pushes
again after a crash); one with other bytes is refused, naming both
checksums, and the archived copy stays as it is.

A segment's first page header names its cluster (system identifier) and
segment size: the first segment records them in `wal/NAME/archive.json`,
and a segment of another cluster under the same name is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from braid.errors import AlreadyExistsError, InputError, IntegrityError, WalConflictError
from braid.format.digests import sha256
from braid.format.keys import encryption_context
from braid.format.layout import wal_key
from braid.format.repository import Repository
from braid.format.wal import SEGMENT, SegmentIdentity, WalFile, segment_identity, wal_context_name
from braid.format.wal_object import StoredWal, encode_wal
from braid.ops.wal import INFO_VERSION, ArchiveInfo, read_archive_info, record_archive_info
from braid.ports.keys import KeyService

STORED = "stored"
ALREADY = "already archived"
# A host with the key stores each file alone and stages nothing: its archive's record says only what version 2 says
# (its readers may predate bundles); the WAL worker writes version 3 (braid.ops.wal.INFO_VERSION).
LOCAL_INFO_VERSION = 2


@dataclass(frozen=True)
class PushResult:
    file: str
    key: str
    outcome: str  # STORED or ALREADY
    size: int
    stored_size: int


def read_wal_file(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise InputError(f"WAL file {path} not found") from None
    except OSError as exc:
        raise InputError(f"cannot read WAL file {path}: {exc.strerror or exc}") from None


def segment_identity_of(file: WalFile, data: bytes | memoryview) -> SegmentIdentity | None:
    """A segment's identity from its first page header, once the segment is whole and where its name says (None for a
    file that is not a segment); InputError otherwise."""
    if file.kind != SEGMENT:
        return None
    identity = segment_identity(data[:64])
    if identity is None:
        raise InputError(f"{file.name} does not start with a WAL segment header: not a PostgreSQL WAL segment")
    if len(data) != identity.segment_size:
        raise InputError(f"{file.name} is {len(data)} bytes, but its header says segments are {identity.segment_size}: not a whole segment")
    if identity.page_address != file.segno(identity.segment_size) * identity.segment_size:
        raise InputError(f"{file.name} holds the WAL of another position (its header says {identity.page_address:X}): renamed or recycled")
    return identity


def check_cluster(name: str, file: WalFile, identity: SegmentIdentity, recorded: ArchiveInfo) -> None:
    """IntegrityError when the segment is of another cluster (or segment size) than the archive of `name` records."""
    if (recorded.system_identifier, recorded.segment_size) != (identity.system_identifier, identity.segment_size):
        raise IntegrityError(
            f"{file.name} is from the cluster with system identifier {identity.system_identifier} (segments of {identity.segment_size} bytes),"
            f" but the WAL archive of {name!r} belongs to {recorded.system_identifier} ({recorded.segment_size} bytes):"
            " archive a new cluster under a new --name"
        )


def check_identity(repository: Repository, name: str, file: WalFile, data: bytes, version: int = INFO_VERSION) -> ArchiveInfo | None:
    """A segment must be whole and of the cluster (and segment size) the archive records; the first one records them
    (a record of `version`). Returns the archive's record (None for a file that is not a segment)."""
    identity = segment_identity_of(file, data)
    if identity is None:
        return None
    recorded = read_archive_info(repository.store, name) or record_archive_info(
        repository.store, ArchiveInfo(name, identity.system_identifier, identity.segment_size, version)
    )
    check_cluster(name, file, identity, recorded)
    return recorded


def push_wal(repository: Repository, keys: KeyService, name: str, path: Path, *, level: int = 3) -> PushResult:
    """Archive the WAL file at `path` under `name`; returns once it is durable (or was already archived with these bytes)."""
    file = WalFile.parse(path.name)
    data = read_wal_file(path)
    check_identity(repository, name, file, data, LOCAL_INFO_VERSION)
    key = wal_key(name, file)
    bound = wal_context_name(name, file.name)
    existing = compare_archived(repository, keys, name, file, data)
    if existing is not None:
        return existing
    data_key, wrapped = keys.generate_data_key(encryption_context(repository.config.id, bound))
    blob = encode_wal(data_key, wrapped, bound, data, level)
    try:
        repository.store.put(key, blob, create_only=True)
    except AlreadyExistsError:  # another pusher stored it meanwhile: the same rule as finding it first
        found = compare_archived(repository, keys, name, file, data)
        if found is None:  # pragma: no cover - removed again between the two calls
            raise
        return found
    return PushResult(file.name, key, STORED, len(data), len(blob))


def compare_archived(repository: Repository, keys: KeyService, name: str, file: WalFile, data: bytes) -> PushResult | None:
    """None when `file` is not archived yet; ALREADY when it is, with these bytes; WalConflictError when with others."""
    key = wal_key(name, file)
    store = repository.store
    if store.head(key) is None:
        return None
    raw = store.get(key)
    where = f"archived {file.name} ({store.url}/{key})"
    stored = StoredWal.parse(raw, where)
    bound = wal_context_name(name, file.name)
    stored.check_binding(repository.config.id, bound, where)
    data_key = keys.unwrap(stored.wrapped)
    if stored.matches(data_key, data, where):
        return PushResult(file.name, key, ALREADY, len(data), len(raw))
    archived = stored.decode(data_key, bound, where)  # an archived copy that does not decode is reported as damaged
    raise WalConflictError(
        f"{file.name} is already archived under {name!r} with different content (archived sha256:{sha256(bytes(archived)).hex()},"
        f" pushed sha256:{sha256(data).hex()}); nothing was overwritten: a second cluster writing to the same name?"
    )
