"""From what the user typed (`--repo`, `--key-file`) to live ports.

A repository URL is a directory path or `s3://bucket/prefix`; the repository
config then says which key service wraps its data keys. braid.ops takes
ports, never adapters; the commands get live ones from here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, cast

from braid.contract import ENV_KEY_FILE, ENV_REPO
from braid.errors import KeyAccessError, RepositoryError, StorageError, UsageError
from braid.format.layout import CONFIG
from braid.format.repository import Repository, RepositoryConfig
from braid.ports.store import ObjectStore

if TYPE_CHECKING:
    from braid.format.keys import DataKey, WrappedKey
    from braid.format.lock import ObjectLock
    from braid.ops.copy import CopyTarget
    from braid.ops.init import LocalInit
    from braid.ports.keys import KeyService
    from braid.ports.wal_staging import WalStaging


def is_s3_url(url: str) -> bool:
    return url.startswith("s3://")


def repo_url(arg: str | None) -> str:
    """`--repo`, else BRAID_REPO: scripts on a host set the repository once, in the environment."""
    url = arg or os.environ.get(ENV_REPO)
    if not url:
        raise UsageError("no repository given: pass --repo DIR|s3://BUCKET/PREFIX, set BRAID_REPO, or set repo in the config file")
    return url


def open_store(url: str, *, light: bool = False) -> ObjectStore:
    """`light`: the agent's S3 client without botocore where it applies (braid.adapters.aws.light_clients)."""
    if is_s3_url(url):
        from braid.adapters.aws.s3 import S3Store

        return S3Store.from_url(url, light=light)  # its client reports retries to store.retries
    if "://" in url:
        raise UsageError(f"unsupported repository URL {url!r}: use a directory path or s3://BUCKET/PREFIX")
    from braid.adapters.local.store import LocalStore  # a directory's store (tempfile, its locks): not an s3:// run's

    return LocalStore(Path(url).expanduser().absolute())


def open_repository(url: str, *, light: bool = False) -> Repository:
    """The repository at `url`; a missing directory says how to create one rather than "no config".

    `light`: an s3:// repository's client is the agent's light one where it
    applies (`braid backup`, `wal-push`: their start-up; docs/design/agent-startup.md).

    A local repository whose config this user cannot read (permissions, an
    I/O error) is an unreadable repository (exit 3), not a failed write.
    """
    store = open_store(url, light=True) if light and is_s3_url(url) else open_store(url)
    if is_s3_url(url):
        return Repository.open(store)
    from braid.adapters.local.store import LocalStore

    if not isinstance(store, LocalStore):
        return Repository.open(store)
    try:
        is_directory = store.root.is_dir()  # False when missing; raises when a parent cannot be searched
    except OSError as exc:
        raise RepositoryError(f"repository {store.root} is unreadable: {exc.strerror or exc}") from None
    if not is_directory:
        if os.path.lexists(store.root):
            raise RepositoryError(f"repository {store.root} is not a directory")
        raise RepositoryError(
            f"repository directory {store.root} does not exist: check the path (a typo?); only a new repository is made with 'braid init --repo {url}'"
            + _repositories_nearby(store.root)
        )
    try:
        if not (store.root / CONFIG).exists() and any(store.root.iterdir()):
            raise RepositoryError(
                f"no Braid repository at {store.root}: the directory holds other files; give the repository's own directory,"
                " or create a repository in a new, empty one with 'braid init --repo NEW_DIR'"
            )
        return Repository.open(store)
    except OSError as exc:
        raise RepositoryError(f"repository {store.root} is unreadable: {exc.strerror or exc}") from None
    except StorageError as exc:
        raise RepositoryError(f"repository {store.root} is unreadable: {exc}") from None


def _repositories_nearby(missing: Path) -> str:
    """"; a repository nearby: DIR" for the repositories beside a mistyped path, closest name first (a few at most)."""
    import difflib

    try:
        found = sorted(p.name for p in missing.parent.iterdir() if (p / CONFIG).is_file())
    except OSError:
        return ""
    if not found:
        return ""
    close = difflib.get_close_matches(missing.name, found, n=3, cutoff=0.5)
    shown = [*close, *(name for name in found if name not in close)][:3]
    return f"; {'a repository' if len(shown) == 1 else 'repositories'} nearby: {', '.join(str(missing.parent / n) for n in shown)}"


