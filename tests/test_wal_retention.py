"""`prune` and `forget` say (and prune removes) the WAL no kept backup needs; `verify --wal` names every gap."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from braid.adapters.local.store import LocalStore
from braid.format.ids import BackupRef
from braid.format.layout import wal_key
from braid.format.wal import WalFile, segment_name
from braid.ops.wal_retention import BackupStart, removable
from conftest import run_braid
from wal_segments import write_segment

MIB = 1 << 20


def seg(timeline: int, segno: int) -> str:
    return segment_name(timeline, segno, MIB)


def push(repo: Path, tmp_path: Path, *names: str, data: bytes | None = None) -> None:
    for name in names:
        source = tmp_path / "src"
        source.mkdir(exist_ok=True)
        if data is not None:
            path = source / name
            path.write_bytes(data)
        else:
            path = write_segment(source, name)
        result = run_braid("wal-push", "--repo", str(repo), "--name", "pg", str(path))
        assert result.code == 0, result.stderr


def label_tar(timeline: int, start_segno: int) -> bytes:
    """A pg_basebackup-shaped tar whose backup_label starts at segment `start_segno` of 1 MiB segments on `timeline`."""
    lsn = start_segno * MIB + 0x28
    label = (
        f"START WAL LOCATION: {lsn >> 32:X}/{lsn & 0xFFFFFFFF:X} (file {seg(timeline, start_segno)})\n"
        f"CHECKPOINT LOCATION: {lsn >> 32:X}/{(lsn + 0x38) & 0xFFFFFFFF:X}\nBACKUP METHOD: streamed\nBACKUP FROM: primary\n"
        f"START TIME: 2026-11-28 08:00:00 UTC\nLABEL: test\nSTART TIMELINE: {timeline}\n"
    ).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in (("backup_label", label), ("PG_VERSION", b"15\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def base_backup(repo: Path, timeline: int, start_segno: int) -> str:
    """A backup through the CLI of label_tar(timeline, start_segno)."""
    result = run_braid("backup", "--repo", str(repo), "--name", "pg", "--quiet", "--json", stdin=label_tar(timeline, start_segno))
    assert result.code == 0, result.stderr
    return str(json.loads(result.out)["backup"])


def test_removable_keeps_what_any_kept_backup_may_need() -> None:
    ref = BackupRef.parse("pg@20261128T080000.000Z-00000001")
    starts = [BackupStart(ref, 2, 10)]
    assert removable(WalFile.parse(seg(1, 50)), starts, MIB)  # an older timeline: before the backup's start
    assert removable(WalFile.parse(seg(2, 9)), starts, MIB)
    assert not removable(WalFile.parse(seg(2, 10)), starts, MIB)  # its start segment: needed for consistency
    assert not removable(WalFile.parse(seg(3, 1)), starts, MIB)  # a later timeline may descend from it
    assert not removable(WalFile.parse("00000002.history"), starts, MIB)
    assert removable(WalFile.parse(seg(2, 9) + ".partial"), starts, MIB)
    assert not removable(WalFile.parse(seg(1, 1)), [], MIB)  # no kept backup with a known start: nothing goes


def test_prune_removes_the_wal_before_the_oldest_kept_backup_and_forget_says_what_would_go(tmp_path: Path, repo: Path) -> None:
    push(repo, tmp_path, *(seg(1, n) for n in range(1, 9)))
    push(repo, tmp_path, "00000002.history", data=b"1\t0/700000\tno recovery target specified\n")
    push(repo, tmp_path, seg(2, 7), seg(2, 8))
    old = base_backup(repo, 1, 2)
    new = base_backup(repo, 1, 5)
    assert run_braid("verify", "--repo", str(repo), "--wal", "--name", "pg").code == 0
    forget = run_braid("forget", "--repo", str(repo), old, "--dry-run")
    assert forget.code == 0 and f"would remove {old}" in forget.out
    assert f"then 'braid prune' removes 4 WAL file(s) of pg, {seg(1, 1)} .. {seg(1, 4)}" in forget.out
    dry = run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--dry-run")
    assert dry.code == 0 and f"would remove 4 WAL file(s) of pg, {seg(1, 1)} .. {seg(1, 4)}" in dry.out, dry.out
    assert (repo / wal_key("pg", WalFile.parse(seg(1, 1)))).exists()
    doc = json.loads(run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--dry-run", "--json").out)
    assert doc["wal"] == [{"name": "pg", "files": [seg(1, n) for n in range(1, 5)],
                           "kept_from": [{"backup": new, "timeline": 1, "segno": 5}]}]
    done = run_braid("prune", "--repo", str(repo), "--keep-last", "1")
    assert done.code == 0 and f"removed 4 WAL file(s) of pg, {seg(1, 1)} .. {seg(1, 4)}" in done.out
    left = sorted(p.name for p in (repo / "wal" / "pg").rglob("0*") if p.is_file())
    assert left == sorted(["00000002.history", *(seg(1, n) for n in range(5, 9)), seg(2, 7), seg(2, 8)])
    again = run_braid("verify", "--repo", str(repo), "--wal", "--name", "pg")
    assert again.code == 0 and "continuous" in again.out, again.out


def test_a_name_whose_kept_backup_records_no_wal_start_keeps_all_its_wal(tmp_path: Path, repo: Path) -> None:
    push(repo, tmp_path, seg(1, 1), seg(1, 2))
    assert run_braid("backup", "--repo", str(repo), "--name", "pg", "--quiet", stdin=b"not a tar").code == 0
    dry = run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--dry-run")
    assert dry.code == 0 and "kept every WAL file of pg" in dry.out and "records no WAL start" in dry.out


def test_verify_wal_names_every_gap_across_a_timeline_switch(tmp_path: Path, repo: Path) -> None:
    push(repo, tmp_path, seg(1, 2), seg(1, 3), seg(1, 5), seg(1, 6))
    # timeline 2 branched in segment 6 at 0/680000: it starts with its own copy of segment 6
    push(repo, tmp_path, "00000002.history", data=b"1\t0/680000\tbefore the bad DELETE\n")
    push(repo, tmp_path, seg(2, 6), seg(2, 8), seg(2, 9))
    ref = base_backup(repo, 1, 2)
    result = run_braid("verify", "--repo", str(repo), "--wal", "--name", "pg")
    assert result.code == 6
    assert f"  gap: {seg(1, 4)} .. {seg(1, 4)} (1 segment(s) missing)" in result.out
    assert f"  gap: {seg(2, 7)} .. {seg(2, 7)} (1 segment(s) missing)" in result.out
    assert f"first: {seg(1, 4)} .. {seg(1, 4)} (1 segment(s) missing), needed by {ref}" in result.stderr
    assert f"newest segment {seg(2, 9)}" in result.out
    doc = json.loads(run_braid("verify", "--repo", str(repo), "--wal", "--name", "pg", "--json").out)
    assert doc["ok"] is False and doc["backups"][0]["ranges"] == [[seg(1, 2), seg(1, 5)], [seg(2, 6), seg(2, 9)]]
    # the gaps filled, the archive is continuous
    push(repo, tmp_path, seg(1, 4), seg(2, 7))
    assert run_braid("verify", "--repo", str(repo), "--wal", "--name", "pg").code == 0
    assert run_braid("verify", "--repo", str(repo), "--wal").code == 2  # --name is needed
    LocalStore(repo).delete([wal_key("pg", WalFile.parse(seg(1, 2)))])  # its start segment gone
    gone = run_braid("verify", "--repo", str(repo), "--wal", "--name", "pg")
    assert gone.code == 6 and f"first: {seg(1, 2)} .. {seg(1, 2)}" in gone.stderr


def test_verify_wal_of_an_empty_archive_names_each_backups_start_as_a_gap(tmp_path: Path, repo: Path) -> None:
    push(repo, tmp_path, seg(1, 3))
    ref = base_backup(repo, 1, 3)
    LocalStore(repo).delete([wal_key("pg", WalFile.parse(seg(1, 3)))])  # the archive loses its only segment
    result = run_braid("verify", "--repo", str(repo), "--wal", "--name", "pg")
    assert result.code == 6 and f"first: {seg(1, 3)} .. {seg(1, 3)} (1 segment(s) missing), needed by {ref}" in result.stderr
