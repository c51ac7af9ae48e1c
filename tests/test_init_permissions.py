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


@pytest.mark.parametrize("mode,who", [(0o644, "its group and others"), (0o640, "its group"), (0o604, "others")])
def test_a_master_key_others_may_read_is_warned_about_and_refused_with_strict_permissions(tmp_path: Path, mode: int, who: str) -> None:
    repo, key = tmp_path / "repo", tmp_path / "master.key"
    assert run_braid("init", "--repo", str(repo), "--key-file", str(key)).code == 0
    made = run_braid("backup", "--repo", str(repo), "--key-file", str(key), "--name", "k", stdin=b"secret rows\n")
    assert made.code == 0 and "warning" not in made.stderr  # 0600 as init made it: not a word
    key.chmod(mode)
    problem = f"key file {key} is readable by {who} (mode {mode:04o}); make it private: chmod 600 {key}"
    warned = run_braid("restore", made.out.strip(), "--repo", str(repo), "--key-file", str(key))
    assert warned.code == 0 and warned.stdout == b"secret rows\n"
    assert f"braid: warning: {problem}\n" in warned.stderr
    refused = run_braid("restore", made.out.strip(), "--repo", str(repo), "--key-file", str(key), "--strict-permissions")
    assert (refused.code, refused.stderr.splitlines()[-1]) == (4, f"braid: error: {problem} (refused: --strict-permissions)")
    by_env = run_braid("backup", "--repo", str(repo), "--key-file", str(key), "--name", "k", stdin=b"x", env={"BRAID_STRICT_PERMISSIONS": "1"})
    assert by_env.code == 4 and "refused: --strict-permissions" in by_env.stderr


def test_a_parent_this_user_may_not_write_names_the_real_user_in_the_command_to_paste(
    tmp_path: Path, isolated_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review dba-3 F15: the hint names the user who runs braid (`-o postgres`), not a literal USER. Root may write anywhere,
    so this runs in-process as the service user `nobody` would see it: its uid, and a parent it may not write."""
    import os
    import pwd

    from braid.cli.main import main

    locked = tmp_path / "backups"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path) == locked else real_access(path, mode, **kw))
    monkeypatch.setattr(os, "geteuid", lambda: pwd.getpwnam("nobody").pw_uid)

    code = main(["init", "--repo", str(locked / "braid")])

    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert err == (
        f"braid: error: cannot create repository directory {locked / 'braid'}: {locked} is not writable by this user;"
        f" have it made for this user first, e.g. 'install -d -o nobody -m 0700 {locked / 'braid'}'"
    )
    assert not (locked / "braid").exists() and not (isolated_config / "braid" / "keys").exists()
