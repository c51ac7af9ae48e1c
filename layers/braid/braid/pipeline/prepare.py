"""Prepare: make the backup's data key and stage its wrapped form.

KMS GenerateDataKey runs once per backup, in the pipeline, bound to an
encryption context naming the repository and the backup; the plaintext key
never leaves the Lambdas and the agent needs no KMS permission at all. The
wrapped key goes to staging `key.json` create-only: a retried Prepare finds
it there and keeps it, so every worker of a backup uses one key. For an
incremental, Prepare then opens the parent's chain and hands the parent's
values to the agent (braid.pipeline.parent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from braid.errors import IntegrityError, KeyAccessError
from braid.format.ids import BackupRef
from braid.format.keys import DataKey, WrappedKey, encryption_context
from braid.format.repository import Repository
from braid.format.staging import SessionRecord, StagingArea
from braid.pipeline.parent import hand_over_parent
from braid.ports.keys import KeyService
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


def check_repository(store: ObjectStore, session: SessionRecord) -> Repository:
    """The staged session belongs to the repository in this store, and that repository wraps keys with KMS."""
    repository = Repository.open(store)
    if repository.config.id != session.repository:
        raise IntegrityError(
            f"staged session of {session.backup} belongs to repository {session.repository}, but {store.url} is {repository.config.id}"
        )
    if repository.config.key.get("type") != "kms":
        raise KeyAccessError(f"repository {store.url} wraps keys with a local key file; the cloud pipeline needs a KMS repository")
    return repository


def prepare_backup(store: ObjectStore, keys: KeyService, ref: BackupRef) -> Prepared:
    area = StagingArea(store, ref)
    session = area.read_session()
    repository = check_repository(store, session)
    wrapped = area.read_wrapped_key(session.repository)
    if wrapped is None:
        _, fresh = keys.generate_data_key(encryption_context(session.repository, str(ref)))
        # A racing attempt may have staged its key first; everyone uses that one.
        wrapped = area.write_wrapped_key(fresh)
    # An incremental: its parent's chain opened here, where the keys are, and its values handed to the agent.
    hand_over_parent(repository, keys, area, session)
    return Prepared(session.repository, session.chunk_size, session.level, len(session.inputs), wrapped.key_id)


def load_data_key(store: ObjectStore, keys: KeyService, ref: BackupRef, repository_id: str) -> tuple[DataKey, WrappedKey]:
    """The backup's data key, unwrapped from what Prepare staged."""
    wrapped = StagingArea(store, ref).read_wrapped_key(repository_id)
    if wrapped is None:
        raise KeyAccessError(f"no staged data key for {ref}: Prepare has not run (or staging was removed)")
    return keys.unwrap(wrapped), wrapped
