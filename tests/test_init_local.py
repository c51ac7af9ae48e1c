"""`braid init` of a local repository as a use case (braid.ops.init): what it makes, and what it refuses before writing anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.errors import UsageError
from braid.format.repository import Repository
from braid.ops.init import init_local_repository


def test_creates_repository_and_key_file(tmp_path: Path) -> None:
    root, key_file = tmp_path / "repo", tmp_path / "keys" / "master.key"
    made = init_local_repository(root, LocalStore(root), LocalKeyFile, lambda repository_id: key_file)
    assert made.created_key and made.key_file == key_file and made.root == root
    assert key_file.stat().st_mode & 0o777 == 0o600
    opened = Repository.open(LocalStore(root))
    assert opened.config == made.repository.config
    assert opened.config.key == {"type": "local", "key_id": LocalKeyFile.open(key_file).key_id} == {"type": "local", "key_id": made.key_id}


def test_default_key_file_is_named_by_the_new_repository_id(tmp_path: Path) -> None:
    asked: list[str] = []

    def key_file_for(repository_id: str) -> Path:
        asked.append(repository_id)
        return tmp_path / "keys" / f"{repository_id}.key"

    made = init_local_repository(tmp_path / "repo", LocalStore(tmp_path / "repo"), LocalKeyFile, key_file_for)
    assert asked == [made.repository.config.id]
    assert made.key_file == tmp_path / "keys" / f"{made.repository.config.id}.key"


def test_an_existing_key_file_is_reused_never_replaced(tmp_path: Path) -> None:
    key_file = tmp_path / "shared.key"
    first = init_local_repository(tmp_path / "r1", LocalStore(tmp_path / "r1"), LocalKeyFile, lambda repository_id: key_file)
    before = key_file.read_bytes()
    second = init_local_repository(tmp_path / "r2", LocalStore(tmp_path / "r2"), LocalKeyFile, lambda repository_id: key_file)
    assert first.created_key and not second.created_key
    assert key_file.read_bytes() == before and second.key_id == first.key_id
    assert second.repository.config.id != first.repository.config.id


@pytest.mark.parametrize("occupied", ["file", "non-empty directory"])
def test_refuses_a_path_in_use_and_writes_nothing(tmp_path: Path, occupied: str) -> None:
    root, key_file = tmp_path / "repo", tmp_path / "master.key"
    if occupied == "file":
        root.write_bytes(b"not a repository")
    else:
        root.mkdir()
        (root / "data.sql").write_bytes(b"someone's dump")
    with pytest.raises(UsageError, match=rf"^{root} exists and is not an empty directory; choose a new path for the repository$"):
        init_local_repository(root, LocalStore(root), LocalKeyFile, lambda repository_id: key_file)
    assert not key_file.exists()


def test_an_empty_directory_is_accepted(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    made = init_local_repository(root, LocalStore(root), LocalKeyFile, lambda repository_id: tmp_path / "master.key")
    assert Repository.open(LocalStore(root)).config.id == made.repository.config.id


@pytest.mark.parametrize("inside", ["master.key", "keys/master.key", ""])
def test_refuses_a_key_file_inside_the_repository_and_writes_nothing(tmp_path: Path, inside: str) -> None:
    root = tmp_path / "repo"
    key_file = root / inside if inside else root
    with pytest.raises(UsageError, match=r"would be inside the repository; keep the master key outside it \(anyone with both can read every backup\)$"):
        init_local_repository(root, LocalStore(root), LocalKeyFile, lambda repository_id: key_file)
    assert not root.exists()
