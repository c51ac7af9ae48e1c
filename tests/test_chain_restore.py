"""Restoring an incremental chain through the CLI, with stand-ins for the databases' tools (the real PostgreSQL 18,
MariaDB and Db2-shaped runs are scripts/e2e-incremental): --pgdata runs pg_combinebackup over every link in order
and removes the links; --chain runs a command per link with {link}, {link_id} and {dir}; every refusal happens
before a byte is written."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from conftest import run_braid

LABEL = b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nCHECKPOINT LOCATION: 0/2000060\nSTART TIMELINE: 1\n"
PG_MANIFEST = b'{ "PostgreSQL-Backup-Manifest-Version": 2, "Files": [], "WAL-Ranges": [{ "Timeline": 1, "Start-LSN": "0/2000028", "End-LSN": "0/2000100" }] }\n'

COMBINE = """#!/bin/sh
# A stand-in for pg_combinebackup: records its arguments, then writes the last link's files into -o DIR.
[ "$1" = --help ] && { echo "  -k, --link                link files instead of copying"; exit 0; }
echo "$@" > "$(dirname "$0")/args"
[ -f "$(dirname "$0")/fail" ] && { echo "pg_combinebackup: error: could not combine" >&2; exit 1; }
while [ "$#" -gt 0 ]; do case $1 in -o) out=$2; shift 2;; --link) shift;; *) last=$1; shift;; esac; done
mkdir -p "$out" && cp -r "$last"/. "$out"/
"""


def _tar(path: Path, marker: bytes) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("backup_label", LABEL), ("marker", marker), ("pg_wal/000000010000000000000002", b"w" * 4096), ("backup_manifest", PG_MANIFEST)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return path


def _pg_chain(repo: Path, tmp_path: Path) -> list[str]:
    refs = []
    for n, extra in enumerate(((), ("--incremental",), ("--incremental",))):
        tar = _tar(tmp_path / f"link{n}.tar", f"link {n}".encode())
        result = run_braid("backup", "--repo", str(repo), "--name", "pg", *extra, "--", "cat", str(tar))
        assert result.code == 0, result.stderr
        refs.append(result.out.strip())
    return refs


def _bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "pgbin"
    bin_dir.mkdir()
    (bin_dir / "pg_combinebackup").write_text(COMBINE)
    (bin_dir / "pg_combinebackup").chmod(0o755)
    return bin_dir


def test_pgdata_of_an_incremental_combines_every_link_in_order(repo: Path, tmp_path: Path) -> None:
    refs = _pg_chain(repo, tmp_path)
    bin_dir = _bin(tmp_path)
    target = tmp_path / "data"
    result = run_braid("restore", "--repo", str(repo), refs[2], "--pgdata", str(target), "--pg-bin", str(bin_dir), "--rebuild", "pg_combinebackup")
    assert result.code == 0, result.stderr
    args = (bin_dir / "args").read_text().split()
    links = args[: args.index("-o")]
    assert [Path(link).name for link in links] == ["00", "01", "02"] and args[args.index("-o") + 1] == str(target)
    assert (target / "marker").read_bytes() == b"link 2" and (target / "recovery.signal").exists()
    assert not Path(links[0]).parent.exists()  # the links are removed
    assert Path(links[0]).parent.parent == tmp_path  # beside DIR


def test_a_failing_combine_leaves_dir_as_found(repo: Path, tmp_path: Path) -> None:
    refs = _pg_chain(repo, tmp_path)
    bin_dir = _bin(tmp_path)
    (bin_dir / "fail").touch()
    target = tmp_path / "data"
    target.mkdir(mode=0o700)
    work = tmp_path / "work"
    result = run_braid("restore", "--repo", str(repo), refs[1], "--pgdata", str(target), "--pg-bin", str(bin_dir), "--work-dir", str(work), "--rebuild", "pg_combinebackup")
    assert result.code == 11, result.stderr
    assert "pg_combinebackup failed: pg_combinebackup: error: could not combine" in result.stderr
    assert list(target.iterdir()) == [] and not work.exists()


def test_pgdata_refusals_write_nothing(repo: Path, tmp_path: Path) -> None:
    refs = _pg_chain(repo, tmp_path)
    target = tmp_path / "data"
    result = run_braid("restore", "--repo", str(repo), refs[2], "--pgdata", str(target), "--pg-bin", str(tmp_path / "nowhere"), "--rebuild", "pg_combinebackup")
    assert result.code == 2, result.stderr
    assert "pg_combinebackup was not found in --pg-bin" in result.stderr
    bin_dir = _bin(tmp_path)
    work = tmp_path / "taken"
    work.mkdir()
    result = run_braid("restore", "--repo", str(repo), refs[2], "--pgdata", str(target), "--pg-bin", str(bin_dir), "--work-dir", str(work), "--rebuild", "pg_combinebackup")
    assert result.code == 2 and "already exists" in result.stderr, result.stderr
    data = repo / "data" / "pg" / refs[0].split("@")[1]
    for chunk in data.glob("0*"):
        chunk.unlink()
    result = run_braid("restore", "--repo", str(repo), refs[2], "--pgdata", str(target), "--pg-bin", str(bin_dir), "--rebuild", "pg_combinebackup")
    assert result.code == 6, result.stderr
    assert not target.exists() and not list(tmp_path.glob(".data.braid-chain-*")) and not (bin_dir / "args").exists()


def test_chain_runs_the_command_once_per_link(repo: Path, tmp_path: Path) -> None:
    refs = []
    for n, extra in enumerate(((), ("--incremental",), ("--incremental",))):
        result = run_braid("backup", "--repo", str(repo), "--name", "db", *extra, "--", "printf", f"link {n}")
        assert result.code == 0, result.stderr
        refs.append(result.out.strip())
    work = tmp_path / "work"
    result = run_braid(
        "restore", "--repo", str(repo), refs[1], "--chain", "--work-dir", str(work), "--json", "--",
        "sh", "-c", 'cat > "$1/data"; echo "$2 $3" > "$1/who"', "sh", "{dir}", "{link}", "{link_id}",
    )
    assert result.code == 0, result.stderr
    assert json.loads(result.out.strip().splitlines()[-1])["links"] == refs[:2]
    assert sorted(p.name for p in work.iterdir()) == ["00", "01"]
    for n in (0, 1):
        assert (work / f"{n:02d}" / "data").read_bytes() == f"link {n}".encode()
        assert (work / f"{n:02d}" / "who").read_text() == f"{n} {refs[n]}\n"
    result = run_braid("restore", "--repo", str(repo), refs[1], "--chain", "--", "cat")
    assert result.code == 2 and "--chain needs --work-dir DIR" in result.stderr, result.stderr
