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
