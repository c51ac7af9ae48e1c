"""Issue 25's day-one rough edges: the producer's informative line, --rate-limit on a directory repository,
the messages after rekey, for status on a local repository and a tiny backup's SAVED (each with its exit code)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import run_braid
from support.kill_points import pattern


def test_a_producers_failure_quotes_the_line_a_continuation_belongs_to(repo: Path) -> None:
    script = (
        'echo "pg_basebackup: error: connection to server on socket \\"/run/postgresql/.s.PGSQL.5999\\" failed: No such file or directory" >&2;'
        ' printf "\\tIs the server running locally and accepting connections on that socket?\\n" >&2; exit 1'
    )
    result = run_braid("backup", "--repo", str(repo), "--name", "pg", "--", "sh", "-c", script)
    assert result.code == 11, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "its last stderr line: \"pg_basebackup: error: connection to server on socket" in line, line
    assert ".s.PGSQL.5999" in line and "Is the server running" not in line, line


def test_rate_limit_caps_a_directory_backup(repo: Path) -> None:
    data = pattern(2 * 2**20, 3)
    started = time.monotonic()
    result = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", "256KiB", "--rate-limit", "1MiB", stdin=data)
    elapsed = time.monotonic() - started
    assert result.code == 0, result.stderr
    # One chunk may go at once; the other 1.75 MiB at 1 MiB/s: a lower bound, which a loaded machine only lengthens.
    assert elapsed >= 1.6, elapsed
    assert run_braid("restore", "--repo", str(repo), result.out.strip()).stdout == data
    zero = run_braid("backup", "--repo", str(repo), "--name", "db", "--rate-limit", "0", stdin=data)
    assert zero.code == 2 and "--rate-limit must be at least 1 B" in zero.stderr


def test_after_rekey_a_stale_key_file_says_when_and_where_to_point(repo: Path, tmp_path: Path) -> None:
    ref = run_braid("backup", "--repo", str(repo), "--name", "db", stdin=b"rows" * 100).out.strip()
    new = tmp_path / "new.key"
    rekeyed = run_braid("rekey", "--repo", str(repo), "--new-key-file", str(new))
    assert rekeyed.code == 0, rekeyed.stderr
    assert f"escrow the new key now: keep a copy of {new}" in rekeyed.stderr and f'key_file = "{new}"' in rekeyed.stderr
    stale = run_braid("restore", "--repo", str(repo), ref)  # the default key file: the old key
    assert stale.code == 4
    assert "wrong key file; the repository was re-keyed on 20" in stale.stderr and "point key_file (config file), BRAID_KEY_FILE or --key-file" in stale.stderr
    assert run_braid("restore", "--repo", str(repo), ref, "--key-file", str(new)).code == 0


def test_status_on_a_local_repository_points_to_show_and_list(repo: Path) -> None:
    result = run_braid("status", "--repo", str(repo), "db@latest")
    assert result.code == 2 and "this is a local repository: use braid show NAME@ID / braid list" in result.stderr


def test_saved_is_a_dash_for_a_tiny_backup(repo: Path) -> None:
    assert run_braid("backup", "--repo", str(repo), "--name", "tiny", stdin=b"abcdef").code == 0
    row = run_braid("list", "--repo", str(repo)).out.splitlines()[1]
    assert "%" not in row and " - " in row


def test_prune_dry_run_says_why_each_backup_is_kept(repo: Path) -> None:
    refs = [run_braid("backup", "--repo", str(repo), "--name", "db", stdin=b"rows %d" % i).out.strip() for i in range(3)]
    result = run_braid("prune", "--repo", str(repo), "--keep-last", "2", "--keep-daily", "1", "--dry-run")
    assert result.code == 0, result.stderr
    assert f"would remove {refs[0]}" in result.out
    assert f"would keep {refs[1]}: keep-last 2: one of the newest 2\n" in result.out
    assert f"would keep {refs[2]}: keep-last 2: one of the newest 2; keep-daily 1: newest of " in result.out
    doc = json.loads(run_braid("prune", "--repo", str(repo), "--keep-within", "1d", "--dry-run", "--json").out)
    assert doc["reasons"] == {ref: ["keep-within 1d: started within it of the newest"] for ref in refs}
    newest = json.loads(run_braid("prune", "--repo", str(repo), "--keep-days", "0", "--dry-run", "--json").out)
    assert newest["reasons"][refs[2]] in (["the newest of db (always kept)"], ["keep-days 0: started in the last 0 days"])


def test_the_demo_runs_the_producer_the_recommended_way_and_restores_every_byte(tmp_path: Path) -> None:
    """Review dba-3 F23: scripts/demo shows the command form (`--pipes 2 -- COMMAND`), not `--input` fifos fed from the background."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "BRAID_DEMO_DIR": str(tmp_path / "work"), "BRAID_REPO": str(tmp_path / "repo"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    done = subprocess.run([str(root / "scripts" / "demo")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "through two pipes matched the original bytes" in done.stderr
    assert "--input" not in (root / "scripts" / "demo").read_text()
    (backup,) = json.loads(run_braid("list", "--repo", str(tmp_path / "repo"), "--json", env={"XDG_CONFIG_HOME": str(tmp_path / "config")}).out)
    assert backup["name"] == "demo" and backup["inputs"] == 2, backup
