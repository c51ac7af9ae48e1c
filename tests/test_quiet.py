"""--quiet for cron: the commands a schedule runs print nothing when all is well, and what is wrong when it is not."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import run_braid


def backup(repo: Path, name: str, data: bytes) -> str:
    result = run_braid("backup", "--repo", str(repo), "--name", name, "--chunk-size", "64KiB", "--quiet", stdin=data)
    assert (result.code, result.out, result.stderr) == (0, "", ""), result.stderr
    listed = run_braid("list", "--repo", str(repo), "--name", name, "--json")
    return listed.out.split('"backup": "', 2)[1].split('"', 1)[0]


def test_scheduled_commands_are_silent_on_success(repo: Path) -> None:
    first = backup(repo, "db", os.urandom(200_000))
    backup(repo, "db", os.urandom(200_000))
    for args in (
        ["verify", "--all", "--deep"],
        ["forget", "--dry-run", first],
        ["prune", "--keep-last", "1"],
    ):
        result = run_braid(*args, "--repo", str(repo), "--quiet")
        assert (result.code, result.out, result.stderr) == (0, "", ""), (args, result.out, result.stderr)
    # --json still prints the document a script asked for.
    assert run_braid("verify", "--all", "--repo", str(repo), "--quiet", "--json").out.startswith("[")


def test_quiet_verify_still_says_what_failed(repo: Path) -> None:
    ref = backup(repo, "db", os.urandom(200_000))
    name, _, ident = ref.partition("@")
    chunk = repo / "data" / name / ident / "00000000000000000001"
    chunk = chunk if chunk.exists() else sorted(p for p in (repo / "data" / name / ident).iterdir() if p.is_file())[1]
    raw = bytearray(chunk.read_bytes())
    raw[-5] ^= 0x01
    chunk.write_bytes(bytes(raw))

    result = run_braid("verify", ref, "--deep", "--repo", str(repo), "--quiet")

    assert result.code == 6
    assert ref in result.out and "FAIL" in result.out.upper(), result.out
    assert result.stderr.splitlines()[-1].startswith("braid: error: 1 of 1 backup(s) failed verification"), result.stderr


def test_a_missing_id_of_an_existing_name_points_at_its_other_backups(repo: Path) -> None:
    ref = backup(repo, "db", os.urandom(1000))
    missing = ref[:-1] + ("0" if ref[-1] != "0" else "1")
    result = run_braid("forget", missing, "--repo", str(repo))
    assert (result.code, result.stderr.strip()) == (
        8,
        f"braid: error: backup {missing} not found in {repo}; db has 1 other backup(s): see 'braid list --name db'",
    )

