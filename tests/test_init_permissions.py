"""`braid init` where the repository directory cannot be made: one line, exit 3, and no key file left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import run_braid

pytestmark = pytest.mark.e2e


def test_a_repository_under_a_file_is_refused_before_the_key_is_made(tmp_path: Path, isolated_config: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    result = run_braid("init", "--repo", str(blocker / "repo"))
    assert result.code == 3, result.stderr
    assert result.stderr.strip() == f"braid: error: cannot create repository directory {blocker / 'repo'}: {blocker} is not a directory"
    assert not (isolated_config / "braid" / "keys").exists() or not any((isolated_config / "braid" / "keys").iterdir())


def test_a_key_directory_that_cannot_be_made_names_key_file_and_writes_nothing(tmp_path: Path) -> None:
    """A service user whose home does not exist or is not writable (Debian's mysql: /nonexistent)."""
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("x")
    repo = tmp_path / "repo"
    result = run_braid("init", "--repo", str(repo), env={"XDG_CONFIG_HOME": str(blocker / ".config")})
    assert result.code == 4, result.stderr
    line = result.stderr.strip()
    assert line.startswith(f"braid: error: cannot create key file {blocker / '.config' / 'braid' / 'keys'}/") and line.endswith(
        "; give --key-file PATH or set BRAID_KEY_FILE"
    ), line
    assert not repo.exists()
    # With --key-file, the same user's init works.
    made = run_braid("init", "--repo", str(repo), "--key-file", str(tmp_path / "pg.key"), env={"XDG_CONFIG_HOME": str(blocker / ".config")})
    assert made.code == 0 and (repo / "config.json").exists(), made.stderr
