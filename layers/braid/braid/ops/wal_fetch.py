"""`wal-fetch`: one archived WAL file's verified bytes, written atomically where PostgreSQL asks.

The bytes are authenticated, decrypted, decompressed and checked against
their keyed checksum before DEST exists: they are written to a temporary
file beside DEST, synced, and renamed onto it, so DEST is never partial.
A file not in the archive is WalNotArchivedError (exit 1: PostgreSQL's
"end of the archive"); every other failure keeps its own code (>= 2).
A file not stored alone is looked for in the packs of its directory
(braid.ops.wal_packed). With the stack (`staging` given), a file the WAL worker has not stored yet
is served from its staged raw form, checked against its SHA-256
(braid.ops.wal_stage); the archive is asked again when the staged object
went meanwhile (the worker stored it between the two looks).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from braid.errors import InputError, NotFoundError, WalNotArchivedError
from braid.format.layout import wal_key
from braid.format.repository import Repository
from braid.format.wal import WalFile, wal_context_name
from braid.format.wal_object import StoredWal
from braid.ports.keys import KeyService
from braid.ports.wal_staging import WalStaging

Buffer = bytes | bytearray | memoryview


def fetch_wal_bytes(repository: Repository, keys: KeyService, name: str, file_name: str, staging: WalStaging | None = None) -> memoryview:
    """The verified bytes of the archived (or, with `staging`, staged) `file_name` of `name`; WalNotArchivedError when it is neither."""
    file = WalFile.parse(file_name)
    key = wal_key(name, file)
    store = repository.store
    for attempt in range(2 if staging is not None else 1):
        try:
            raw = store.get(key)
            break
        except NotFoundError:
            from braid.ops.wal_packed import fetch_packed  # a file the WAL worker stored in a pack

            packed = fetch_packed(repository, keys, name, file)
            if packed is not None:
                return packed
            if staging is not None:
                from braid.ops.wal_stage import fetch_staged

                staged = fetch_staged(staging, name, file)
                if staged is not None:
                    return memoryview(staged)
            if attempt == 0 and staging is not None:
                continue
            raise WalNotArchivedError(f"{file_name} is not in the WAL archive of {name!r} in {store.url}") from None
    where = f"archived {file_name} ({store.url}/{key})"
    stored = StoredWal.parse(raw, where)
    bound = wal_context_name(name, file.name)
    stored.check_binding(repository.config.id, bound, where)
    return stored.decode(keys.unwrap(stored.wrapped), bound, where)


def write_atomically(dest: Path, data: Buffer, *, mode: int = 0o600) -> None:
    """`data` at `dest`, all of it or nothing: a synced temporary file beside it, renamed onto it."""
    directory = dest.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.braid-", dir=directory)
    except OSError as exc:
        raise InputError(f"cannot write {dest}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except OSError as exc:
        _unlink(tmp)
        raise InputError(f"cannot write {dest}: {exc.strerror or exc}") from None
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def fetch_wal(repository: Repository, keys: KeyService, name: str, file_name: str, dest: Path, staging: WalStaging | None = None) -> int:
    """Fetch `file_name` to `dest` (verified, atomically); returns its size."""
    data = fetch_wal_bytes(repository, keys, name, file_name, staging)
    write_atomically(dest, data)
    return len(data)
