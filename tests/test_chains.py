"""Incremental chains through the CLI (docs/format.md, Chains): the manifest's fields, parent resolution and its
refusals, list/show, prune keeping what a kept backup needs, forget refusing a parent, verify and restore checking
the chain first. The real databases' chains are in tests/test_chains_postgres.py."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_braid


def _backup(repo: Path, *extra: str, text: str = "data") -> str:
    result = run_braid("backup", "--repo", str(repo), "--name", "db", *extra, "--", "printf", text)
    assert result.code == 0, result.stderr
    return result.out.strip()


def _show(repo: Path, ref: str) -> dict:
    result = run_braid("show", "--repo", str(repo), "--json", ref)
    assert result.code == 0, result.stderr
    return json.loads(result.out)


def _chain(repo: Path) -> tuple[str, str, str]:
    full = _backup(repo, text="full")
    first = _backup(repo, "--incremental", text="one")
    second = _backup(repo, "--incremental", text="two")
    return full, first, second


def test_incremental_names_parent_and_full(repo: Path) -> None:
    full, first, second = _chain(repo)
    assert {k: _show(repo, full)[k] for k in ("kind", "parent", "chain_full")} == {"kind": "full", "parent": None, "chain_full": None}
    assert {k: _show(repo, second)[k] for k in ("kind", "parent", "chain_full")} == {"kind": "incremental", "parent": first, "chain_full": full}
    assert _backup(repo, f"--incremental={full}", text="branch") != second
    rows = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert [r["parent"] for r in rows] == [None, full, first, full]
    text = run_braid("list", "--repo", str(repo)).out
    assert f"incremental of {first}" in text
    assert f"kind        incremental of {first} (chain from the full {full})" in run_braid("show", "--repo", str(repo), second).out
    # A full is still a version-2 manifest; an incremental is version 3.
    assert b'"version":2' in next((repo / "manifests" / "db").glob(full.split("@")[1] + ".json")).read_bytes()
    assert b'"version":3' in (repo / "manifests" / "db" / (second.split("@")[1] + ".json")).read_bytes()


def test_incremental_without_a_parent_is_refused(repo: Path) -> None:
    result = run_braid("backup", "--repo", str(repo), "--name", "db", "--incremental", "--", "printf", "x")
    assert result.code == 6, result.stderr
    assert "the incremental's parent is missing: a complete backup of db not found" in result.stderr
    assert "take a full backup without --incremental first" in result.stderr
    assert json.loads(run_braid("list", "--repo", str(repo), "--json").out) == []


def test_incremental_of_another_name_is_refused(repo: Path) -> None:
    full = _backup(repo)
    result = run_braid("backup", "--repo", str(repo), "--name", "other", f"--incremental={full}", "--", "printf", "x")
    assert result.code == 2, result.stderr
    assert "the parent must be a backup of other" in result.stderr


def test_corrupt_parent_refuses_incremental_backup_restore_and_verify(repo: Path, tmp_path: Path) -> None:
    full, first, second = _chain(repo)
    manifest = repo / "manifests" / "db" / (first.split("@")[1] + ".json")
    manifest.write_bytes(manifest.read_bytes().replace(b'"engine":"local"', b'"engine":"lokal"'))
    started = tmp_path / "started"
    result = run_braid("backup", "--repo", str(repo), "--name", "db", "--incremental", "--", "touch", str(started))
    assert result.code == 6, result.stderr
    assert "is unreadable" in result.stderr and not started.exists()  # refused before the producer ran
    out = tmp_path / "out"
    result = run_braid("restore", "--repo", str(repo), second, "--output", str(out))
    assert result.code == 6, result.stderr
    assert f"needs {first} (the parent of {second}), which is unreadable" in result.stderr
    assert not out.exists()
    for deep in ((), ("--deep",)):
        result = run_braid("verify", "--repo", str(repo), second, *deep)
        assert result.code == 6, result.stderr
        assert f"needs {first}" in result.stderr
    manifest.unlink()
    result = run_braid("restore", "--repo", str(repo), second, "--output", str(out))
    assert result.code == 6 and "which is missing" in result.stderr, result.stderr
    assert not out.exists()


def test_verify_deep_chain_covers_every_link(repo: Path) -> None:
    full, first, second = _chain(repo)
    result = run_braid("verify", "--repo", str(repo), second, "--deep", "--chain", "--json")
    assert result.code == 0, result.stderr
    assert [r["backup"] for r in json.loads(result.out)] == [full, first, second]
    chunk = next((repo / "data" / "db" / full.split("@")[1]).glob("0*"))
    chunk.write_bytes(chunk.read_bytes()[:-1] + bytes([chunk.read_bytes()[-1] ^ 1]))
    assert run_braid("verify", "--repo", str(repo), second, "--deep").code == 0  # without --chain: the ancestors' manifests only
    assert run_braid("verify", "--repo", str(repo), second, "--deep", "--chain").code == 6


def test_prune_keep_last_one_keeps_the_whole_chain(repo: Path) -> None:
    old = _backup(repo, text="old full")
    full, first, second = _chain(repo)
    result = run_braid("prune", "--repo", str(repo), "--name", "db", "--keep-last", "1", "--json")
    assert result.code == 0, result.stderr
    plan = json.loads(result.out)
    assert sorted(plan["keep"]) == sorted([full, first, second]) and plan["forget"] == [old]
    rows = [r["backup"] for r in json.loads(run_braid("list", "--repo", str(repo), "--json").out)]
    assert rows == [full, first, second]


def test_forget_refuses_a_parent_unless_with_children(repo: Path) -> None:
    full, first, second = _chain(repo)
    result = run_braid("forget", "--repo", str(repo), first)
    assert result.code == 14, result.stderr
    assert f"backup {first} has 1 incremental backup(s) built on it (first: {second})" in result.stderr
    assert "nothing was removed" in result.stderr
    assert len(json.loads(run_braid("list", "--repo", str(repo), "--json").out)) == 3
    assert run_braid("forget", "--repo", str(repo), second).code == 0  # a leaf goes as ever
    result = run_braid("forget", "--repo", str(repo), full, "--with-children", "--json")
    assert result.code == 0, result.stderr
    assert [c["backup"] for c in json.loads(result.out)["children"]] == [first]
    assert json.loads(run_braid("list", "--repo", str(repo), "--json").out) == []
    assert not any((repo / "data" / "db").iterdir()) if (repo / "data" / "db").exists() else True


def test_exit_code_14_is_documented() -> None:
    assert "14  a backup has incremental children: not removed without --with-children" in run_braid("--help").out


def test_a_locked_or_kept_backup_keeps_its_ancestors() -> None:
    from braid.format.chain import Lineage
    from braid.format.ids import BackupRef
    from braid.ops.chain_retention import keep_ancestors

    full, first, second, other = (BackupRef("db", f"2026112{n}T000000.000Z-0000000{n}") for n in range(4))
    lineages = {full: Lineage(), first: Lineage.incremental(full, Lineage()), second: Lineage.incremental(first, Lineage.incremental(full, Lineage())), other: Lineage()}
    assert lineages[second].chain_full == str(full)
    # Object Lock keeps `second` (locked): its parents stay even though the rules let them go.
    keep, forget = keep_ancestors([other], [full, first], [second], lineages)
    assert (sorted(keep), forget) == (sorted([other, full, first]), [])
    keep, forget = keep_ancestors([first], [full, other], [], lineages)
    assert (sorted(keep), forget) == (sorted([first, full]), [other])


def test_lineage_fields_are_checked() -> None:
    import pytest

    from braid.format.chain import Lineage

    backup = "db@20261123T000000.000Z-00000002"
    older, newer = "db@20261122T000000.000Z-00000001", "db@20261124T000000.000Z-00000003"
    assert Lineage.from_json({"kind": "incremental", "parent": older, "chain_full": older}, backup).parent == older
    for doc in (
        {"kind": "incremental", "parent": newer, "chain_full": older},
        {"kind": "incremental", "parent": older, "chain_full": "other@20261122T000000.000Z-00000001"},
        {"kind": "incremental", "parent": older},
        {"kind": "full", "parent": older, "chain_full": None},
        {"kind": "differential", "parent": older, "chain_full": older},
        {"kind": "incremental", "parent": "db@latest", "chain_full": older},
    ):
        with pytest.raises(ValueError):
            Lineage.from_json(doc, backup)


def test_rekey_keeps_the_chain_and_it_restores_under_the_new_key(repo: Path, tmp_path: Path) -> None:
    full, first, second = _chain(repo)
    new_file = tmp_path / "new.key"
    result = run_braid("rekey", "--repo", str(repo), "--new-key-file", str(new_file), "--json")
    assert result.code == 0, result.stderr
    assert sorted(json.loads(result.out)["rewrapped"]) == sorted([full, first, second])
    shown = json.loads(run_braid("show", "--repo", str(repo), "--json", second, "--key-file", str(new_file)).out)
    assert (shown["parent"], shown["chain_full"], shown["rekeyed"] is not None) == (first, full, True)
    assert b'"version":3' in (repo / "manifests" / "db" / (second.split("@")[1] + ".json")).read_bytes()
    result = run_braid("verify", "--repo", str(repo), second, "--deep", "--chain", "--key-file", str(new_file))
    assert result.code == 0, result.stderr


def test_the_catalog_planner_keeps_chains_too(repo: Path) -> None:
    """The cloud's scheduled prune plans from the catalog (plan_prune(from_catalog=True)): the same chains are kept."""
    from braid.cli.compose import open_key_service, open_repository
    from braid.format.ids import BackupRef
    from braid.ops.retention import RetentionPolicy, plan_prune

    old = _backup(repo, text="old full")
    chain = _chain(repo)
    repository = open_repository(str(repo))
    keys = open_key_service(repository, None)
    plan = plan_prune(repository, RetentionPolicy.of(keep_last=1), keys, from_catalog=True)
    assert sorted(plan.keep) == sorted(BackupRef.parse(r) for r in chain) and plan.forget == [BackupRef.parse(old)]


