"""Rekey of the WAL archive: re-wrap the data key of every archived WAL object and WAL pack (braid.ops.rekey runs it).

A backup's wrapped key lives in its manifest; a stored WAL file's and a
pack's live in the object's own head (docs/format.md, "A stored WAL file",
"A WAL pack"). So rekey rewrites each of them: the same bytes, with the key
re-wrapped under the target (KMS ReEncrypt, or the master-key file's
unwrap-and-wrap: braid.ports.keys.KeyRewrapper) in place of the old one.
The frames are untouched: their GCM authenticates their own headers, not
the object's head, so an object whose new key unwraps to the same data key
opens exactly as before. Per object:

1. read the object (its version first, then the bytes) and its key, and
   check the key is bound to this repository and this file or pack; one
   already under the target is checked to unwrap there and skipped;
2. unwrap the old key, re-wrap it, and check the target unwraps the new
   one to the same data key (fingerprint);
3. replace the object only as the version read (`put(replacing=...)`: S3's
   If-Match, which the bucket policy lets through under `wal/`), read it
   back and compare.

A PUT is atomic: after a crash an object is wholly old or wholly new, each
opening under the key it names, and rerunning finishes. An object removed
meanwhile (a prune) is skipped. The cost is the archive's size read and
written once (a GET and a PUT per object): the keys are in the objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from braid.errors import BackupError, IntegrityError, NotFoundError
from braid.format import wal_object, wal_pack
from braid.format.keys import WrappedKey, encryption_context
from braid.format.layout import wal_file_of_key, wal_prefix
from braid.format.repository import Repository
from braid.format.wal import wal_context_name
from braid.ops.wal_packed import packed_members
from braid.ops.wal_retention import archive_names
from braid.ports.keys import KeyRewrapper, KeyService


@dataclass
class WalRekeyReport:
    """Archived WAL objects (files and packs) re-wrapped, already under the target, and failed (key, error)."""

    rewrapped: int = 0
    already: int = 0
    failed: list[tuple[str, BackupError]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"rewrapped": self.rewrapped, "already": self.already, "failed": [{"object": k, "error": str(e)} for k, e in self.failed]}


@dataclass(frozen=True)
class _Kind:
    magic: bytes
    version: int
    label: str
    bound: str  # the encryption context's braid:backup the object's key must name


def _objects(repository: Repository) -> Iterator[tuple[str, _Kind]]:
    """Every archived WAL object of every name with its kind: a stored file or a pack (archive.json and temporary files are neither)."""
    for name in archive_names(repository.store):
        for info in repository.store.list(wal_prefix(name)):
            file = wal_file_of_key(name, info.key)
            if file is not None:
                yield info.key, _Kind(wal_object.MAGIC, wal_object.VERSION, "WAL object", wal_context_name(name, file.name))
            elif packed_members(name, info.key):
                directory, _slash, base = info.key[len(wal_prefix(name)) :].partition("/")
                yield info.key, _Kind(wal_pack.MAGIC, wal_pack.VERSION, "WAL pack", wal_pack.pack_context_name(name, directory, base))


def rekey_wal_object(repository: Repository, key: str, kind: _Kind, old: KeyService, new: KeyService, rewrap: KeyRewrapper) -> bool | None:
    """Re-wrap one object's key (the module's steps): True if re-wrapped, False if it already was, None if it is gone."""
    store = repository.store
    where = f"{repository.url}/{key}"
    current = store.head(key)
    try:
        if current is None:
            return None
        raw = store.get(key)
    except NotFoundError:
        return None
    wrapped = wal_object.head_key(raw, kind.magic, kind.version, kind.label, where)
    expected = encryption_context(repository.config.id, kind.bound)
    if wrapped.context != expected:
        raise IntegrityError(f"{where}: its key is bound to {wrapped.context}, not {expected}; it was moved or copied")
    if wrapped.key_id == rewrap.target_key_id:
        new.unwrap(wrapped)  # done by an earlier run: it must unwrap under the target
        return False
    data_key = old.unwrap(wrapped)
    rewrapped: WrappedKey = rewrap.rewrap(wrapped)
    if rewrapped.context != wrapped.context or new.unwrap(rewrapped).fingerprint != data_key.fingerprint:
        raise IntegrityError(f"{where}: the re-wrapped key does not unwrap to the object's data key under {rewrap.target_key_id}; nothing was written")
    new_raw = wal_object.with_head_key(raw, kind.magic, kind.version, kind.label, rewrapped, where)
    try:
        store.put(key, new_raw, replacing=current.version)
    except (IntegrityError, NotFoundError):
        if store.head(key) is None:
            return None  # pruned between our read and our write
        raise
    if store.get(key) != new_raw:
        raise IntegrityError(f"{where}: read back differently after the rekey replaced it; run rekey again")
    return True


def rekey_wal(repository: Repository, old: KeyService, new: KeyService, rewrap: KeyRewrapper, report: WalRekeyReport, seen: set[str]) -> None:
    """Every archived WAL object not in `seen` (which this fills), each re-wrapped or its failure recorded."""
    for key, kind in _objects(repository):
        if key in seen:
            continue
        seen.add(key)
        try:
            done = rekey_wal_object(repository, key, kind, old, new, rewrap)
        except BackupError as exc:
            report.failed.append((key, exc))
            continue
        if done is not None:
            if done:
                report.rewrapped += 1
            else:
                report.already += 1
