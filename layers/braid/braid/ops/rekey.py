"""Rekey: re-wrap every backup's data key under another key, rewriting only manifests.

A backup's data key never changes (its chunks are encrypted under keys
derived from it, and are never touched); only the wrapped form stored in the
manifest does. The manifest's MAC covers that form, so the manifest is
re-sealed with the data key, which this needs in plaintext once (the old
key unwraps it, and authenticates the manifest before anything is
rewritten); the re-wrap itself is KMS ReEncrypt in the cloud, the master-key
file's unwrap-and-wrap locally (braid.ports.keys.KeyRewrapper).

Manifests are create-only everywhere else; this is the one place one is
replaced, so the switch is made safe step by step, per backup:

1. read the manifest, authenticate it under the old key; one already
   wrapped by the target key is checked to open under it and skipped
   (a rerun's progress);
2. write the new version to `rekey/NAME/ID.json`, read it back, compare
   the bytes, and check it: it parses, every field but `key` and `rekeyed`
   is the old one's, the target key unwraps the same data key, and the MAC
   authenticates;
3. check the manifest is still the bytes read in 1 (a concurrent prune or
   another rekey changed nothing), replace it only as the version read in
   1 (`put(replacing=...)`: one conditional PUT with If-Match on S3, which
   the bucket's create-only policy lets through for manifests; locally a
   version check just before the fsynced rename), read it back and compare;
4. check the backup's chunks are all still listed: a prune that removed
   the backup between 3's check and its PUT has then taken them, and the
   manifest just written is deleted again (the backup was being removed);
5. delete the copy under `rekey/`.

Crash states: before 3, the old manifest is intact (a `rekey/` copy may be
left: the rerun overwrites it); a PUT or rename is atomic, so after a crash
in 3 the manifest is wholly old or wholly new, and either opens under the
key it names; after 3 the rerun finds it under the target key and only
removes the copy. Nothing else is written, so a repository mid-rekey is a
repository whose backups are wrapped under two keys: restore needs the key
a backup names (its error says which), and rerunning finishes the job. The
config's key is switched last, after every manifest is done, then the
manifests are listed once more for backups published under the old key
while the rekey ran.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from braid.errors import BackupError, IntegrityError, NotFoundError
from braid.format.canonical import canonical_json
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.layout import CONFIG, data_prefix, manifest_key, rekey_key
from braid.format.manifest import Manifest, open_manifest, seal_body
from braid.format.repository import Repository
from braid.format.stored import stored_objects
from braid.format.timestamps import utc_now
from braid.ops.wal_rekey import WalRekeyReport, rekey_wal
from braid.ports.keys import KeyRewrapper, KeyService


@dataclass
class RekeyReport:
    target: str
    rewrapped: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    failed: list[tuple[str, BackupError]] = field(default_factory=list)
    config_switched: bool = False
    wal: WalRekeyReport = field(default_factory=WalRekeyReport)  # the WAL archive's objects (files and packs)

    def to_json(self) -> dict[str, Any]:
        return {
            "key_id": self.target,
            "rewrapped": self.rewrapped,
            "already": self.already,
            "failed": [{"backup": b, "error": str(e)} for b, e in self.failed],
            "config_switched": self.config_switched,
            "wal": self.wal.to_json(),
        }


def _same_data_key(a: DataKey, b: DataKey) -> bool:
    return a.fingerprint == b.fingerprint


def _without_key(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("key", "rekeyed")}


def rekey_backup(repository: Repository, ref: BackupRef, old: KeyService, new: KeyService, rewrap: KeyRewrapper) -> bool:
    """Re-wrap one backup's data key under `rewrap.target_key_id`; False if it already was (see the module docstring)."""
    store = repository.store
    target = manifest_key(ref)
    side = rekey_key(ref)
    # The version first, then the bytes: if the manifest changes in between, the version is older
    # than what was read and the replacing PUT below is refused, never the reverse.
    current = store.head(target)
    try:
        if current is None:
            raise NotFoundError(target)
        raw = store.get(target)
    except NotFoundError:
        raise NotFoundError(f"backup {ref} not found in {repository.url}") from None
    sealed = open_manifest(raw, f"backup {ref}")
    if sealed.manifest.backup != str(ref) or sealed.manifest.repository != repository.config.id:
        raise IntegrityError(f"manifest at {target} describes {sealed.manifest.backup} of repository {sealed.manifest.repository}; it was moved or copied")
    wrapped = sealed.manifest.key
    if wrapped.key_id == rewrap.target_key_id:
        sealed.authenticate(new.unwrap(wrapped))  # done by an earlier run: it must open under the target
        store.delete([side])
        return False
    data_key = old.unwrap(wrapped)
    manifest = sealed.authenticate(data_key)
    body = json.loads(sealed.body)
    body["key"] = rewrap.rewrap(wrapped).to_json()
    body["rekeyed"] = {"at": utc_now(), "from": wrapped.key_id}
    new_body = canonical_json(body)
    new_raw = seal_body(new_body, data_key.manifest_mac(new_body))

    store.put(side, new_raw)
    _check_new_version(store.get(side), new_raw, side, ref, manifest, sealed.body, new)
    if store.get(target) != raw:
        raise IntegrityError(f"manifest of {ref} changed during the rekey (a prune or another rekey?); run rekey again")
    # Replaced only if it is still the version read (S3: If-Match, which the bucket's create-only
    # policy lets through for manifests): a change since is refused, not overwritten.
    store.put(target, new_raw, replacing=current.version)
    if store.get(target) != new_raw:
        raise IntegrityError(f"manifest of {ref} read back differently after the rekey replaced it; run rekey again")
    listed = {info.key for info in store.list(data_prefix(ref))}
    if any(stored.key not in listed for stored in stored_objects(manifest)):
        store.delete([target])  # a prune removed it between our check and our PUT: finish its removal
        raise NotFoundError(f"backup {ref} was removed (pruned or forgotten) while it was re-keyed")
    store.delete([side])
    return True