def wal_staging_for(repository: Repository, engine: str | None = None) -> WalStaging | None:
    """The WAL staging of a repository with a pipeline (the host holds no key: the WAL worker encodes), else None.

    `--engine local` keeps the host's own path (it must then hold the key).
    """
    if not repository.config.cloud or engine == "local" or not is_s3_url(repository.url):
        return None
    from braid.adapters.aws.s3 import S3Store
    from braid.adapters.aws.wal_staging import S3WalStaging

    store = repository.store
    return S3WalStaging(store) if isinstance(store, S3Store) else None


def config_dir() -> Path:
    """$XDG_CONFIG_HOME/braid: key files live with the user's config, never inside a repository."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "braid"


def default_key_file(repository_id: str) -> Path:
    return config_dir() / "keys" / f"{repository_id}.key"


def key_file_path(arg: str | None, repository_id: str) -> Path:
    """`--key-file`, else BRAID_KEY_FILE, else the per-repository default named by its id."""
    explicit = arg or os.environ.get(ENV_KEY_FILE)
    return Path(explicit).expanduser() if explicit else default_key_file(repository_id)


def init_local(url: str, key_file: str | None) -> LocalInit:
    """`braid init` of a directory: the local store and master-key file wired into the use case."""
    from braid.adapters.local.keys import LocalKeyFile  # with AES-GCM: not on the cloud agent's path
    from braid.ops.init import init_local_repository  # the init use cases load only for `braid init`

    store = open_store(url)
    root = Path(url).expanduser().absolute()
    return init_local_repository(root, store, LocalKeyFile, lambda repository_id: key_file_path(key_file, repository_id))


def init_store_with_key_file(url: str, key_file: str | None, object_lock: ObjectLock | None = None) -> LocalInit:
    """`braid init --repo s3://... --engine local`: an object store, and a master-key file on this host."""
    from braid.adapters.local.keys import LocalKeyFile
    from braid.ops.init import init_store_repository

    return init_store_repository(
        open_store(url), LocalKeyFile, lambda repository_id: key_file_path(key_file, repository_id), object_lock=object_lock
    )


def init_store_with_kms(url: str, key_arn: str, object_lock: ObjectLock | None = None) -> Repository:
    """`braid init --repo s3://... --engine local --kms-key ARN`: data keys wrapped by KMS, made on this host."""
    from braid.adapters.aws.clients import kms_client
    from braid.adapters.aws.kms import KmsKeyService
    from braid.format.keys import encryption_context
    from braid.ops.init import init_kms_repository

    keys = KmsKeyService(kms_client(), key_arn)

    def probe(config: RepositoryConfig) -> object:
        return keys.generate_data_key(encryption_context(config.id, "init-probe"))

    return init_kms_repository(open_store(url), key_arn, probe, object_lock=object_lock)


def open_key_service(repository: Repository, key_file: str | None, *, unwrap_only: bool = False, strict: bool = False) -> KeyService:
    """The key service the repository's config names, checked against it.

    `strict` (--strict-permissions): a master-key file group or others may
    read is refused (exit 4) rather than warned about.
    """
    kind = repository.config.key.get("type")
    if kind == "local":
        path = key_file_path(key_file, repository.config.id)
        expected = repository.config.key.get("key_id")
        if not os.path.lexists(path):  # the repository exists: its key is missing, and a new init would not bring it back
            raise KeyAccessError(
                f"key file {path} not found; repository {repository.url} needs master key {expected}: give its file with --key-file PATH,"
                " BRAID_KEY_FILE or key_file in the config file (if it was lost, restore it from your copy)"
            )
        from braid.adapters.local.keys import LocalKeyFile

        keys = LocalKeyFile.open(path, strict=strict, warn=warn_key_file)
        if keys.key_id != expected:
            raise KeyAccessError(
                f"key file {keys.path} holds key {keys.key_id}, but repository {repository.url} uses {expected}: wrong key file"
                + _rekeyed_from(repository, keys.key_id)
            )
        return keys
    if kind == "kms":
        from braid.adapters.aws.clients import kms_client
        from braid.adapters.aws.kms import KmsKeyService

        if unwrap_only:
            return KmsKeyService.for_unwrap(kms_client())
        return KmsKeyService(kms_client(), repository.config.key["key_id"])
    raise RepositoryError(f"repository {repository.url} names an unknown key service {kind!r}")


def _rekeyed_from(repository: Repository, stale: str) -> str:
    """"; it was re-keyed on DATE ..." when the newest backup says `braid rekey` moved it off the `stale` key (an error path: reads one manifest)."""
    try:
        refs = repository.backups()
        rekeyed = repository.load(refs[-1]).manifest.rekeyed if refs else None
    except Exception:  # only a better message is at stake
        return ""
    if not rekeyed or rekeyed.get("from") != stale:
        return ""
    return (
        f"; the repository was re-keyed on {rekeyed['at'][:10]} ({rekeyed['at']}) from this key to {repository.config.key.get('key_id')}:"
        " point key_file (config file), BRAID_KEY_FILE or --key-file at the new key file given to braid rekey --new-key-file"
    )


class KeyServiceOnDemand:
    """A key service opened at its first use rather than up front.

    `braid restore` asks for the key only once the manifest was found and
    passed its own checksum, so a missing or corrupt backup is reported as
    that (exit 8 or 6), not as a missing key file.
    """

    def __init__(self, opener: Callable[[], KeyService]) -> None:
        self._opener = opener

    @cached_property
    def _service(self) -> KeyService:
        return self._opener()

    @property
    def key_id(self) -> str:
        return self._service.key_id

    def generate_data_key(self, context: Mapping[str, str]) -> tuple[DataKey, WrappedKey]:
        return self._service.generate_data_key(context)

    def unwrap(self, wrapped: WrappedKey) -> DataKey:
        return self._service.unwrap(wrapped)


def key_service_on_demand(repository: Repository, key_file: str | None, *, strict: bool = False) -> KeyService:
    """`open_key_service(..., unwrap_only=True)`, deferred to the first unwrap."""
    return KeyServiceOnDemand(lambda: open_key_service(repository, key_file, unwrap_only=True, strict=strict))


def warn_key_file(problem: str) -> None:
    print(f"braid: warning: {problem}", file=sys.stderr)


def open_copy_target(source: Repository, source_keys: KeyService, url: str, to_key_file: str | None) -> CopyTarget:
    """`braid copy --to URL`: the second repository, its key service, and what re-wraps data keys for it.

    A local target's master-key file is `--to-key-file`, else its default
    path by repository id (never BRAID_KEY_FILE: that names the source's).
    Between two KMS repositories the data key is re-encrypted inside KMS;
    across a key file and KMS it is unwrapped on this host and wrapped again.
    """
    from braid.adapters.local.keys import KeyCopy, MaterialKeys  # noqa: F401 (MaterialKeys: the casts' type)
    from braid.ops.copy import CopyTarget

    target = open_repository(url)
    kind = target.config.key.get("type")
    if kind == "local":
        target_keys: KeyService = open_key_service(target, str(Path(to_key_file).expanduser()) if to_key_file else str(default_key_file(target.config.id)))
    elif to_key_file:
        raise UsageError(f"--to-key-file is for a target with a master-key file; {target.url} uses KMS")
    else:
        target_keys = open_key_service(target, None)
    if kind == "kms" and source.config.key.get("type") == "kms":
        from braid.adapters.aws.clients import kms_client
        from braid.adapters.aws.kms import KmsCopy

        return CopyTarget(target, target_keys, KmsCopy(kms_client(), target.config.key["key_id"]))
    # Both are a master-key file or KMS (open_key_service), which hand out and take a data key's bytes.
    return CopyTarget(target, target_keys, KeyCopy(cast("MaterialKeys", source_keys), cast("MaterialKeys", target_keys)))
