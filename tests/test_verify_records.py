"""Verify records (braid.format.verification, braid.ops.verification) and the host-side `braid verify` that writes them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from braid.cli.compose import open_repository
from braid.cli.render import verified_column
from braid.errors import IntegrityError
from braid.format.ids import BackupRef
from braid.format.layout import parse_verification_key, verification_key
from braid.format.verification import Selection, VerificationRecord
from braid.ops.verification import failed_verifications, latest_marks, latest_verification, new_record, next_rotation, write_record
from braid.ops.verify import selected_chunks
from conftest import run_braid


def backup(repo: Path, name: str, data: bytes) -> str:
    result = run_braid("backup", "--repo", str(repo), "--name", name, "--chunk-size", "4KiB", stdin=data)
    assert result.code == 0, result.stderr
    return result.out.strip()


def flip(repo: Path, ref: str, index: int) -> None:
    parsed = BackupRef.parse(ref)
    chunk = repo / "data" / parsed.name / parsed.id / f"{index:010d}"
    raw = bytearray(chunk.read_bytes())
    raw[-1] ^= 1
    chunk.write_bytes(bytes(raw))


def test_a_backup_never_verified_has_no_record_and_nothing_fails(repo: Path) -> None:
    ref = BackupRef.parse(backup(repo, "db", b"x" * 9000))
    repository = open_repository(str(repo))
    assert latest_verification(repository.store, ref) is None
    assert latest_marks(repository.store) == {} and failed_verifications(repository) == {}
    assert next_rotation(repository.store, ref, 4) == Selection.rotation(1, 4)
    shown = run_braid("show", "--repo", str(repo), str(ref))
    assert "verified    never" in shown.out
    assert json.loads(run_braid("show", "--repo", str(repo), str(ref), "--json").out)["verification"] is None


def test_local_verify_records_its_result_and_show_and_list_print_it(repo: Path) -> None:
    ref = backup(repo, "db", bytes(range(256)) * 60)

    result = run_braid("verify", "--repo", str(repo), ref, "--deep")

    assert result.code == 0 and "ok (deep, 4/4 chunks)" in result.out, result.stderr
    record = latest_verification(open_repository(str(repo)).store, BackupRef.parse(ref))
    assert record is not None and record.ok and (record.mode, record.engine, record.chunks_checked, record.chunks_total) == ("deep", "local", 4, 4)
    listed = run_braid("list", "--repo", str(repo))
    assert listed.out.splitlines()[1].endswith("deep just now ok")
    shown = json.loads(run_braid("show", "--repo", str(repo), ref, "--json").out)
    assert shown["verified"]["outcome"] == "ok" and shown["verification"]["selection"] == {"kind": "all"}


def test_a_failed_verify_is_recorded_and_the_prune_learns_its_first_failure(repo: Path) -> None:
    good = backup(repo, "db", b"good " * 3000)
    bad = backup(repo, "db", b"rows " * 3000)
    flip(repo, bad, 2)

    assert run_braid("verify", "--repo", str(repo), good).code == 0
    result = run_braid("verify", "--repo", str(repo), bad, "--deep")

    assert result.code == 6 and f"first: chunk 2 of backup {bad}" in result.stderr
    failed = failed_verifications(open_repository(str(repo)))
    assert list(failed) == [BackupRef.parse(bad)]
    assert f"backup {bad} failed its deep verification of " in failed[BackupRef.parse(bad)] and f"chunk 2 of backup {bad}" in failed[BackupRef.parse(bad)]
    rows = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert {r["backup"]: r["verified"]["outcome"] for r in rows} == {good: "ok", bad: "failed"}
    assert "FAILED" in run_braid("list", "--repo", str(repo)).out.splitlines()[2]
    # A later good verification supersedes it (the newest record counts).
    flip(repo, bad, 2)
    assert run_braid("verify", "--repo", str(repo), bad, "--deep").code == 0
    assert failed_verifications(open_repository(str(repo))) == {}


def test_a_damaged_failed_record_still_counts_as_failed(repo: Path) -> None:
    ref = BackupRef.parse(backup(repo, "db", b"x" * 5000))
    repository = open_repository(str(repo))
    record = new_record(
        str(ref), mode="quick", selection=Selection(), engine="local", chunks_total=2, chunks_checked=1, bytes_checked=4096,
        failures=["chunk 1 is missing"], corrupt=True, at=datetime.now(UTC),
    )
    key = write_record(repository.store, record)
    repository.store.put(key, repository.store.get(key).replace(b"missing", b"MISSING"))

    with pytest.raises(IntegrityError, match="is damaged: its checksum does not match"):
        latest_verification(repository.store, ref)
    assert "its record is unreadable" in failed_verifications(repository)[ref]


def test_rotation_runs_cover_every_chunk_once_then_start_over(repo: Path) -> None:
    ref = backup(repo, "db", bytes(range(256)) * 160)  # 10 chunks of 4 KiB
    checked = []
    for _ in range(4):
        result = run_braid("verify", "--repo", str(repo), ref, "--rotate", "3", "--json")
        assert result.code == 0, result.stderr
        (report,) = json.loads(result.out)
        checked.append((report["selection"]["part"], report["chunks_checked"]))
    assert checked == [(1, 4), (2, 3), (3, 3), (1, 4)]
    # A sampled run in between does not move the rotation; another size of rotation starts its own.
    assert run_braid("verify", "--repo", str(repo), ref, "--sample", "50").code == 0
    repository = open_repository(str(repo))
    assert next_rotation(repository.store, BackupRef.parse(ref), 3) == Selection.rotation(2, 3)
    assert next_rotation(repository.store, BackupRef.parse(ref), 5) == Selection.rotation(1, 5)


def test_a_rotation_of_t_parts_selects_each_chunk_in_exactly_one_part(repo: Path) -> None:
    ref = BackupRef.parse(backup(repo, "db", bytes(range(256)) * 176))  # 11 chunks
    from braid.ops.open import read_manifest

    manifest = read_manifest(open_repository(str(repo)), ref)
    for parts in (1, 2, 3, 7, 11, 12):
        chosen = [c.index for part in range(1, parts + 1) for c in selected_chunks(manifest, Selection.rotation(part, parts))]
        assert sorted(chosen) == list(range(11)), parts
    assert len(selected_chunks(manifest, Selection.sample(50))) == 6


def test_record_keys_and_bodies_round_trip() -> None:
    ref = BackupRef.parse("db@20261123T000000.000Z-1a2b3c4d")
    key = verification_key(ref, "20261124T010203.000004Z", "deep", "failed")
    assert key == "verify/db/20261123T000000.000Z-1a2b3c4d/20261124T010203.000004Z~deep~failed.json"
    assert parse_verification_key(key) == (ref, "20261124T010203.000004Z", "deep", "failed")
    assert parse_verification_key("verify/db/x.json") is None and parse_verification_key("manifests/db/x.json") is None
    record = new_record(
        str(ref), mode="deep", selection=Selection.rotation(2, 7), engine="stepfunctions", chunks_total=10, chunks_checked=1,
        bytes_checked=7, failures=[f"f{i}" for i in range(150)], corrupt=True, at=datetime(2026, 11, 24, tzinfo=UTC),
    )
    again = VerificationRecord.decode(record.encode(), "here")
    assert again == record and again.failure_count == 150 and len(again.failures) == 100 and again.outcome == "failed"
    with pytest.raises(ValueError, match="out of range"):
        Selection.rotation(8, 7)


def test_the_verified_column_reads_like_an_age() -> None:
    now = datetime(2026, 11, 24, 12, tzinfo=UTC)
    at = (now - timedelta(days=2, hours=3)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert verified_column({"at": at, "mode": "deep", "outcome": "ok"}, now) == "deep 2d ago ok"
    assert verified_column({"at": at, "mode": "quick", "outcome": "failed"}, now) == "quick 2d ago FAILED"
    assert verified_column(None, now) == "-"


def test_the_cloud_engine_needs_a_stack_and_says_how_to_get_one(repo: Path) -> None:
    ref = backup(repo, "db", b"x" * 100)
    result = run_braid("verify", "--repo", str(repo), ref, "--engine", "stepfunctions")
    assert result.code == 2
    assert "has no verify state machine" in result.stderr and "--engine local" in result.stderr


def test_forget_and_prune_remove_a_backups_verify_records_with_it(repo: Path) -> None:
    """Records describe one backup: they go with its manifest, so nothing of a removed backup stays under verify/."""
    first = backup(repo, "db", b"1" * 9000)
    second = backup(repo, "db", b"2" * 9000)
    third = backup(repo, "db", b"3" * 9000)
    for ref in (first, second, third):
        assert run_braid("verify", "--repo", str(repo), ref).code == 0
    store = open_repository(str(repo)).store

    def recorded() -> set[str]:
        return {str(parsed[0]) for info in store.list("verify/") if (parsed := parse_verification_key(info.key)) is not None}

    assert recorded() == {first, second, third}
    assert run_braid("forget", "--repo", str(repo), second).code == 0
    assert recorded() == {first, third}
    assert run_braid("prune", "--repo", str(repo), "--keep-last", "1").code == 0
    assert recorded() == {third}
    assert latest_verification(store, BackupRef.parse(third)) is not None
