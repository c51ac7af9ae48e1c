"""The bad-input table: each input that used to be mishandled, with its exit code and its one line.

Every case runs the real CLI (run_braid) and asserts both the code and the
message, so a wrong code with a plausible message (or the reverse) fails.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from moto import mock_aws

from braid.adapters.aws.s3 import S3Store
from braid.adapters.local.store import LocalStore
from braid.cli.budget import check_backup_memory
from braid.cli.progress import Progress
from braid.engine.memory import check_memory, local_backup_buffers, machine_memory, restore_buffers
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.format.layout import chunk_key, lease_key
from braid.format.lease import LeaseRecord
from braid.format.repository import Repository, RepositoryConfig
from braid.format.staging import SessionRecord, StagingArea, StreamEnd, segment_key
from braid.format.timestamps import format_timestamp, utc_now
from braid.ops.incomplete import incomplete_backups
from conftest import BRAID, Result, run_braid

pytestmark = pytest.mark.e2e
MiB = 1024**2


def error_line(stderr: str) -> str:
    """The one `braid: error:` line (progress lines may precede it)."""
    (line,) = [line for line in stderr.splitlines() if line.startswith("braid: error:")]
    return line


def backup(repo: Path, data: bytes, name: str = "db", chunk: str = "4KiB") -> str:
    result = run_braid("backup", "--repo", str(repo), "--name", name, "--chunk-size", chunk, stdin=data)
    assert result.code == 0, result.stderr
    return result.out.strip()


def chunk_files(repo: Path, ref: str) -> list[Path]:
    name, _, ident = ref.partition("@")
    return sorted((repo / "data" / name / ident).glob("[0-9]" * 10))


# -- names and ids: full matches only ---------------------------------------------------


def test_a_backup_name_with_a_trailing_newline_is_refused(repo: Path) -> None:
    result = run_braid("backup", "--repo", str(repo), "--name", "nl\n", stdin=b"rows")
    assert result.code == 2
    assert error_line(result.stderr) == (
        "braid: error: invalid backup name 'nl\\n': use 1-48 letters, digits, '.', '_' or '-', starting with a letter or digit"
    )
    assert not (repo / "manifests").exists() or not any((repo / "manifests").iterdir())
    assert not (repo / "data").exists() or not any((repo / "data").iterdir())


def test_list_with_a_newline_name_is_refused(repo: Path) -> None:
    result = run_braid("list", "--repo", str(repo), "--name", "db\n")
    assert result.code == 2
    assert "invalid backup name 'db\\n'" in error_line(result.stderr)


def test_restore_of_an_id_with_a_trailing_newline_is_refused(repo: Path) -> None:
    ref = backup(repo, b"rows" * 100)
    result = run_braid("restore", "--repo", str(repo), ref + "\n")
    assert result.code == 2
    assert error_line(result.stderr).startswith(f"braid: error: invalid backup id '{ref.partition('@')[2]}\\n' in ")
    assert result.stdout == b""
    named = run_braid("restore", "--repo", str(repo), "db\n@latest")
    assert named.code == 2 and "invalid backup name 'db\\n'" in error_line(named.stderr)


def test_list_of_a_path_like_name_is_a_usage_error(repo: Path) -> None:
    result = run_braid("list", "--repo", str(repo), "--name", "../x")
    assert result.code == 2
    assert "invalid backup name '../x'" in error_line(result.stderr)


# -- key file ----------------------------------------------------------------------------


def test_a_directory_as_key_file_is_a_key_error(repo: Path, tmp_path: Path) -> None:
    directory = tmp_path / "keys-dir"
    directory.mkdir()
    result = run_braid("backup", "--repo", str(repo), "--name", "db", "--key-file", str(directory), stdin=b"rows")
    assert result.code == 4
    assert error_line(result.stderr) == (
        f"braid: error: key file {directory} is a directory; give the master-key file itself (--key-file or BRAID_KEY_FILE)"
    )
    ref = backup(repo, b"rows")
    restored = run_braid("restore", "--repo", str(repo), "--key-file", str(directory), ref)
    assert restored.code == 4 and "is a directory" in error_line(restored.stderr)


# -- prune numbers -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "unit"),
    [("--keep-days", "nan", "days"), ("--keep-days", "inf", "days"), ("--keep-days", "1e12", "days"), ("--orphan-grace-hours", "nan", "hours")],
)
def test_prune_refuses_numbers_no_clock_can_use(repo: Path, flag: str, value: str, unit: str) -> None:
    backup(repo, b"rows")
    args = ["--keep-last", "1", flag, value] if flag != "--keep-days" else [flag, value]
    result = run_braid("prune", "--repo", str(repo), *args)
    assert result.code == 2
    assert f"argument {flag}: must be a number of {unit} from 0 to " in error_line(result.stderr)
    assert f"not '{value}'" in error_line(result.stderr)
    assert len(list((repo / "manifests").rglob("*.json"))) == 1  # nothing was pruned


# -- unreadable repository and chunks (a real EACCES) -------------------------------------


def run_unprivileged(*args: str) -> Result:
    """The CLI without the power to ignore file permissions.

    Tests run as root here, and root reads a mode-000 file anyway; dropping
    CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set (setpriv)
    makes the kernel check permissions for this process as for anyone else,
    so the CLI meets a real EACCES. As another user it needs nothing.
    """
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot make a permission error happen")
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]
    proc = subprocess.run([*prefix, str(BRAID), *args], input=b"", capture_output=True, env=dict(os.environ), timeout=120)
    return Result(proc.returncode, proc.stdout, proc.stderr.decode())


@pytest.fixture
def locked() -> Iterator[list[Path]]:
    """Paths chmod'ed to 000 by a test, given their modes back afterwards so tmp_path can be removed."""
    paths: list[Path] = []
    yield paths
    for path in paths:
        path.chmod(0o700)


