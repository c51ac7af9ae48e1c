"""`braid restore --pgdata` and the WAL facts of base backups, through the real CLI on synthetic pg_basebackup tars.

The tars are what pg_basebackup -Ft -D - writes (backup_label first,
backup_manifest last), made by tarfile with pax long names and cut into
small chunks, so members span chunk boundaries on both the backup and the
extraction side. The real PostgreSQL run is scripts/e2e-databases (its pitr part).
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from braid.cli.compose import open_key_service, open_repository
from braid.errors import IntegrityError
from braid.format.ids import BackupRef
from braid.format.layout import metadata_key
from braid.ops.metadata import read_backup_metadata
from braid.ops.recovery import restore_command
from braid.ports.progress import event_problems
from conftest import run_braid
from test_tar_stream import CONTROL, LABEL, LONG, PG_MANIFEST
from wal_segments import write_segment

pytestmark = pytest.mark.e2e


def base_backup(extra: int = 300_000, *, wal: bool = True) -> bytes:
    """A pg_basebackup-shaped tar: label, version, control, a long pax name, data across chunks, pg_wal, the manifest."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:

        def add(name: str, data: bytes | None, mode: int = 0o600) -> None:
            info = tarfile.TarInfo(name)
            info.mode = mode
            info.mtime = 1_700_000_000
            if data is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))

        add("backup_label", LABEL)
        add("tablespace_map", b"")
        for directory in ("base", "base/1", "global", "pg_wal", "pg_wal/archive_status"):
            add(directory, None, 0o700)
        add("PG_VERSION", b"15\n")
        add("global/pg_control", CONTROL)
        add("base/1/16384", bytes(range(256)) * (extra // 256))
        add(LONG, b"long name")
        if wal:
            add("pg_wal/000000010000000000000009", b"\x01" * 70_000)
        add("backup_manifest", PG_MANIFEST)
    return out.getvalue()


def backup(repo: Path, data: bytes, *extra: str) -> str:
    result = run_braid("backup", "--repo", str(repo), "--name", "pg", "--chunk-size", "64KiB", "--quiet", "--json", *extra, stdin=data)
    assert result.code == 0, result.stderr
    return str(json.loads(result.out)["backup"])


def test_base_backup_records_its_wal_and_restores_into_a_data_directory(repo: Path, tmp_path: Path) -> None:
    data = base_backup()
    ref = backup(repo, data)
    shown = json.loads(run_braid("show", "--repo", str(repo), ref, "--json").out)
    assert shown["wal"]["start_lsn"] == "0/9000028" and shown["wal"]["stop_lsn"] == "0/A000000"
    assert shown["wal"]["system_identifier"] == 7441122334455667788 and shown["wal"]["pg_version"] == 15 and shown["wal"]["timeline"] == 1
    assert shown["metadata"]["backup_manifest"]["length"] == len(PG_MANIFEST)
    listed = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert listed[0]["wal"]["stop_wal"] == "000000010000000000000009"
    assert "1 0/9000028..0/A000000" in run_braid("list", "--repo", str(repo)).out

    target = tmp_path / "restored"
    result = run_braid("restore", "--repo", str(repo), ref, "--pgdata", str(target), "--target-name", "before-delete", "--target-action", "promote", "--workers", "3", "--json")
    assert result.code == 0, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert [p for e in events for p in event_problems(e)] == [] and events[-1]["event"] == "done"
    document = json.loads(result.out)
    assert document["pgdata"] == str(target) and document["target"] == {"name": "before-delete"} and document["wal"]["timeline"] == 1
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    expected = tmp_path / "expected"
    expected.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.extractall(expected, filter="tar")
    for path in expected.rglob("*"):
        twin = target / path.relative_to(expected)
        assert twin.is_dir() == path.is_dir(), path
        if path.is_file():
            assert twin.read_bytes() == path.read_bytes(), path
            assert stat.S_IMODE(twin.stat().st_mode) == 0o600 and int(twin.stat().st_mtime) == 1_700_000_000
    assert (target / "recovery.signal").exists()
    conf = (target / "postgresql.auto.conf").read_text()
    braid = str(Path(sys.executable).parent / "braid")
    # The fast path's spool is in pg_wal (the file system of %p), this user's; else the same wal-fetch runs. Both name
    # it relative to the data directory (PostgreSQL's working directory), so the directory may be moved.
    box = next((target / "pg_wal" / ".braid-prefetch").glob("fetch-pg-*"))
    assert stat.S_IMODE(box.stat().st_mode) == 0o700 and box.stat().st_uid == os.geteuid()
    root = "pg_wal/.braid-prefetch"
    command = restore_command([braid], str(repo), "pg", None, (root, f"{root}/{box.name}"))
    assert document["restore_command"] == command and f" exec {braid} wal-fetch --repo {repo} --name pg --spool {root} %f %p" in command
    assert command.startswith(f"f=%f s={root}/fetch-pg-") and str(target) not in command
    assert f"restore_command = '{command}'" in conf and conf.rstrip().endswith("recovery_target_action = 'promote'")
    assert "recovery_target_name = 'before-delete'" in conf


def test_the_captured_backup_manifest_is_encrypted_and_authenticated(repo: Path) -> None:
    ref = backup(repo, base_backup())
    repository = open_repository(str(repo))
    keys = open_key_service(repository, None)
    assert read_backup_metadata(repository, ref, "backup_manifest", keys) == PG_MANIFEST
    stored = repo / metadata_key(BackupRef.parse(ref), "backup_manifest")
    assert b"WAL-Ranges" not in stored.read_bytes()
    raw = bytearray(stored.read_bytes())
    raw[-1] ^= 1
    stored.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match="does not match its manifest entry"):
        read_backup_metadata(repository, ref, "backup_manifest", keys)
    deep = run_braid("verify", "--repo", str(repo), ref, "--deep")
    assert deep.code == 6 and "backup_manifest of backup " in deep.stdout.decode() + deep.stderr


def test_latest_with_a_target_time_picks_the_newest_backup_that_ended_before_it(repo: Path, tmp_path: Path) -> None:
    first = backup(repo, base_backup())
    shown = json.loads(run_braid("show", "--repo", str(repo), first, "--json").out)
    between = shown["completed"].replace("T", " ").replace("Z", "+00")
    backup(repo, base_backup())
    result = run_braid("restore", "--repo", str(repo), "pg@latest", "--pgdata", str(tmp_path / "d"), "--target-time", between, "--json")
    assert result.code == 0, result.stderr
    assert json.loads(result.out.splitlines()[-1])["backup"] == first
    early = run_braid("restore", "--repo", str(repo), "pg@latest", "--pgdata", str(tmp_path / "e"), "--target-time", "2001-01-01 00:00:00+00")
    assert early.code == 8 and "no backup of pg ended before 2001-01-01" in early.stderr
    assert not (tmp_path / "e").exists()


def test_refusals_write_nothing(repo: Path, tmp_path: Path) -> None:
    ref = backup(repo, base_backup())
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("mine")
    result = run_braid("restore", "--repo", str(repo), ref, "--pgdata", str(full))
    assert result.code == 2 and f"--pgdata {full} is not empty" in result.stderr
    assert [p.name for p in full.iterdir()] == ["keep"]

    running = tmp_path / "running"
    running.mkdir()
    server = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (running / "postmaster.pid").write_text(f"{server.pid}\n{running}\n")
        result = run_braid("restore", "--repo", str(repo), ref, "--pgdata", str(running))
        assert result.code == 2 and f"holds the postmaster.pid of a running server (pid {server.pid})" in result.stderr
    finally:
        server.communicate(b"")
    assert [p.name for p in running.iterdir()] == ["postmaster.pid"]

    empty = tmp_path / "empty"
    cases = [
        (["--target-lsn", "12345"], "--target-lsn '12345' is not an LSN"),
        (["--target-xid", "x1"], "--target-xid 'x1' is not a transaction id"),
        (["--target-time", "yesterday"], "--target-time 'yesterday' is not a time Braid can compare"),
        (["--target-action", "promote"], "--target-action needs a target"),
        (["--target-lsn", "0/1", "--target-name", "a"], "not allowed with argument"),
        (["--target-timeline", "newest", "--target-name", "a"], "--target-timeline must be latest, current or a timeline number"),
        (["--output", str(tmp_path / "x")], "--pgdata extracts the backup itself"),
        (["--force"], "--pgdata never overwrites"),
    ]
    for extra, message in cases:
        result = run_braid("restore", "--repo", str(repo), ref, "--pgdata", str(empty), *extra)
        assert result.code == 2 and message in result.stderr, (extra, result.stderr)
        assert not empty.exists()
    result = run_braid("restore", "--repo", str(repo), ref, "--target-lsn", "0/1", "--output", str(tmp_path / "x"))
    assert result.code == 2 and "--target-* options need --pgdata DIR" in result.stderr


def test_a_backup_that_is_not_one_tar_is_refused_and_leaves_the_directory_as_found(repo: Path, tmp_path: Path) -> None:
    dump = run_braid("backup", "--repo", str(repo), "--name", "dump", "--quiet", "--json", stdin=b"-- PostgreSQL dump\n" * 5000)
    assert dump.code == 0, dump.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_braid("restore", "--repo", str(repo), "dump@latest", "--pgdata", str(empty))
    assert result.code == 6 and "not a tar PostgreSQL can start from" in result.stderr
    assert list(empty.iterdir()) == []
    (tmp_path / "a").write_bytes(base_backup())
    (tmp_path / "b").write_bytes(base_backup())
    two = run_braid("backup", "--repo", str(repo), "--name", "two", "--input", str(tmp_path / "a"), "--input", str(tmp_path / "b"), "--quiet")
    assert two.code == 0, two.stderr
    result = run_braid("restore", "--repo", str(repo), "two@latest", "--pgdata", str(tmp_path / "new"))
    assert result.code == 2 and "has 2 inputs; --pgdata restores one pg_basebackup -Ft -D - stream" in result.stderr
    assert not (tmp_path / "new").exists()


def test_a_tar_escaping_the_data_directory_is_refused(repo: Path, tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        info = tarfile.TarInfo("../escape")
        info.size = 3
        archive.addfile(info, io.BytesIO(b"bad"))
    ref = run_braid("backup", "--repo", str(repo), "--name", "evil", "--quiet", stdin=out.getvalue())
    assert ref.code == 0, ref.stderr
    result = run_braid("restore", "--repo", str(repo), "evil@latest", "--pgdata", str(tmp_path / "d"))
    assert result.code == 6 and "not a path inside the data directory" in result.stderr
    assert not (tmp_path / "escape").exists() and not (tmp_path / "d").exists()


def test_a_backup_without_its_wal_is_published_only_once_the_range_is_archived(repo: Path, tmp_path: Path) -> None:
    result = run_braid("backup", "--repo", str(repo), "--name", "pg", "--wal-wait", "0", "--quiet", stdin=base_backup(wal=False))
    assert result.code == 11, result.stderr
    assert "carries no WAL (pg_basebackup -X none)" in result.stderr and "missing 000000010000000000000009; nothing was published" in result.stderr
    assert run_braid("list", "--repo", str(repo), "--json").out.strip() == "[]"
    assert not [p for p in (repo / "data").rglob("*") if p.is_file()]
    segment = write_segment(tmp_path, "000000010000000000000009", size=16 << 20)
    pushed = run_braid("wal-push", "--repo", str(repo), "--name", "pg", str(segment))
    assert pushed.code == 0, pushed.stderr
    result = run_braid("backup", "--repo", str(repo), "--name", "pg", "--wal-wait", "0", "--quiet", stdin=base_backup(wal=False))
    assert result.code == 0, result.stderr
    assert len(json.loads(run_braid("list", "--repo", str(repo), "--json").out)) == 1


def test_links_are_made_and_a_path_through_an_archived_symlink_is_refused(repo: Path, tmp_path: Path) -> None:
    def archive(*extra: tarfile.TarInfo) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            info = tarfile.TarInfo("a")
            info.size = 5
            tar.addfile(info, io.BytesIO(b"hello"))
            for member in extra:
                tar.addfile(member)
        return out.getvalue()

    def link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, target
        return info

    ok = run_braid("backup", "--repo", str(repo), "--name", "links", "--quiet", stdin=archive(link("b", "a", tarfile.LNKTYPE), link("s", "a", tarfile.SYMTYPE)))
    assert ok.code == 0, ok.stderr
    result = run_braid("restore", "--repo", str(repo), "links@latest", "--pgdata", str(tmp_path / "d"))
    assert result.code == 0, result.stderr
    assert (tmp_path / "d" / "b").read_bytes() == b"hello" and os.readlink(tmp_path / "d" / "s") == "a"
    through = tarfile.TarInfo("out/evil")
    through.size = 0
    bad = run_braid("backup", "--repo", str(repo), "--name", "through", "--quiet", stdin=archive(link("out", str(tmp_path), tarfile.SYMTYPE), through))
    assert bad.code == 0, bad.stderr
    result = run_braid("restore", "--repo", str(repo), "through@latest", "--pgdata", str(tmp_path / "e"))
    assert result.code == 6 and "leads through a symlink it made" in result.stderr
    assert not (tmp_path / "evil").exists() and not (tmp_path / "e").exists()


def test_a_chunk_found_corrupt_mid_extraction_leaves_the_directory_as_found(repo: Path, tmp_path: Path) -> None:
    ref = backup(repo, base_backup(extra=600_000))
    chunks = sorted(p for p in (repo / "data" / "pg").rglob("*") if p.is_file() and p.name.isdigit())
    assert len(chunks) >= 4
    raw = bytearray(chunks[-2].read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # inside its ciphertext: it fails authentication when decoded, after earlier chunks were written
    chunks[-2].write_bytes(bytes(raw))
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_braid("restore", "--repo", str(repo), ref, "--pgdata", str(empty), "--workers", "1")
    assert result.code == 6 and "failed authentication" in result.stderr, result.stderr
    assert list(empty.iterdir()) == []
    result = run_braid("restore", "--repo", str(repo), ref, "--pgdata", str(tmp_path / "new"), "--workers", "1")
    assert result.code == 6 and not (tmp_path / "new").exists()
