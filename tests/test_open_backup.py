"""Opening a backup (braid.ops.open), in-process: every way it refuses, with the typed error and its message.

Restore, deep verify and scheduled maintenance all open backups through this
one function, so these cases cover all three.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.engine.local import LocalEngine
from braid.engine.port import BackupRequest
from braid.engine.stream import sources_from_args
from braid.errors import IntegrityError, KeyAccessError, NotFoundError
from braid.format.ids import BackupRef
from braid.format.keys import DataKey, WrappedKey
from braid.format.layout import manifest_key
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import utc_now
from braid.ops.open import open_backup, read_manifest
from braid.ops.verify import verify_published


def make_repo(tmp_path: Path, name: str = "repo") -> tuple[Repository, LocalKeyFile]:
    keys = LocalKeyFile.create(tmp_path / f"{name}.key")
    (tmp_path / name).mkdir()
    config = RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, utc_now())
    return Repository.create(LocalStore(tmp_path / name), config), keys


def backup(repository: Repository, keys: LocalKeyFile, tmp_path: Path, data: bytes, name: str = "db") -> BackupRef:
    source = tmp_path / f"input-{os.urandom(4).hex()}"
    source.write_bytes(data)
    request = BackupRequest(BackupRef.new(name), sources_from_args([str(source)]), 4096, 3, 2)
    manifest = LocalEngine(repository, keys).run(request, lambda event: None)
    assert manifest is not None
    return BackupRef.parse(manifest.backup)


def rewrite_manifest(repository: Repository, ref: BackupRef, sealed: bytes) -> None:
    repository.store.put(manifest_key(ref), sealed)


def test_opens_latest_with_the_key_that_authenticates_it(tmp_path: Path) -> None:
    repository, keys = make_repo(tmp_path)
    backup(repository, keys, tmp_path, b"first" * 1000)
    newest = backup(repository, keys, tmp_path, b"second" * 1000)
    manifest, key = open_backup(repository, BackupRef.parse("db@latest"), keys)
    assert manifest.backup == str(newest) and manifest.plaintext_bytes == 6000
    assert key.fingerprint == keys.unwrap(manifest.key).fingerprint
    assert read_manifest(repository, BackupRef.parse("db@latest")) == manifest


def test_missing_backup_is_not_found(tmp_path: Path) -> None:
    repository, keys = make_repo(tmp_path)
    ref = backup(repository, keys, tmp_path, b"rows" * 100)
    repository.store.delete([manifest_key(ref)])
    with pytest.raises(NotFoundError, match=rf"^backup {ref} not found in {repository.url}$"):
        open_backup(repository, ref, keys)
    with pytest.raises(NotFoundError, match=rf"^no backups named 'db' in {repository.url}$"):
        open_backup(repository, BackupRef.parse("db@latest"), keys)


def test_wrong_key_file_is_a_key_error(tmp_path: Path) -> None:
    repository, keys = make_repo(tmp_path)
    ref = backup(repository, keys, tmp_path, b"secret rows")
    other = LocalKeyFile.create(tmp_path / "other.key")
    with pytest.raises(KeyAccessError, match=rf"^{ref} was encrypted under key {keys.key_id}, but key file .*other.key holds .*: wrong key file$"):
        open_backup(repository, ref, other)
    # Quick verify needs no key: it still reads the backup.
    assert verify_published(repository, ref, None).ok


def test_forged_wrapped_key_does_not_unwrap(tmp_path: Path) -> None:
    repository, keys = make_repo(tmp_path)
    ref = backup(repository, keys, tmp_path, b"rows" * 1000)
    manifest = read_manifest(repository, ref)
    forged = WrappedKey(manifest.key.key_id, bytes(reversed(manifest.key.ciphertext)), manifest.key.context)
    rewrite_manifest(repository, ref, dataclasses.replace(manifest, key=forged).seal(DataKey(os.urandom(32))))
    with pytest.raises(KeyAccessError, match=rf"^the data key of {ref} does not unwrap under .*: wrong key or altered encryption context$"):
        open_backup(repository, ref, keys)


def test_manifest_resealed_under_another_key_fails_authentication(tmp_path: Path) -> None:
    repository, keys = make_repo(tmp_path)
    ref = backup(repository, keys, tmp_path, b"rows" * 1000)
    manifest = read_manifest(repository, ref)
    # Self-consistent (its checksum is right), so list and quick verify accept it; only the MAC can tell.
    rewrite_manifest(repository, ref, dataclasses.replace(manifest, engine="forged").seal(DataKey(os.urandom(32))))
    assert read_manifest(repository, ref).engine == "forged"
    with pytest.raises(IntegrityError, match=rf"^manifest of {ref} failed authentication \(tampered, or not written by this key\)$"):
        open_backup(repository, ref, keys)
    with pytest.raises(IntegrityError, match="failed authentication"):
        verify_published(repository, ref, keys)


def test_corrupt_manifest_is_refused_before_any_key_is_asked_for(tmp_path: Path) -> None:
    repository, keys = make_repo(tmp_path)
    ref = backup(repository, keys, tmp_path, b"rows" * 1000)
    path = tmp_path / "repo" / manifest_key(ref)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))

    class NoKeys:
        key_id = "unused"

        def generate_data_key(self, context: object) -> tuple[DataKey, WrappedKey]:
            raise AssertionError("open_backup never makes keys")

        def unwrap(self, wrapped: WrappedKey) -> DataKey:
            raise AssertionError("a corrupt manifest must be refused before its key is unwrapped")

    with pytest.raises(IntegrityError, match=rf"^backup {ref}: manifest (checksum mismatch|is not valid Braid manifest JSON) \(corrupt\)$"):
        open_backup(repository, ref, NoKeys())


def test_manifest_copied_from_another_repository_is_refused(tmp_path: Path) -> None:
    repository, keys = make_repo(tmp_path)
    ref = backup(repository, keys, tmp_path, b"rows" * 1000)
    other, _ = make_repo(tmp_path, "other")
    other.store.put(manifest_key(ref), repository.store.get(manifest_key(ref)))
    with pytest.raises(IntegrityError, match=rf"describes {ref} of repository {repository.config.id}; it was moved or copied$"):
        open_backup(other, ref, keys)


def test_verify_published_is_deep_only_with_a_key_service(tmp_path: Path) -> None:
    repository, keys = make_repo(tmp_path)
    ref = backup(repository, keys, tmp_path, os.urandom(4096 * 3))
    quick = verify_published(repository, ref, None)
    deep = verify_published(repository, ref, keys, sample_percent=50)
    assert (quick.mode, quick.chunks_checked, quick.ok) == ("quick", 3, True)
    assert (deep.mode, deep.chunks_checked, deep.chunks_total, deep.ok) == ("deep", 2, 3, True)