def test_an_unreadable_repository_is_exit_3(repo: Path, locked: list[Path]) -> None:
    backup(repo, b"rows")
    (repo / "config.json").chmod(0o000)
    locked.append(repo / "config.json")
    result = run_unprivileged("list", "--repo", str(repo))
    assert result.code == 3
    assert error_line(result.stderr) == (
        f"braid: error: repository {repo} is unreadable: permission denied while reading {repo / 'config.json'}: fix its owner or mode (a run as another user?)"
    )
    repo.chmod(0o000)
    locked.append(repo)
    result = run_unprivileged("verify", "--repo", str(repo), "--all")
    assert result.code == 3 and f"repository {repo} is unreadable" in error_line(result.stderr)


def test_a_repository_behind_an_unsearchable_directory_is_unreadable_not_missing(repo: Path, locked: list[Path]) -> None:
    repo.parent.chmod(0o000)
    locked.append(repo.parent)
    result = run_unprivileged("list", "--repo", str(repo))
    assert result.code == 3
    assert error_line(result.stderr) == f"braid: error: repository {repo} is unreadable: Permission denied"


def test_a_file_as_repository_is_not_a_directory(tmp_path: Path) -> None:
    plain = tmp_path / "repo-file"
    plain.write_bytes(b"not a repository")
    result = run_braid("list", "--repo", str(plain))
    assert result.code == 3
    assert error_line(result.stderr) == f"braid: error: repository {plain} is not a directory"


def test_an_unreadable_manifest_directory_is_a_storage_error_not_an_empty_list(repo: Path, locked: list[Path]) -> None:
    backup(repo, b"rows")
    (repo / "manifests").chmod(0o000)
    locked.append(repo / "manifests")
    result = run_unprivileged("list", "--repo", str(repo))
    assert result.code == 7
    assert error_line(result.stderr) == f"braid: error: permission denied while listing {repo / 'manifests'}: fix its owner or mode (a run as another user?)"


@pytest.mark.parametrize("mode", ["quick", "deep"])
def test_verify_of_an_unreadable_chunk_is_a_storage_error(repo: Path, locked: list[Path], mode: str) -> None:
    ref = backup(repo, os.urandom(3 * 4096))
    chunk = chunk_files(repo, ref)[1]
    chunk.chmod(0o000)
    locked.append(chunk)
    result = run_unprivileged("verify", "--repo", str(repo), ref, *(["--deep"] if mode == "deep" else []))
    assert result.code == 7
    assert error_line(result.stderr) == (
        f"braid: error: 1 of 1 backup(s) could not be verified; first: permission denied while reading {chunk}:"
        " fix its owner or mode (a run as another user?)"
    )
    assert f"{ref}: FAILED ({mode}, 2/3 chunks)" in result.out
    # A permissions problem is not a failed check: nothing is recorded, so list never shows the backup as FAILED.
    assert f"{ref} was not verified, and no result was recorded" in result.stderr
    assert not (repo / "verify").exists()


