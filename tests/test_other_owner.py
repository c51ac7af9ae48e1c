"""Running as another user than the repository's owner (issue 25, F1): refused at start, naming the owner,
with nothing written, unless --allow-other-owner; and a permission error is never an integrity failure
(verify records nothing, list skips with one warning, prune says to fix permissions).

The refusal needs root (to own a repository as someone else); the permission errors are EACCES as the
directory store maps it (`_storage_error`), raised for the objects another user's run would have left
0600, since root itself is never refused by the kernel."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pwd
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from braid.adapters.local import store as local_store
from braid.cli.main import main
from braid.errors import PermissionDeniedError
from braid.format.layout import VERIFICATIONS
from conftest import run_braid
from support.kill_points import pattern

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="owning a repository as another user needs root")


def owned_files(repo: Path, uid: int) -> list[Path]:
    return [p for p in [repo, *repo.rglob("*")] if p.lstat().st_uid == uid]


@root_only
def test_a_run_as_another_user_is_refused_naming_the_owner_and_writes_nothing(tmp_path: Path) -> None:
    repo, key = tmp_path / "repo", tmp_path / "key"
    assert run_braid("init", "--repo", str(repo), "--key-file", str(key)).code == 0
    nobody = pwd.getpwnam("nobody").pw_uid
    shutil.chown(repo, "nobody")
    for path in repo.rglob("*"):
        os.chown(path, nobody, -1)
    before = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*"))

    for words in (["backup", "--name", "db"], ["list"], ["verify", "--all"], ["prune", "--keep-last", "1"]):
        result = run_braid(*words, "--repo", str(repo), "--key-file", str(key), stdin=pattern(5_000, 1))
        assert result.code == 3, (words, result.stderr)
        assert f"repository {repo} is owned by nobody, but braid runs as root" in result.stderr
        assert f"sudo -u nobody braid {words[0]} ..." in result.stderr and "--allow-other-owner" in result.stderr
    assert owned_files(repo, 0) == [] and sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == before
    # BRAID_REPO names it just as well.
    assert run_braid("list", env={"BRAID_REPO": str(repo)}).code == 3

    allowed = run_braid("backup", "--repo", str(repo), "--key-file", str(key), "--name", "db", "--allow-other-owner", stdin=pattern(5_000, 1))
    assert allowed.code == 0, allowed.stderr
    assert owned_files(repo, 0)  # what the override is for: root's files, which the owner must be able to read
    # The override is a command-line decision, never a setting left in the environment.
    assert run_braid("list", "--repo", str(repo), env={"BRAID_ALLOW_OTHER_OWNER": "1"}).code == 3


@root_only
def test_copy_to_a_repository_of_another_user_is_refused(tmp_path: Path) -> None:
    for name in ("r1", "r2"):
        assert run_braid("init", "--repo", str(tmp_path / name), "--key-file", str(tmp_path / f"{name}.key")).code == 0
    ref = run_braid("backup", "--repo", str(tmp_path / "r1"), "--key-file", str(tmp_path / "r1.key"), "--name", "db", stdin=b"x" * 5000).out.strip()
    shutil.chown(tmp_path / "r2", "nobody")
    result = run_braid("copy", "--repo", str(tmp_path / "r1"), "--key-file", str(tmp_path / "r1.key"), ref, "--to", str(tmp_path / "r2"))
    assert result.code == 3 and "is owned by nobody" in result.stderr and "sudo -u nobody braid copy" in result.stderr
    assert not (tmp_path / "r2" / "data").exists()


@pytest.fixture
def denied(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """Keys of objects this user may not read: the directory store raises what it raises for EACCES."""
    keys: set[str] = set()

    def refusing(real: Callable[..., Any]) -> Callable[..., Any]:
        def read(self: local_store.LocalStore, key: str, *args: Any) -> Any:
            if any(key.startswith(k) for k in keys):
                raise local_store._storage_error("reading", self._path(key), PermissionError(errno.EACCES, "Permission denied"))
            return real(self, key, *args)

        return read

    for method in ("get", "get_into", "get_range", "get_range_into"):  # every way the store reads an object
        monkeypatch.setattr(local_store.LocalStore, method, refusing(getattr(local_store.LocalStore, method)))
    yield keys


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_eacces_maps_to_a_permission_error_not_an_integrity_one(tmp_path: Path) -> None:
    error = local_store._storage_error("reading", tmp_path / "x", PermissionError(errno.EACCES, "Permission denied"))
    assert isinstance(error, PermissionDeniedError) and error.exit_code == 7 and "fix its owner or mode" in str(error)


def test_permission_errors_are_not_recorded_as_failed_verifies_and_list_skips_them(repo: Path, denied: set[str]) -> None:
    good = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", "4KiB", stdin=pattern(20_000, 1)).out.strip()
    other = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", "4KiB", stdin=pattern(20_000, 2)).out.strip()
    name, _, ident = other.partition("@")
    denied.update({f"manifests/{name}/{ident}.json", f"catalog/summaries/{name}/{ident}.json", "catalog/index/"})

    code, out, err = run_cli("verify", "--repo", str(repo), "--all", "--json")
    assert code == 7, err
    assert f"{other} was not verified, and no result was recorded" in err and "permission denied" in err
    assert not (repo / VERIFICATIONS / name / ident).exists()  # no FAILED record left behind
    assert (repo / VERIFICATIONS / name / good.partition("@")[2]).exists()

    code, out, err = run_cli("list", "--repo", str(repo), "--json")
    assert code == 0, err
    assert [row["backup"] for row in json.loads(out)] == [good]
    assert err.count("warning") == 1 and f"skipped 1 backup(s) this user may not read (first: {other}" in err and "fix permissions" in err

    code, out, err = run_cli("prune", "--repo", str(repo), "--keep-last", "1", "--dry-run")
    assert code == 7, err
    assert "fix permissions" in err and "braid forget" not in err


def test_chunks_unreadable_for_permissions_are_not_recorded(repo: Path, denied: set[str]) -> None:
    ref = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", "4KiB", stdin=pattern(20_000, 1)).out.strip()
    name, _, ident = ref.partition("@")
    denied.add(f"data/{name}/{ident}/0000000001")
    code, _out, err = run_cli("verify", "--repo", str(repo), ref, "--deep")
    assert code == 7, err
    assert "no result was recorded" in err and not (repo / VERIFICATIONS).exists()