def test_a_chain_restore_short_of_disk_is_refused(tmp_path: Path) -> None:
    from types import SimpleNamespace

    import pytest

    from braid.ops.chain_restore import DiskSpaceError, check_disk

    links = [SimpleNamespace(manifest=SimpleNamespace(plaintext_bytes=1 << 60)), SimpleNamespace(manifest=SimpleNamespace(plaintext_bytes=1 << 20))]
    with pytest.raises(DiskSpaceError, match=r"needs \d+ bytes free on the file system of .* nothing was written") as caught:
        check_disk(links, str(tmp_path / "work"), str(tmp_path / "data"))  # type: ignore[arg-type]
    assert caught.value.exit_code == 3
    check_disk(links[1:], str(tmp_path / "work"), str(tmp_path / "data"))  # a MiB fits


def test_incremental_with_resume_is_refused_before_anything_runs(repo: Path, tmp_path: Path) -> None:
    started = tmp_path / "started"
    for inputs in (("--", "touch", str(started)), ("--input", str(tmp_path / "none"))):
        result = run_braid("backup", "--repo", str(repo), "--resume", "db@20260101T000000.000Z-00000000", "--incremental", *inputs)
        assert result.code == 2, result.stderr
        assert "--incremental and --resume exclude each other" in result.stderr
    assert not started.exists()