# -- chunk diagnosis and report order ---------------------------------------------------


def test_a_flipped_bit_in_a_chunk_headers_index_is_failed_authentication(repo: Path) -> None:
    ref = backup(repo, os.urandom(3 * 4096))
    chunk = chunk_files(repo, ref)[1]
    raw = bytearray(chunk.read_bytes())
    raw[11] ^= 0x01  # chunk index: big-endian u32 at offset 8; 1 -> 0, the index of another chunk
    chunk.write_bytes(bytes(raw))
    result = run_braid("restore", "--repo", str(repo), ref)
    assert result.code == 6
    assert error_line(result.stderr) == (
        f"braid: error: chunk 1 of backup {ref}: failed authentication (corrupt, tampered, or a different key);"
        f" check the backup with 'braid verify --deep {ref}', and restore an older one (braid list --name {ref.partition('@')[0]})"
    )
    assert "moved or swapped" not in result.stderr


def test_an_intact_chunk_in_the_wrong_place_is_moved_or_swapped(repo: Path) -> None:
    ref = backup(repo, os.urandom(3 * 4096))
    first, second = chunk_files(repo, ref)[:2]
    second.write_bytes(first.read_bytes())
    result = run_braid("restore", "--repo", str(repo), ref)
    assert result.code == 6
    assert f"chunk 1 of backup {ref}: stored chunk belongs to {ref} chunk 0 (input 0); chunks were moved or swapped" in error_line(result.stderr)


def test_verify_lists_failures_in_chunk_order(repo: Path) -> None:
    ref = backup(repo, os.urandom(12 * 4096))
    chunks = chunk_files(repo, ref)
    for index in (11, 2, 10):
        raw = bytearray(chunks[index].read_bytes())
        raw[-1] ^= 0xFF
        chunks[index].write_bytes(bytes(raw))
    result = run_braid("verify", "--repo", str(repo), ref, "--json")
    assert result.code == 6
    (report,) = json.loads(result.stdout)
    assert [f.split(":")[0] for f in report["failures"]] == [f"chunk {i} of backup {ref}" for i in (2, 10, 11)]
    assert report["unreadable"] == []
    assert error_line(result.stderr).startswith(f"braid: error: 1 of 1 backup(s) failed verification; first: chunk 2 of backup {ref}")


# -- memory bound ----------------------------------------------------------------------


def test_workers_beyond_memory_are_refused_with_the_figure(repo: Path) -> None:
    result = run_braid("backup", "--repo", str(repo), "--name", "db", "--workers", "100000", stdin=b"rows")
    assert result.code == 2
    line = error_line(result.stderr)
    assert line.startswith("braid: error: --workers 100000 with --chunk-size 16 MiB needs up to ")
    assert "(300002 x 16 MiB), more than this machine's " in line and line.endswith(" of memory: lower it")
    assert result.stdout == b""


