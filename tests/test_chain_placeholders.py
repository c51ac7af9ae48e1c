"""{parent_manifest} and {parent_lsn} in an incremental's producer command, through the CLI: the values come from
what Braid captured from the parent's stream (a PostgreSQL tar's backup_manifest, a MariaDB xbstream's
xtrabackup_checkpoints), and a placeholder the parent lacks fails before the producer starts (exit 2)."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import pytest

from braid.engine.xbstream import XbstreamCapture, to_lsn
from conftest import run_braid

LABEL = b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nCHECKPOINT LOCATION: 0/2000060\nSTART TIMELINE: 1\n"
PG_MANIFEST = b'{ "PostgreSQL-Backup-Manifest-Version": 2, "Files": [], "WAL-Ranges": [{ "Timeline": 1, "Start-LSN": "0/2000028", "End-LSN": "0/2000100" }] }\n'


def _tar(path: Path) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("backup_label", LABEL), ("base/1/1234", b"x" * 5000), ("pg_wal/000000010000000000000002", b"w" * 4096), ("backup_manifest", PG_MANIFEST)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return path


def _restored(repo: Path, ref: str) -> bytes:
    result = run_braid("restore", "--repo", str(repo), ref)
    assert result.code == 0, result.stderr
    return result.stdout


def test_parent_manifest_is_a_private_copy_removed_afterwards(repo: Path, tmp_path: Path) -> None:
    full = run_braid("backup", "--repo", str(repo), "--name", "pg", "--", "cat", str(_tar(tmp_path / "base.tar")))
    assert full.code == 0, full.stderr
    script = 'cat "$1"; stat -c "%a %n" "$1" "$(dirname "$1")"'
    inc = run_braid("backup", "--repo", str(repo), "--name", "pg", "--incremental", "--", "sh", "-c", script, "sh", "{parent_manifest}")
    assert inc.code == 0, inc.stderr
    out = _restored(repo, inc.out.strip())
    assert out.startswith(PG_MANIFEST)
    modes = out[len(PG_MANIFEST):].decode().split("\n")
    assert modes[0].startswith("600 ") and modes[1].startswith("700 ")
    assert not Path(modes[0].split(" ", 1)[1]).exists()  # removed once the backup ended


@pytest.mark.skipif(shutil.which("mbstream") is None, reason="MariaDB's mbstream is not installed")
def test_parent_lsn_from_a_real_xbstream(repo: Path, tmp_path: Path) -> None:
    work = tmp_path / "mb"
    work.mkdir()
    (work / "ibdata1").write_bytes(b"\0" * 200_000)
    (work / "xtrabackup_checkpoints").write_text("backup_type = full-backuped\nfrom_lsn = 0\nto_lsn = 4767712\nlast_lsn = 4767712\n")
    full = run_braid("backup", "--repo", str(repo), "--name", "mdb", "--", "sh", "-c", f"cd {work} && mbstream -c ibdata1 xtrabackup_checkpoints")
    assert full.code == 0, full.stderr
    inc = run_braid("backup", "--repo", str(repo), "--name", "mdb", "--incremental", "--", "echo", "--incremental-lsn={parent_lsn}")
    assert inc.code == 0, inc.stderr
    assert _restored(repo, inc.out.strip()) == b"--incremental-lsn=4767712\n"


def test_a_placeholder_the_parent_lacks_fails_before_the_producer(repo: Path, tmp_path: Path) -> None:
    assert run_braid("backup", "--repo", str(repo), "--name", "db", "--", "printf", "plain").code == 0
    started = tmp_path / "started"
    for placeholder, kind in (("{parent_manifest}", "backup_manifest"), ("{parent_lsn}", "xtrabackup_checkpoints")):
        result = run_braid("backup", "--repo", str(repo), "--name", "db", "--incremental", "--", "sh", "-c", f"touch {started}; echo {placeholder}")
        assert result.code == 2, result.stderr
        assert f"{placeholder}: the parent db@" in result.stderr and f"has no {kind}" in result.stderr
        assert not started.exists()


def test_a_placeholder_without_incremental_is_refused(repo: Path) -> None:
    result = run_braid("backup", "--repo", str(repo), "--name", "db", "--", "echo", "{parent_lsn}")
    assert result.code == 2, result.stderr
    assert "{parent_lsn} names the parent of an incremental backup: add --incremental" in result.stderr


def test_xbstream_parser_in_any_pieces() -> None:
    def chunk(path: bytes, kind: bytes, payload: bytes = b"") -> bytes:
        head = b"XBSTCK01" + b"\0" + kind + len(path).to_bytes(4, "little") + path
        if kind == b"E":
            return head
        return head + len(payload).to_bytes(8, "little") + (0).to_bytes(8, "little") + (0).to_bytes(4, "little") + payload

    checkpoints = b"backup_type = incremental\nfrom_lsn = 10\nto_lsn = 99\n"
    stream = chunk(b"ibdata1", b"P", b"y" * 3000) + chunk(b"ibdata1", b"E") + chunk(b"xtrabackup_checkpoints", b"P", checkpoints)
    for size in (1, 7, 512, len(stream)):
        capture = XbstreamCapture()
        for start in range(0, len(stream), size):
            capture.feed(memoryview(stream[start : start + size]))
        assert capture.checkpoints == checkpoints and capture.note is None
        assert to_lsn(capture.checkpoints) == "99"
    bad = XbstreamCapture()
    bad.feed(memoryview(b"XBSTCK02" + bytes(20)))
    assert bad.checkpoints is None and bad.note is not None
