"""From what the user typed (`--repo`, `--key-file`) to live ports.

A repository URL is a directory path or `s3://bucket/prefix`; the repository
config then says which key service wraps its data keys.
"""

from __future__ import annotations

import os
from pathlib import Path

from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.contract import ENV_KEY_FILE, ENV_REPO
from braid.errors import KeyAccessError, RepositoryError, UsageError
from braid.format.keys import KeyService
from braid.format.repository import Repository
from braid.ports.store import ObjectStore


def is_s3_url(url: str) -> bool:
    return url.startswith("s3://")


def repo_url(arg: str | None) -> str:
    url = arg or os.environ.get(ENV_REPO)
    if not url:
        raise UsageError("no repository given: pass --repo DIR|s3://BUCKET/PREFIX or set BRAID_REPO")
    return url


def open_store(url: str) -> ObjectStore:
    if is_s3_url(url):
        from braid.adapters.aws.s3 import S3Store, parse_s3_url, s3_client

        bucket, prefix = parse_s3_url(url)
        return S3Store(s3_client(), bucket, prefix)
    if "://" in url:
        raise UsageError(f"unsupported repository URL {url!r}: use a directory path or s3://BUCKET/PREFIX")
    return LocalStore(Path(url).expanduser().absolute())


def open_repository(url: str) -> Repository:
    store = open_store(url)
    if isinstance(store, LocalStore) and not store.root.is_dir():
        raise RepositoryError(f"repository directory {store.root} does not exist; create it with 'braid init --repo {url}'")
    return Repository.open(store)


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "braid"


def default_key_file(repository_id: str) -> Path:
    return config_dir() / "keys" / f"{repository_id}.key"


def key_file_path(arg: str | None, repository_id: str) -> Path:
    explicit = arg or os.environ.get(ENV_KEY_FILE)
    return Path(explicit).expanduser() if explicit else default_key_file(repository_id)


def open_key_service(repository: Repository, key_file: str | None, *, unwrap_only: bool = False) -> KeyService:
    """The key service the repository's config names, checked against it."""
    kind = repository.config.key.get("type")
    if kind == "local":
        keys = LocalKeyFile.open(key_file_path(key_file, repository.config.id))
        expected = repository.config.key.get("key_id")
        if keys.key_id != expected:
            raise KeyAccessError(
                f"key file {keys.path} holds key {keys.key_id}, but repository {repository.url} uses {expected}: wrong key file"
            )
        return keys
    if kind == "kms":
        from braid.adapters.aws.kms import KmsKeyService, kms_client

        if unwrap_only:
            return KmsKeyService.for_unwrap(kms_client())
        return KmsKeyService(kms_client(), repository.config.key["key_id"])
    raise RepositoryError(f"repository {repository.url} names an unknown key service {kind!r}")