def test_workers_above_half_of_memory_are_warned_about(repo: Path) -> None:
    memory = machine_memory()
    assert memory is not None
    chunk = 256 * MiB
    workers = next(w for w in range(1, 100_000) if local_backup_buffers(1, w) * chunk > memory // 2)
    if local_backup_buffers(1, workers) * chunk > memory:  # pragma: no cover - a machine with under ~2 GiB
        pytest.skip("this machine is too small for a setting between half and all of its memory at 256 MiB chunks")
    result = run_braid("backup", "--repo", str(repo), "--name", "db", "--workers", str(workers), "--chunk-size", "256MiB", stdin=b"rows")
    assert result.code == 0, result.stderr
    (warning,) = [line for line in result.stderr.splitlines() if line.startswith("braid: warning:")]
    assert warning.startswith(f"braid: warning: --workers {workers} with --chunk-size 256 MiB may use up to ")
    assert warning.endswith(" of memory")


def test_restore_and_cloud_bounds_name_the_option_to_lower() -> None:
    # Restore holds a stored chunk per decoding thread and plaintext chunks read ahead of each output;
    # a small backup bounds both, however many --workers: threads start only as chunks need them.
    assert restore_buffers(outputs=1, workers=4, chunks=1000) > 4
    assert restore_buffers(outputs=1, workers=1000, chunks=3) <= 2 * 3
    with pytest.raises(UsageError, match=r"--workers 64 needs up to 4.0 GiB of chunk buffers \(64 x 64 MiB\), more than this machine's 1.0 GiB"):
        check_memory(64, 64 * MiB, "--workers 64", available=1024**3)
    assert "more than half of this machine's 1.0 GiB" in (check_memory(9, 64 * MiB, "--workers 4", available=1024**3) or "")
    assert check_memory(4, 64 * MiB, "--workers 2", available=1024**3) is None
    with pytest.raises(UsageError, match=r"^--concurrency 100000 with --chunk-size 64 MiB needs up to "):
        check_backup_memory(cloud=True, inputs=1, chunk_size=64 * MiB, workers=1, concurrency=100000)


# -- list --incomplete ----------------------------------------------------------------------


def test_list_incomplete_shows_a_killed_local_backup(repo: Path) -> None:
    done = backup(repo, b"rows" * 100)
    agent = subprocess.Popen(
        [str(BRAID), "backup", "--repo", str(repo), "--name", "slow", "--chunk-size", "4KiB", "--workers", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert agent.stdin is not None
    agent.stdin.write(os.urandom(5 * 4096))
    agent.stdin.flush()
    deadline = time.monotonic() + 30
    while len(list((repo / "data" / "slow").glob("*/[0-9]*"))) < 3:
        assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()
        time.sleep(0.05)
    agent.send_signal(signal.SIGKILL)
    agent.communicate(timeout=30)
    (ident,) = [p.name for p in (repo / "data" / "slow").iterdir()]

    result = run_braid("list", "--repo", str(repo), "--incomplete", "--json")
    assert result.code == 0, result.stderr
    (found,) = json.loads(result.stdout)
    assert found["backup"] == f"slow@{ident}" and found["backup"] != done
    assert found["where"] == ["data"] and found["state"] == "abandoned"  # its pid is gone from this host
    assert found["pid"] == agent.pid and f"its process (pid {agent.pid} on {os.uname().nodename}) is gone; " in found["hint"]
    assert found["started"].startswith(f"{ident[0:4]}-{ident[4:6]}-{ident[6:8]}T{ident[9:11]}:{ident[11:13]}:{ident[13:15]}")
    assert found["objects"] >= 3 and found["stored_bytes"] >= 3 * 4096 and found["last_activity"] is not None
    assert "'braid prune' collects it once inactive for longer than --orphan-grace-hours" in found["hint"]

    table = run_braid("list", "--repo", str(repo), "--incomplete")
    assert table.code == 0
    header, row = table.out.splitlines()
    assert header.split()[:4] == ["BACKUP", "WHERE", "STATE", "STARTED"]
    assert row.startswith(f"slow@{ident}") and "'braid prune' collects it" in row
    listed = run_braid("list", "--repo", str(repo))
    assert listed.code == 0 and [line.split()[0] for line in listed.out.splitlines()[1:]] == [done]  # complete ones only


def test_list_incomplete_of_a_tidy_repository_is_empty(repo: Path) -> None:
    backup(repo, b"rows")
    result = run_braid("list", "--repo", str(repo), "--incomplete")
    assert (result.code, result.out, result.stderr.strip()) == (0, "", "no incomplete backups")
    assert json.loads(run_braid("list", "--repo", str(repo), "--incomplete", "--json").stdout) == []


def test_a_fresh_lease_is_a_running_backup_and_a_stale_one_abandoned(repo: Path) -> None:
    repository = Repository.open(LocalStore(repo))
    ref = BackupRef.new("db")
    refreshed = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    repository.store.put(chunk_key(ref, 0), b"chunk")
    repository.store.put(lease_key(ref), LeaseRecord(str(ref), format_timestamp(refreshed), "dbhost", 4242).to_bytes())

    (running,) = incomplete_backups(repository, now=refreshed + timedelta(seconds=30))
    assert (running.state, running.host, running.pid, running.objects) == ("running", "dbhost", 4242, 2)
    assert running.hint.startswith("running on dbhost (pid 4242); if that process is gone, 'braid prune' collects it")
    (stale,) = incomplete_backups(repository, now=datetime.now(UTC) + timedelta(hours=1))
    assert (stale.state, stale.host) == ("abandoned", "dbhost")
    assert stale.hint == "'braid prune' collects it once inactive for longer than --orphan-grace-hours (default 48)"


def test_a_folder_of_only_temporary_files_is_listed_incomplete(repo: Path) -> None:
    ref = BackupRef.new("db")
    folder = repo / "data" / "db" / ref.id
    folder.mkdir(parents=True)
    (folder / ".tmp-abc123").write_bytes(b"half a chunk")
    (found,) = incomplete_backups(Repository.open(LocalStore(repo)))
    assert (found.backup, found.state, found.objects, found.stored_bytes) == (str(ref), "abandoned", 1, 12)
    table = run_braid("list", "--repo", str(repo), "--incomplete")
    assert table.code == 0 and str(ref) in table.out


def test_list_incomplete_reads_cloud_staging_sessions(aws_env: None) -> None:
    """On S3 (moto): a session still uploading, one fully staged, and staging without a session."""
    with mock_aws():
        store = S3Store.from_url("s3://braid-incomplete/prod", region="us-east-1", sleep=lambda _: None)
        store.client.create_bucket(Bucket="braid-incomplete")
        config = RepositoryConfig.new({"type": "kms", "key_id": "k"}, utc_now(), {"stack": "Braid"})
        repository = Repository.create(store, config)
        uploading, staged, orphan = (BackupRef.new(name) for name in ("pg", "mysql", "db2"))
        for ref in (uploading, staged):
            session = SessionRecord(str(ref), config.id, 4 * MiB, 16, 3, ["/dev/stdin", "/tmp/pipe"], utc_now())
            StagingArea(store, ref).write_session(session)
            store.put(segment_key(ref, 0, 0), b"x" * 1000)
        StagingArea(store, staged).write_stream_end(StreamEnd([1000, 0], [1, 0]))
        store.put(f"staging/db2/{orphan.id}/results/0000000000.json", b"{}")

        found = {f.backup: f for f in incomplete_backups(repository)}
        assert set(found) == {str(uploading), str(staged), str(orphan)}
        up = found[str(uploading)]
        assert (up.where, up.state, up.inputs, up.staged_bytes) == (("staging",), "uploading", ("/dev/stdin", "/tmp/pipe"), 1000)
        assert up.hint == f"if its agent is gone, continue with 'braid backup --resume {uploading}' and the same inputs"
        assert up.last_activity is not None
        assert found[str(staged)].state == "processing" and f"braid status {staged}" in found[str(staged)].hint
        assert (found[str(orphan)].state, found[str(orphan)].staged_bytes) == ("abandoned", None)
        assert "'braid prune' collects it" in found[str(orphan)].hint
        assert [f.backup for f in incomplete_backups(repository, "pg")] == [str(uploading)]


# -- the cloud agent names its backup at once ------------------------------------------


@pytest.mark.parametrize("json_lines", [False, True], ids=["terminal", "json-lines"])
def test_a_started_cloud_backup_is_one_line_with_the_way_to_resume(json_lines: bool) -> None:
    """CloudEngine.run reports {"event": "started"} once the staging session exists (the emulated run checks that)."""
    stream = io.StringIO()
    with Progress("json" if json_lines else "bar", stream=stream) as progress:
        progress({"event": "started", "backup": "pg@20261123T010203.456Z-1a2b3c4d", "resumed": False})
    line = "braid: backup pg@20261123T010203.456Z-1a2b3c4d started; if interrupted, continue with 'braid backup --resume pg@20261123T010203.456Z-1a2b3c4d ...'"
    if json_lines:
        event = json.loads(stream.getvalue())
        assert (event["event"], event["backup"], event["message"]) == ("started", "pg@20261123T010203.456Z-1a2b3c4d", line)
    else:
        assert stream.getvalue().splitlines()[0] == line  # a line of its own, above the progress line
