"""Incremental chains on the emulated cloud: prune and forget keep or refuse as on a directory (tests/test_chains.py).

The chains are written by the real CLI with `--engine local --incremental`
to the stack's `s3://` repository (BRAID_REPO). Then `braid prune
--keep-last 1` against it, the scheduled prune (PlanPrune, the Sweep
fan-out, TallyPrune, as the synthesized state machine runs them, each step
signing as its own role) and `braid forget`: nothing a kept backup depends
on is removed, a parent with children is refused (exit 14, nothing removed)
unless `--with-children`, which removes its descendants too.
"""

from __future__ import annotations

import json

import pytest
from test_emulated_e2e import Emulator, braid
from test_prune_cloud import run_prune

from braid.format.ids import BackupRef
from braid.format.layout import data_prefix, manifest_key

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]

ADMIN = "chain-admin"  # a caller the emulator does not hold to a role: the account's administrator


def backup(cloud: Emulator, name: str, text: str, *extra: str) -> str:
    """A backup of `text` through the host's own engine; `extra` before the command (--incremental[=REF])."""
    run = braid(cloud, ADMIN, "backup", "--engine", "local", "--name", name, *extra, "--", "printf", text)
    assert run.code == 0, run.stderr + cloud.tail()
    return run.stdout.strip()


def listed(cloud: Emulator, name: str) -> dict[str, str | None]:
    """NAME's backups as `braid list --json` shows them: backup -> parent."""
    run = braid(cloud, ADMIN, "list", "--name", name, "--json")
    assert run.code == 0, run.stderr
    return {row["backup"]: row["parent"] for row in json.loads(run.stdout)}


def stored(cloud: Emulator, ref: str) -> list[str]:
    """The objects a backup has in the bucket: its manifest, if present, and its chunks."""
    parsed = BackupRef.parse(ref)
    return [key for key in cloud.keys(manifest_key(parsed)) if key == manifest_key(parsed)] + cloud.keys(data_prefix(parsed))


def verified(cloud: Emulator, ref: str) -> list[str]:
    """`verify --deep --chain` of `ref`: every link, read whole; the links it checked, oldest first."""
    run = braid(cloud, ADMIN, "verify", ref, "--deep", "--chain", "--json")
    assert run.code == 0, run.stderr
    return [row["backup"] for row in json.loads(run.stdout)]


def test_prune_keep_last_one_on_s3_keeps_the_whole_chain(cloud: Emulator) -> None:
    old = backup(cloud, "hostchain", "old full")
    full = backup(cloud, "hostchain", "full")
    first = backup(cloud, "hostchain", "one", "--incremental")
    second = backup(cloud, "hostchain", "two", "--incremental")
    assert listed(cloud, "hostchain") == {old: None, full: None, first: full, second: first}

    dry = braid(cloud, ADMIN, "prune", "--name", "hostchain", "--keep-last", "1", "--dry-run", "--json")
    assert dry.code == 0, dry.stderr
    assert sorted(json.loads(dry.stdout)["keep"]) == sorted([full, first, second]) and json.loads(dry.stdout)["forget"] == [old]
    pruned = braid(cloud, ADMIN, "prune", "--name", "hostchain", "--keep-last", "1", "--json")
    assert pruned.code == 0, pruned.stderr
    assert json.loads(pruned.stdout)["forget"] == [old]
    assert listed(cloud, "hostchain") == {full: None, first: full, second: first}
    assert stored(cloud, old) == []
    assert all(len(stored(cloud, ref)) >= 2 for ref in (full, first, second))  # a manifest and its chunks each
    assert verified(cloud, second) == [full, first, second]


def test_the_scheduled_prune_fan_out_never_removes_what_a_kept_backup_needs(cloud: Emulator) -> None:
    """The newest backup is an incremental of the oldest full: keep-last 1 keeps those two, and only those two go
    unswept: the newer full and its incremental, which nothing kept needs, are removed, manifests and chunks."""
    oldest = backup(cloud, "sched", "oldest full")
    newer = backup(cloud, "sched", "newer full")
    on_newer = backup(cloud, "sched", "on the newer", "--incremental")
    newest = backup(cloud, "sched", "on the oldest", f"--incremental={oldest}")
    assert listed(cloud, "sched") == {oldest: None, newer: None, on_newer: newer, newest: oldest}
    others = {ref for name in ("hostchain", "forgetme") for ref in listed(cloud, name)}  # other tests' backups: chains, or none

    output = run_prune(cloud, "prune-chains", {"keep_last": 1, "slice_chunks": 1, "prefix": ""})

    report = output["report"]
    assert report["ok"], json.dumps(report)
    assert sorted(report["pruned"]) == sorted([newer, on_newer]), json.dumps(report)
    assert listed(cloud, "sched") == {oldest: None, newest: oldest}
    for gone in (newer, on_newer):
        assert stored(cloud, gone) == [], gone
    for kept in (oldest, newest):
        assert len(stored(cloud, kept)) >= 2, kept
    assert verified(cloud, newest) == [oldest, newest]
    assert others <= {ref for name in ("hostchain", "forgetme") for ref in listed(cloud, name)}  # whole chains: all kept


def test_forget_of_a_parent_on_s3_is_refused_unless_with_children(cloud: Emulator) -> None:
    full = backup(cloud, "forgetme", "full")
    first = backup(cloud, "forgetme", "one", "--incremental")
    second = backup(cloud, "forgetme", "two", "--incremental")
    before = {ref: stored(cloud, ref) for ref in (full, first, second)}

    refused = braid(cloud, ADMIN, "forget", full)
    assert refused.code == 14, refused.stderr
    assert refused.errors == [
        f"braid: error: backup {full} has 2 incremental backup(s) built on it (first: {first}), which restore only on top of it:"
        f" nothing was removed; remove them with it by 'braid forget {full} --with-children'"
    ], refused.stderr
    assert {ref: stored(cloud, ref) for ref in before} == before  # nothing removed, not a chunk
    assert listed(cloud, "forgetme") == {full: None, first: full, second: first}

    removed = braid(cloud, ADMIN, "forget", first, "--with-children", "--json")
    assert removed.code == 0, removed.stderr
    assert [c["backup"] for c in json.loads(removed.stdout)["children"]] == [second]
    assert listed(cloud, "forgetme") == {full: None}
    assert stored(cloud, first) == [] and stored(cloud, second) == []
    assert stored(cloud, full) == before[full]
