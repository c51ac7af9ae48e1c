"""The real CLI as a subprocess: what a DBA's scripts see (bytes, exit codes, one-line errors)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import BRAID, run_braid

pytestmark = pytest.mark.e2e
CHUNK = "64KiB"


def stream(size: int, seed: int = 0) -> bytes:
    """Database-like: compressible rows with random runs in between."""
    rows = b"".join(b"%08d|customer-%d|%d.%02d\n" % (i, (i * 7 + seed) % 977, i % 999, i % 100) for i in range(size // 24 + 1))
    noise = os.urandom(size // 4)
    mixed = bytearray()
    for a in range(0, size, 40000):
        mixed += rows[a : a + 30000] + noise[a // 4 : a // 4 + 10000]
    return bytes(mixed[:size])


def backup(repo: Path, data: bytes, name: str = "db") -> str:
    empty = [] if data else ["--allow-empty"]  # an empty stream is refused unless asked for (tests/test_producer.py)
    result = run_braid("backup", "--repo", str(repo), "--name", name, "--chunk-size", CHUNK, *empty, stdin=data)
    assert result.code == 0, result.stderr
    return result.out.strip()


@pytest.mark.parametrize("size", [0, 1, 65536, 65536 * 3 + 777], ids=["empty", "one-byte", "one-chunk", "mid-chunk"])
def test_stdin_backup_restore_round_trip(repo: Path, size: int) -> None:
    data = stream(size)
    backup_id = backup(repo, data)
    assert backup_id.startswith("db@")
    restored = run_braid("restore", "--repo", str(repo), backup_id)
    assert restored.code == 0, restored.stderr
    assert restored.stdout == data


def test_progress_is_json_lines_on_stderr_when_not_a_tty(repo: Path) -> None:
    result = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK, stdin=stream(300000))
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert events[-1]["event"] == "done" and events[-1]["plaintext_bytes"] == 300000
    assert result.out.strip() == events[-1]["backup"]


def feed_pipes(paths: list[Path], payloads: list[bytes]) -> list[threading.Thread]:
    def write(path: Path, payload: bytes) -> None:
        with open(path, "wb") as handle:
            handle.write(payload)

    threads = [threading.Thread(target=write, args=(p, d), daemon=True) for p, d in zip(paths, payloads, strict=True)]
    for thread in threads:
        thread.start()
    return threads


@pytest.mark.parametrize("sizes", [[300000, 70001], [200000, 1, 131072]], ids=["two-pipes", "three-pipes"])
def test_named_pipes_in_and_out(repo: Path, tmp_path: Path, sizes: list[int]) -> None:
    payloads = [stream(s, seed=i) for i, s in enumerate(sizes)]
    pipes = [tmp_path / f"p{i}" for i in range(len(sizes))]
    for pipe in pipes:
        os.mkfifo(pipe)
    args = [arg for p in pipes for arg in ("--input", str(p))]
    proc = subprocess.Popen([str(BRAID), "backup", "--repo", str(repo), "--name", "multi", "--chunk-size", CHUNK, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    writers = feed_pipes(pipes, payloads)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    for writer in writers:
        writer.join(5)
    backup_id = out.decode().strip()

    shown = json.loads(run_braid("show", "--repo", str(repo), "--json", backup_id).out)
    assert [d["bytes"] for d in shown["input_details"]] == sizes
    assert [d["source"] for d in shown["input_details"]] == [str(p) for p in pipes]

    outs = [tmp_path / f"r{i}" for i in range(len(sizes))]
    for pipe in outs:
        os.mkfifo(pipe)
    received: dict[int, bytes] = {}

    def read(i: int) -> None:
        with open(outs[i], "rb") as handle:
            received[i] = handle.read()

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in reversed(range(len(sizes)))]
    for reader in readers:
        reader.start()
    result = run_braid("restore", "--repo", str(repo), "multi@latest", *[a for o in outs for a in ("--output", str(o))])
    assert result.code == 0, result.stderr
    for reader in readers:
        reader.join(10)
    assert [received[i] for i in range(len(sizes))] == payloads


def test_restore_needs_one_output_per_input(repo: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 1000)
    b.write_bytes(b"y" * 10)
    result = run_braid("backup", "--repo", str(repo), "--name", "two", "--input", str(a), "--input", str(b))
    assert result.code == 0, result.stderr
    to_stdout = run_braid("restore", "--repo", str(repo), "two@latest")
    assert to_stdout.code == 2 and "has 2 inputs; give 2 --output paths" in to_stdout.stderr
    assert to_stdout.stdout == b""


def test_latest_picks_the_newest_backup_of_that_name(repo: Path) -> None:
    backup(repo, b"first", "db")
    second = backup(repo, b"second", "db")
    backup(repo, b"other", "other")
    assert run_braid("restore", "--repo", str(repo), "db@latest").stdout == b"second"
    listing = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert [row["name"] for row in listing] == ["db", "db", "other"]
    assert listing[1]["backup"] == second


def test_repo_and_key_from_environment(repo: Path, tmp_path: Path) -> None:
    key_files = list((tmp_path / "xdg-config" / "braid" / "keys").glob("*.key"))
    assert len(key_files) == 1
    env = {"BRAID_REPO": str(repo), "BRAID_KEY_FILE": str(key_files[0]), "XDG_CONFIG_HOME": str(tmp_path / "elsewhere")}
    result = run_braid("backup", "--name", "envdb", stdin=b"hello", env=env)
    assert result.code == 0, result.stderr
    assert run_braid("restore", "envdb@latest", env=env).stdout == b"hello"


# -- failure paths: exit code and one clear line ------------------------------


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("braid: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_missing_pipe(repo: Path, tmp_path: Path) -> None:
    result = run_braid("backup", "--repo", str(repo), "--name", "db", "--input", str(tmp_path / "p1"))
    assert result.code == 5
    assert "p1 does not exist" in error_line(result.stderr)
    assert run_braid("list", "--repo", str(repo), "--json").out.strip() == "[]"


def test_nonexistent_repository(tmp_path: Path) -> None:
    result = run_braid("backup", "--repo", str(tmp_path / "nowhere"), "--name", "db", stdin=b"x")
    assert result.code == 3 and "does not exist: check the path (a typo?); only a new repository is made with 'braid init" in error_line(result.stderr)
    not_a_repo = tmp_path / "empty"
    not_a_repo.mkdir()
    result = run_braid("list", "--repo", str(not_a_repo))
    assert result.code == 3 and "no Braid repository" in error_line(result.stderr)


def test_a_mistyped_repository_path_names_the_repositories_beside_it(repo: Path) -> None:
    """Review dba-3 F14: a typo must not steer a DBA into a second repository with a second key; the real one is named."""
    typo = repo.parent / (repo.name + "x")
    result = run_braid("list", "--repo", str(typo))
    assert result.code == 3, result.stderr
    assert error_line(result.stderr).endswith(
        f"does not exist: check the path (a typo?); only a new repository is made with 'braid init --repo {typo}'; a repository nearby: {repo}"
    )
    assert not typo.exists()


def test_no_repository_given() -> None:
    result = run_braid("list")
    assert result.code == 2 and "BRAID_REPO" in error_line(result.stderr)


def test_wrong_key_file(repo: Path, tmp_path: Path) -> None:
    backup_id = backup(repo, b"secret rows")
    other_repo = tmp_path / "other"
    assert run_braid("init", "--repo", str(other_repo), "--key-file", str(tmp_path / "other.key")).code == 0
    result = run_braid("restore", "--repo", str(repo), "--key-file", str(tmp_path / "other.key"), backup_id)
    assert result.code == 4 and "wrong key file" in error_line(result.stderr)
    assert result.stdout == b""
    missing = run_braid("restore", "--repo", str(repo), "--key-file", str(tmp_path / "none.key"), backup_id)
    assert missing.code == 4 and "not found" in error_line(missing.stderr)


def test_init_refuses_existing_repository_and_keeps_key(repo: Path, tmp_path: Path) -> None:
    result = run_braid("init", "--repo", str(repo))
    repository_id = json.loads((repo / "config.json").read_text())["id"]
    assert result.code == 2 and f"{repo} is already a Braid repository (id {repository_id})" in error_line(result.stderr)
    key = tmp_path / "shared.key"
    assert run_braid("init", "--repo", str(tmp_path / "r1"), "--key-file", str(key)).code == 0
    before = key.read_bytes()
    assert run_braid("init", "--repo", str(tmp_path / "r2"), "--key-file", str(key)).code == 0
    assert key.read_bytes() == before


def chunk_files(repo: Path) -> list[Path]:
    return sorted(p for p in (repo / "data").rglob("*") if p.is_file())


def test_corrupt_chunk_restore_writes_nothing_unverified(repo: Path, tmp_path: Path) -> None:
    data = stream(65536 * 4)
    backup_id = backup(repo, data)
    chunks = chunk_files(repo)
    assert len(chunks) == 4
    raw = bytearray(chunks[2].read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunks[2].write_bytes(bytes(raw))
    out = tmp_path / "restored"
    result = run_braid("restore", "--repo", str(repo), "--output", str(out), backup_id)
    assert result.code == 6
    assert f"chunk 2 of backup {backup_id}" in error_line(result.stderr)
    # Stronger than "only verified bytes": a failed restore leaves nothing under
    # the real name, and no partial file beside it (braid.ops.restore_output).
    assert not out.exists() and not Path(f"{out}.braid-partial").exists()

    quick = run_braid("verify", "--repo", str(repo), backup_id)
    assert quick.code == 6 and "chunk 2" in quick.out
    deep = run_braid("verify", "--repo", str(repo), "--deep", backup_id)
    assert deep.code == 6 and "chunk 2" in deep.out


def test_swapped_chunks_are_detected(repo: Path) -> None:
    backup_id = backup(repo, stream(65536 * 3))
    first, second = chunk_files(repo)[:2]
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    result = run_braid("restore", "--repo", str(repo), backup_id)
    assert result.code == 6 and "chunk 0" in error_line(result.stderr)
    assert result.stdout == b""


def test_tampered_manifest_is_refused(repo: Path) -> None:
    backup_id = backup(repo, b"rows" * 1000)
    manifest = next((repo / "manifests").rglob("*.json"))
    text = manifest.read_bytes().replace(b'"engine":"local"', b'"engine":"lokal"')
    manifest.write_bytes(text)
    result = run_braid("restore", "--repo", str(repo), backup_id)
    assert result.code == 6 and "manifest" in error_line(result.stderr)
    assert result.stdout == b""


def test_missing_manifest_means_no_backup(repo: Path) -> None:
    backup_id = backup(repo, b"rows" * 1000)
    next((repo / "manifests").rglob("*.json")).unlink()
    assert json.loads(run_braid("list", "--repo", str(repo), "--json").out) == []
    result = run_braid("restore", "--repo", str(repo), backup_id)
    assert result.code == 8 and "not found" in error_line(result.stderr)


def test_a_missing_backup_is_reported_before_a_missing_key(repo: Path, tmp_path: Path) -> None:
    backup(repo, b"rows" * 10)
    result = run_braid("restore", "--repo", str(repo), "--key-file", str(tmp_path / "none.key"), "other@latest")
    assert result.code == 8 and "no backups named 'other'" in error_line(result.stderr)
    deep = run_braid("verify", "--repo", str(repo), "--key-file", str(tmp_path / "none.key"), "--deep", "--all")
    assert deep.code == 4 and "none.key not found" in error_line(deep.stderr)
    assert deep.stdout == b""


def test_python_dash_m_runs_the_same_cli() -> None:
    proc = subprocess.run([str(BRAID.parent / "python"), "-m", "braid.cli", "--version"], capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.decode().startswith("braid ")
    assert proc.stdout == run_braid("--version").stdout


def test_verify_quick_deep_sample_and_all(repo: Path) -> None:
    backup(repo, stream(65536 * 5))
    backup(repo, stream(1000), "small")
    for args in (["--all"], ["--all", "--deep"], ["db@latest", "--deep", "--sample", "40"]):
        result = run_braid("verify", "--repo", str(repo), "--json", *args)
        assert result.code == 0, result.stderr
        reports = json.loads(result.out)
        assert all(r["ok"] for r in reports)
    sampled = json.loads(run_braid("verify", "--repo", str(repo), "--json", "--deep", "--sample", "40", "db@latest").out)[0]
    assert sampled["chunks_checked"] == 2 and sampled["chunks_total"] == 5


@pytest.mark.parametrize(
    "args,needle",
    [
        (["backup", "--name", "bad name"], "invalid backup name"),
        (["backup", "--name", "db", "--chunk-size", "12 parsecs"], "invalid size"),
        (["backup", "--name", "db", "--chunk-size", "1"], "--chunk-size must be between"),
        (["restore", "db"], "expected NAME@ID"),
        (["verify", "--sample", "0", "--all"], "--sample must be"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors(repo: Path, args: list[str], needle: str) -> None:
    result = run_braid(*args, "--repo", str(repo))
    assert result.code == 2
    assert needle in error_line(result.stderr)


def test_help_documents_exit_codes() -> None:
    result = run_braid("--help")
    assert result.code == 0
    for code in ("0", "2", "3", "4", "5", "6", "7", "8"):
        assert f"\n  {code:>3}  " in result.out


def test_debug_shows_traceback(tmp_path: Path) -> None:
    result = run_braid("list", "--repo", str(tmp_path / "none"), "--debug")
    assert result.code == 3 and "Traceback" in result.stderr


def test_init_refuses_a_key_file_inside_the_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    result = run_braid("init", "--repo", str(repo), "--key-file", str(repo / "master.key"))
    assert result.code == 2 and "inside the repository" in error_line(result.stderr)
    assert not repo.exists()


def test_stdin_on_a_terminal_is_refused_rather_than_waited_on(repo: Path) -> None:
    import pty

    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run([str(BRAID), "backup", "--repo", str(repo), "--name", "db"], stdin=terminal, capture_output=True, timeout=30)
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == 5
    assert "stdin is a terminal" in error_line(proc.stderr.decode())


def test_restore_to_a_terminal_is_refused(repo: Path) -> None:
    import pty

    backup_id = backup(repo, b"rows" * 100)
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run([str(BRAID), "restore", "--repo", str(repo), backup_id], stdout=terminal, stderr=subprocess.PIPE, timeout=30)
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == 2
    assert error_line(proc.stderr.decode()) == (  # not "| pg_restore": a pg_basebackup -Ft tar is restored with tar -x
        "braid: error: stdout is a terminal: redirect the restore (> FILE), give --output PATH, or give the command that reads it after --"
        " (a pg_basebackup -Ft tar: -- tar -x -C DIR)"
    )


@pytest.mark.parametrize(
    "args",
    [["--concurrency", "4"], ["--fan-out", "10"], ["--no-wait"], ["--stall-timeout", "60"]],
)
def test_cloud_options_on_a_local_repository_are_refused(repo: Path, args: list[str]) -> None:
    result = run_braid("backup", "--repo", str(repo), "--name", "db", *args, stdin=b"rows")
    assert result.code == 2 and f"{args[0]} applies only to s3:// repositories" in error_line(result.stderr)
    assert json.loads(run_braid("list", "--repo", str(repo), "--json").out) == []


def test_resume_on_a_local_repository_is_refused(repo: Path) -> None:
    result = run_braid("backup", "--repo", str(repo), "--resume", "db@20261123T010203.456Z-1a2b3c4d", stdin=b"rows")
    assert result.code == 2 and "--resume applies only to s3:// repositories" in error_line(result.stderr)


# -- format version 2 (docs/format.md, Packs): an earlier repository or manifest is refused, never read --------------


def test_a_version_1_repository_is_refused_naming_both_versions(repo: Path) -> None:
    config = repo / "config.json"
    doc = json.loads(config.read_text())
    assert doc["version"] == 2
    config.chmod(0o644)
    config.write_text(json.dumps({**doc, "version": 1}, indent=2, sort_keys=True) + "\n")
    result = run_braid("list", "--repo", str(repo))
    assert result.code == 3
    assert "config.json is repository format v1; this Braid reads v2 only (earlier repositories are not read" in result.stderr, result.stderr


def test_a_version_1_manifest_is_refused_naming_both_versions(repo: Path, tmp_path: Path) -> None:
    from braid.cli.compose import open_key_service, open_repository
    from braid.format.canonical import canonical_json
    from braid.format.ids import BackupRef
    from braid.format.layout import manifest_key
    from braid.format.manifest import open_manifest, seal_body
    from braid.ops.open import open_backup

    ref = backup(repo, b"v" * 10_000)
    repository = open_repository(str(repo))
    key = open_backup(repository, BackupRef.parse(ref), open_key_service(repository, None, unwrap_only=True)).key
    stored = repo / manifest_key(BackupRef.parse(ref))
    doc = json.loads(open_manifest(stored.read_bytes(), "manifest").body)
    doc["version"] = 1  # as a version-1 Braid wrote it: no pack fields, authentic under the backup's key
    for entry in doc["inputs"]:
        for chunk in entry["chunks"]:
            del chunk["pack"], chunk["pack_offset"]
    body = canonical_json(doc)
    stored.chmod(0o644)
    stored.write_bytes(seal_body(body, key.manifest_mac(body)))
    result = run_braid("restore", "--repo", str(repo), ref, "--output", str(tmp_path / "out"))
    assert result.code == 6 and not (tmp_path / "out").exists()
    assert "unsupported manifest format braid-manifest v1; this Braid reads braid-manifest v2 and v3 only (earlier versions are not read)" in result.stderr, result.stderr
