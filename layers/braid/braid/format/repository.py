"""A repository: its identity, its configuration and its published backups.

The config says which key service wraps data keys (a local key file by id,
or a KMS key) and, for cloud repositories, where the pipeline is, so a user
names only the repository and Braid finds the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from braid.errors import AlreadyExistsError, IntegrityError, NotFoundError, RepositoryError, UsageError, did_you_mean
from braid.format.ids import BackupRef
from braid.format.layout import CONFIG, manifest_key, manifest_prefix, ref_from_manifest_key
from braid.format.lock import ObjectLock
from braid.ports.store import ObjectStore, RetainingStore

if TYPE_CHECKING:
    from braid.format.manifest import SealedManifest

FORMAT = "braid-repository"
# Version 2: backups' chunks may share stored objects (packs; docs/format.md). A v1 repository is refused
# with a message saying so, never read: its manifests lack the pack fields every reader now follows.
VERSION = 2


@dataclass(frozen=True)
class RepositoryConfig:
    id: str
    created: str
    key: dict[str, str]  # {"type": "local"|"kms", "key_id": ...}
    cloud: dict[str, Any] = field(default_factory=dict)  # pipeline settings (state machine, region, ...)
    # Retention of every backup's chunks and manifest (S3 Object Lock; braid.format.lock), or None.
    object_lock: ObjectLock | None = None

    @classmethod
    def new(
        cls, key: dict[str, str], created: str, cloud: dict[str, Any] | None = None, object_lock: ObjectLock | None = None
    ) -> RepositoryConfig:
        import uuid  # only `init` makes an id; every other run reads one (uuid loads platform and _uuid)

        return cls(id=str(uuid.uuid4()), created=created, key=key, cloud=cloud or {}, object_lock=object_lock)

    def to_bytes(self) -> bytes:
        doc = {"format": FORMAT, "version": VERSION, "id": self.id, "created": self.created, "key": self.key, "cloud": self.cloud}
        if self.object_lock is not None:  # absent, not null, without a lock: older configs stay byte for byte
            doc["object_lock"] = self.object_lock.to_json()
        return json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> RepositoryConfig:
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise ValueError("not a Braid repository config")
            if type(doc.get("version")) is not int or doc["version"] != VERSION:
                raise RepositoryError(
                    f"{where} is repository format v{doc.get('version')}; this Braid reads v{VERSION} only"
                    " (earlier repositories are not read: restore them with the Braid that wrote them)"
                )
            lock = doc.get("object_lock")
            return cls(
                id=str(doc["id"]),
                created=str(doc["created"]),
                key=dict(doc["key"]),
                cloud=dict(doc.get("cloud", {})),
                object_lock=None if lock is None else ObjectLock.from_json(lock),
            )
        except (ValueError, KeyError, TypeError, UsageError) as exc:
            raise RepositoryError(f"{where} is not a valid Braid repository config: {exc}") from None


class Repository:
    def __init__(self, store: ObjectStore, config: RepositoryConfig) -> None:
        self.store = store
        self.config = config
        if config.object_lock is not None:
            if not isinstance(store, RetainingStore):
                raise RepositoryError(
                    f"{store.url}/{CONFIG} asks for Object Lock retention ({config.object_lock}), which only an s3:// repository can give"
                )
            store.use_object_lock(config.object_lock)  # every chunk and manifest written through this store now carries it

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def object_lock(self) -> ObjectLock | None:
        """The retention its backups are written with: the config's, else the store's own (a pipeline
        function's, from the stack), so prune and forget respect whichever of the two says there is one."""
        if self.config.object_lock is not None:
            return self.config.object_lock
        return self.store.object_lock if isinstance(self.store, RetainingStore) else None

    @classmethod
    def create(cls, store: ObjectStore, config: RepositoryConfig) -> Repository:
        try:
            store.put(CONFIG, config.to_bytes(), create_only=True)
        except AlreadyExistsError:
            raise RepositoryError(f"{store.url} is already a Braid repository; refusing to re-initialise it") from None
        return cls(store, config)

    @classmethod
    def open(cls, store: ObjectStore) -> Repository:
        try:
            raw = store.get(CONFIG)
        except NotFoundError:
            stack = " --stack NAME" if store.url.startswith("s3://") else ""
            raise RepositoryError(f"no Braid repository at {store.url}; create one with 'braid init --repo {store.url}{stack}'") from None
        return cls(store, RepositoryConfig.from_bytes(raw, f"{store.url}/{CONFIG}"))

    def backups(self, name: str | None = None) -> list[BackupRef]:
        """Published backups (those with a manifest), oldest first."""
        refs = [ref_from_manifest_key(info.key) for info in self.store.list(manifest_prefix(name))]
        return sorted((r for r in refs if r is not None), key=lambda r: (r.id, r.name))

    def resolve(self, ref: BackupRef) -> BackupRef:
        if not ref.is_latest:
            return ref
        found = self.backups(ref.name)
        if not found:
            raise NotFoundError(f"no backups named {ref.name!r} in {self.url}{self.suggest_name(ref.name)}")
        # Ids order by start millisecond; within one millisecond the random
        # suffix does not, so the manifests' own start times decide.
        second = found[-1].id.partition("-")[0]
        candidates = [r for r in found if r.id.partition("-")[0] == second]
        if len(candidates) == 1:
            return candidates[0]
        return max(candidates, key=lambda r: self.load(r).manifest.created)

    def suggest_name(self, name: str) -> str:
        """" (did you mean pg?)": the published name closest to one that has no backups (an error path: lists every manifest)."""
        return did_you_mean(name, (ref.name for ref in self.backups()))

    def load(self, ref: BackupRef) -> SealedManifest:
        """Read and self-check a manifest (needs no key; authenticate it before trusting chunks)."""
        resolved = self.resolve(ref)
        key = manifest_key(resolved)
        try:
            raw = self.store.get(key)
        except NotFoundError:
            others = self.backups(resolved.name)
            hint = f"; {resolved.name} has {len(others)} other backup(s): see 'braid list --name {resolved.name}'" if others else self.suggest_name(resolved.name)
            raise NotFoundError(f"backup {resolved} not found in {self.url}{hint}") from None
        # Imported here: wal-push and wal-fetch, run once per WAL segment, open a repository but read no manifest.
        from braid.format.manifest import open_manifest

        sealed = open_manifest(raw, f"backup {resolved}")
        if sealed.manifest.backup != str(resolved) or sealed.manifest.repository != self.config.id:
            raise IntegrityError(
                f"manifest at {key} describes {sealed.manifest.backup} of repository {sealed.manifest.repository}; it was moved or copied"
            )
        return sealed
