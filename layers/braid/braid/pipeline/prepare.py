"""Prepare: make the backup's data key and stage its wrapped form.

KMS GenerateDataKey runs once per backup, in the pipeline, bound to an
encryption context naming the repository and the backup; the plaintext key
never leaves the Lambdas and the agent needs no KMS permission at all. The
wrapped key goes to staging `key.json` create-only: a retried Prepare finds
it there and keeps it, so every worker of a backup uses one key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from braid.errors import AlreadyExistsError, IntegrityError, KeyAccessError, NotFoundError
from braid.format.ids import BackupRef
from braid.format.keys import DataKey, KeyService, WrappedKey, encryption_context
from braid.format.repository import Repository
from braid.format.staging import SessionRecord, wrapped_key_key
from braid.pipeline.plan import read_session
from braid.ports.store import ObjectStore


@dataclass(frozen=True)
class Prepared:
    repository: str
    chunk_size: int
    level: int
    inputs: int
    key_id: str

    def to_json(self) -> dict[str, Any]:
        return {"repository": self.repository, "chunk_size": self.chunk_size, "level": self.level, "inputs": self.inputs, "key_id": self.key_id}


def read_wrapped_key(store: ObjectStore, ref: BackupRef, repository_id: str) -> WrappedKey | None:
    """The staged wrapped key, checked to be bound to this backup; None before Prepare ran."""
    try:
        raw = store.get(wrapped_key_key(ref))
    except NotFoundError:
        return None
    try:
        wrapped = WrappedKey.from_json(json.loads(raw))
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"staged data key of {ref} is malformed: {exc}") from None
    if wrapped.context != encryption_context(repository_id, str(ref)):
        raise IntegrityError(f"staged data key of {ref} is bound to {wrapped.context}, not to this backup")
    return wrapped


def check_repository(store: ObjectStore, session: SessionRecord) -> Repository:
    repository = Repository.open(store)
    if repository.config.id != session.repository:
        raise IntegrityError(
            f"staged session of {session.backup} belongs to repository {session.repository}, but {store.url} is {repository.config.id}"
        )
    if repository.config.key.get("type") != "kms":
        raise KeyAccessError(f"repository {store.url} wraps keys with a local key file; the cloud pipeline needs a KMS repository")
    return repository


def prepare_backup(store: ObjectStore, keys: KeyService, ref: BackupRef) -> Prepared:
    session = read_session(store, ref)
    check_repository(store, session)
    wrapped = read_wrapped_key(store, ref, session.repository)
    if wrapped is None:
        _, fresh = keys.generate_data_key(encryption_context(session.repository, str(ref)))
        try:
            store.put(wrapped_key_key(ref), json.dumps(fresh.to_json(), sort_keys=True).encode(), create_only=True)
            wrapped = fresh
        except AlreadyExistsError:
            # A racing attempt staged its key first; everyone uses that one.
            wrapped = read_wrapped_key(store, ref, session.repository)
            assert wrapped is not None
    return Prepared(session.repository, session.chunk_size, session.level, len(session.inputs), wrapped.key_id)


def load_data_key(store: ObjectStore, keys: KeyService, ref: BackupRef, repository_id: str) -> tuple[DataKey, WrappedKey]:
    wrapped = read_wrapped_key(store, ref, repository_id)
    if wrapped is None:
        raise KeyAccessError(f"no staged data key for {ref}: Prepare has not run (or staging was removed)")
    return keys.unwrap(wrapped), wrapped
