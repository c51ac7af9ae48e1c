"""`braid init` for a local repository: a new directory and its master key.

The order matters. Everything that can refuse (the directory is not new, the
key file would sit inside the repository, an existing key file is unreadable)
is checked before anything is written, so a refused init leaves no half-made
repository behind. The key file's default path names the repository id, so
the id is made first and the config is written last, naming the key it uses.

The master-key file is an adapter (braid.adapters.local.keys); this module
takes it as a port, `MasterKeyFiles`, from the composition root.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from braid.errors import RepositoryError, UsageError
from braid.format.layout import CONFIG
from braid.format.lock import ObjectLock
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import utc_now
from braid.ports.keys import KeyService
from braid.ports.store import ObjectStore


class MasterKeyFiles(Protocol):
    """Port: opens an existing master-key file, or creates a new one (never overwriting)."""

    def open(self, path: Path) -> KeyService: ...

    def create(self, path: Path) -> KeyService: ...


@dataclass(frozen=True)
class LocalInit:
    """What init made, for the CLI to report: the key file is the one thing to keep safe."""

    repository: Repository
    root: Path | str  # the directory, or an object store's URL (s3://BUCKET/PREFIX)
    key_file: Path
    key_id: str
    created_key: bool  # False: an existing key file was reused (one key for several repositories)


def init_local_repository(
    root: Path,
    store: ObjectStore,
    key_files: MasterKeyFiles,
    key_file_for: Callable[[str], Path],
    *,
    now: str | None = None,
    object_lock: ObjectLock | None = None,
) -> LocalInit:
    """Create the repository at `root` (served by `store`) and its key file.

    `key_file_for(repository_id)` is where the master key lives: the user's
    choice, or a per-repository default. An existing key file there is
    reused, never replaced.
    """
    root = root.absolute()
    _check_writable(root)
    if (root / CONFIG).is_file():
        raise UsageError(f"{root} is already a Braid repository{_repository_id(root / CONFIG)}; back up into it, or choose a new path for another")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise UsageError(f"{root} exists and is not an empty directory; choose a new path for the repository")
    provisional = RepositoryConfig.new({"type": "local", "key_id": ""}, now or utc_now())
    path = key_file_for(provisional.id)
    if path.absolute() == root or root in path.absolute().parents:
        raise UsageError(
            f"key file {path} would be inside the repository; keep the master key outside it (anyone with both can read every backup)"
        )
    created = not path.exists()
    keys = key_files.create(path) if created else key_files.open(path)
    config = RepositoryConfig(provisional.id, provisional.created, {"type": "local", "key_id": keys.key_id})
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RepositoryError(f"cannot create repository directory {root}: {exc.strerror or exc}") from None
    return LocalInit(Repository.create(store, config), root, path, keys.key_id, created)


def _check_writable(root: Path) -> None:
    """This user can make (or write into) `root`: checked before the key file is written.

    A service user (postgres, db2inst1) running `braid init --repo
    /var/backups/braid` usually may not create directories there; saying so,
    with the command that fixes it, beats a traceback after a key file was
    already made for a repository that never came to be.
    """
    existing = root
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
    except OSError as exc:  # a parent this user may not search
        raise RepositoryError(f"cannot create repository directory {root}: {exc.strerror or exc} ({exc.filename})") from None
    if existing == root and not root.is_dir():
        return  # a file where the repository would go: the caller says the path is in use
    if not existing.is_dir():
        raise RepositoryError(f"cannot create repository directory {root}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RepositoryError(
            f"cannot create repository directory {root}: {existing} is not writable by this user;"
            f" have it made for this user first, e.g. 'install -d -o {_user()} -m 0700 {root}'"
        )


def init_store_repository(
    store: ObjectStore,
    key_files: MasterKeyFiles,
    key_file_for: Callable[[str], Path],
    *,
    now: str | None = None,
    object_lock: ObjectLock | None = None,
) -> LocalInit:
    """A repository on an object store (S3 or an S3-compatible one) with no pipeline: this host compresses and encrypts.

    The same format and the same master-key file as a directory repository;
    only the store differs, so every command reads it the same way. An
    existing repository is refused before the key file is made, so a second
    init leaves no orphan key behind.
    """
    if store.head(CONFIG) is not None:
        raise RepositoryError(f"{store.url} is already a Braid repository; refusing to re-initialise it")
    provisional = RepositoryConfig.new({"type": "local", "key_id": ""}, now or utc_now())
    path = key_file_for(provisional.id)
    created = not path.exists()
    keys = key_files.create(path) if created else key_files.open(path)
    config = RepositoryConfig(provisional.id, provisional.created, {"type": "local", "key_id": keys.key_id}, object_lock=object_lock)
    return LocalInit(Repository.create(store, config), store.url, path, keys.key_id, created)


def init_kms_repository(
    store: ObjectStore, key_arn: str, probe: Callable[[RepositoryConfig], object], *, now: str | None = None, object_lock: ObjectLock | None = None
) -> Repository:
    """A repository on an object store whose data keys a KMS key wraps, with no pipeline.

    `probe(config)` makes one data key under the new repository's context
    before anything is written: a key this host may not use fails the init
    (exit 4 with the missing permission), not the first backup.
    """
    if store.head(CONFIG) is not None:
        raise RepositoryError(f"{store.url} is already a Braid repository; refusing to re-initialise it")
    config = RepositoryConfig.new({"type": "kms", "key_id": key_arn}, now or utc_now(), object_lock=object_lock)
    probe(config)
    return Repository.create(store, config)


def _user() -> str:
    """This process's user name, for a command to paste (`install -d -o postgres ...`)."""
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _repository_id(config: Path) -> str:
    """" (id ...)" of an existing repository's config, or "" if it does not read."""
    import json

    try:
        return f" (id {json.loads(config.read_text())['id']})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""