def _check_new_version(
    reread: bytes, written: bytes, where: str, ref: BackupRef, manifest: Manifest, old_body: bytes, new: KeyService
) -> None:
    if reread != written:
        raise IntegrityError(f"re-keyed manifest of {ref} read back differently from what was written ({where})")
    opened = open_manifest(reread, where)
    if _without_key(json.loads(opened.body)) != _without_key(json.loads(old_body)):
        raise IntegrityError(f"re-keyed manifest of {ref} differs from the original beyond its key")
    key = new.unwrap(opened.manifest.key)
    opened.authenticate(key)
    if replace(opened.manifest, key=manifest.key, rekeyed=manifest.rekeyed) != manifest:
        raise IntegrityError(f"re-keyed manifest of {ref} does not describe the same backup")


def rekey_repository(
    repository: Repository,
    old: KeyService,
    new: KeyService,
    rewrap: KeyRewrapper,
    new_config_key: dict[str, str],
    progress: Callable[[str, bool], None] = lambda backup, done: None,
) -> RekeyReport:
    """Every backup and WAL object, then the config's key, then any backup or WAL object written under the old key meanwhile."""
    report = RekeyReport(rewrap.target_key_id)

    def one_pass(seen: set[BackupRef]) -> None:
        for ref in repository.backups():
            if ref in seen:
                continue
            seen.add(ref)
            try:
                changed = rekey_backup(repository, ref, old, new, rewrap)
            except NotFoundError:
                continue  # removed since the listing
            except BackupError as exc:
                report.failed.append((str(ref), exc))
                continue
            (report.rewrapped if changed else report.already).append(str(ref))
            progress(str(ref), changed)

    seen: set[BackupRef] = set()
    wal_seen: set[str] = set()
    one_pass(seen)
    rekey_wal(repository, old, new, rewrap, report.wal, wal_seen)
    if not report.failed and not report.wal.failed and repository.config.key != new_config_key:
        config = replace(repository.config, key=dict(new_config_key))  # everything else kept (the cloud settings, the object lock)
        repository.store.put(CONFIG, config.to_bytes())  # the one other replaced object: atomic, like the manifest switch
        repository.config = config
        report.config_switched = True
    one_pass(seen)
    rekey_wal(repository, old, new, rewrap, report.wal, wal_seen)
    return report
