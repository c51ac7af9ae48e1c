"""Private local directories for the WAL archive's helpers: the async pusher's state, wal-fetch's prefetch.

A spool holds state (and, for the prefetch, verified WAL bytes) of one user:
it is created mode 0700 and refused when another user owns it or others may
read or write it, so nothing in it was put there by someone else.
"""

from __future__ import annotations

import os
import threading
import zlib
from pathlib import Path

from braid.errors import InputError

PGDATA_SPOOL = ".braid-prefetch"  # the root `restore --pgdata` makes in DIR/pg_wal: Braid's own, removed once empty


def default_spool_root() -> Path:
    """$XDG_RUNTIME_DIR/braid (a per-user tmpfs), else /tmp/braid-UID."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "braid" if runtime else Path(f"/tmp/braid-{os.geteuid()}")


def private_directory(path: Path, *, parents: bool = True) -> Path:
    """`path` (and, with `parents`, its missing parents), mode 0700, owned by this user; InputError for one that is not private.

    FileNotFoundError, without `parents`, when the parent is gone.
    """
    try:
        path.mkdir(mode=0o700, parents=parents, exist_ok=True)
        status = path.lstat()
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and not parents:
            raise
        raise InputError(f"cannot make the spool directory {path}: {exc.strerror or exc}") from None
    if not path.is_dir() or path.is_symlink():
        raise InputError(f"spool {path} is not a directory")
    if status.st_uid != os.geteuid() or status.st_mode & 0o077:
        raise InputError(
            f"spool {path} is not private (owner uid {status.st_uid}, mode {status.st_mode & 0o777:o}): it must be this user's, mode 0700;"
            " give another --spool"
        )
    return path


def spool_for(root: str | None, kind: str, repository: str, name: str, wal_directory: Path) -> Path:
    """The private spool of one kind (push, fetch) for one repository, archive name and pg_wal directory.

    A root directly inside that pg_wal (`restore --pgdata`'s DIR/pg_wal/.braid-prefetch) moves with the data
    directory, so its spool's identity names no path: a relative root finds the same spool after the data
    directory is moved. FileNotFoundError when the root vanishes meanwhile (a prefetcher removing its spool
    on its idle exit), or a relative root's parent is missing (wal-fetch run outside the data directory): the
    caller may ask again, or go on without a spool.
    """
    base = Path(root).expanduser() if root else default_spool_root()
    private_directory(base, parents=base.is_absolute())  # a relative root is made only where its parent is (DIR/pg_wal)
    where = wal_directory.resolve()
    place = "(the pg_wal it is in)" if base.resolve().parent == where else str(where)
    identity = f"{kind}\n{repository}\n{name}\n{place}\n"
    spool = private_directory(base / f"{kind}-{name}-{zlib.crc32(identity.encode()):08x}", parents=False)
    # The short name could collide: the spool says whose it is, and another's is refused, never shared.
    marker = spool / "identity"
    try:
        found = marker.read_text()
    except FileNotFoundError:
        found = _claim(marker, identity)
    except OSError as exc:
        raise InputError(f"cannot read {marker}: {exc.strerror or exc}") from None
    if found != identity:
        raise InputError(f"spool {spool} belongs to another repository, name or pg_wal ({found.splitlines()}); give another --spool")
    return spool


def _claim(marker: Path, identity: str) -> str:
    """Publish a new spool's identity file, mode 0600 like everything in it, whole (written aside, then linked
    into place); what the file says if another process published it first."""
    aside = marker.with_name(f".identity.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(identity)
        os.link(aside, marker)
    except FileExistsError:
        return marker.read_text()
    finally:
        aside.unlink(missing_ok=True)
    return identity
