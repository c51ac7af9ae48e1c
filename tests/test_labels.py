"""--label KEY=VALUE on backup: kept in the manifest and its summary, shown by list, show and --json
("labels" as an object), matched by list --label; bad labels are usage errors; a backup without labels
reads as before (issue 25, F19)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from braid.errors import UsageError
from braid.format.labels import check_labels, labels_of, matches
from conftest import run_braid


def backup(repo: Path, *labels: str, name: str = "pg") -> str:
    words = [w for label in labels for w in ("--label", label)]
    result = run_braid("backup", "--repo", str(repo), "--name", name, *words, stdin=b"rows " * 2000)
    assert result.code == 0, result.stderr
    return result.out.strip()


def test_labels_are_shown_and_filtered(repo: Path) -> None:
    upgrade = backup(repo, "env=prod", "ticket=DBA-42", "note=pre-upgrade 15->16")
    plain = backup(repo)
    staging = backup(repo, "env=staging", name="db2")

    rows = {row["backup"]: row for row in json.loads(run_braid("list", "--repo", str(repo), "--json").out)}
    assert rows[upgrade]["labels"] == {"env": "prod", "ticket": "DBA-42", "note": "pre-upgrade 15->16"}
    assert rows[plain]["labels"] == {} and rows[staging]["labels"] == {"env": "staging"}
    text = run_braid("list", "--repo", str(repo)).out
    assert "LABELS" in text.splitlines()[0] and "env=prod note=pre-upgrade 15->16 ticket=DBA-42" in text

    def selected(*wanted: str) -> list[str]:
        words = [w for label in wanted for w in ("--label", label)]
        result = run_braid("list", "--repo", str(repo), *words, "--json")
        assert result.code == 0, result.stderr
        return [row["backup"] for row in json.loads(result.out)]

    assert selected("env=prod") == [upgrade]
    assert selected("env=prod", "ticket=DBA-42") == [upgrade] and selected("env=prod", "ticket=DBA-43") == []
    assert selected("env=staging") == [staging] and selected("env=prod2") == []

    shown = json.loads(run_braid("show", "--repo", str(repo), upgrade, "--json").out)
    assert shown["labels"] == {"env": "prod", "ticket": "DBA-42", "note": "pre-upgrade 15->16"}
    assert "labels      env=prod note=pre-upgrade 15->16 ticket=DBA-42" in run_braid("show", "--repo", str(repo), upgrade).out
    assert "labels " not in run_braid("show", "--repo", str(repo), plain).out
    # Rebuilt from the manifests, the catalog keeps them.
    rebuilt = json.loads(run_braid("list", "--repo", str(repo), "--rebuild-catalog", "--label", "env=prod", "--json").out)
    assert [row["backup"] for row in rebuilt] == [upgrade]


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("env", "invalid label 'env': expected KEY=VALUE, e.g. --label env=prod"),
        ("=prod", "a key is 1-64 letters, digits"),
        ("e nv=prod", "a key is 1-64 letters, digits"),
        ("env=" + "x" * 300, "a value is at most 256 printable characters"),
        ("env=a\tb", "a value is at most 256 printable characters"),
    ],
)
def test_bad_labels_are_usage_errors_and_nothing_is_published(repo: Path, label: str, message: str) -> None:
    result = run_braid("backup", "--repo", str(repo), "--name", "pg", "--label", label, stdin=b"x" * 100)
    assert result.code == 2 and message in result.stderr, result.stderr
    assert not (repo / "manifests").exists() or not any((repo / "manifests").rglob("*.json"))
    listed = run_braid("list", "--repo", str(repo), "--label", label)
    assert listed.code == 2 and message in listed.stderr


def test_a_label_given_twice_is_refused(repo: Path) -> None:
    result = run_braid("backup", "--repo", str(repo), "--name", "pg", "--label", "env=a", "--label", "env=b", stdin=b"x" * 100)
    assert result.code == 2 and "label 'env' given twice (--label env=a and --label env=b)" in result.stderr


def test_label_rules() -> None:
    assert labels_of(["a=1", "b.c_d-e=x=y", "empty="]) == {"a": "1", "b.c_d-e": "x=y", "empty": ""}
    with pytest.raises(UsageError, match="at most 32 labels"):
        labels_of([f"k{i}=v" for i in range(33)])
    assert matches({"a": "1", "b": "2"}, {"a": "1"}) and not matches(None, {"a": "1"}) and matches(None, {})
    with pytest.raises(ValueError, match="labels must be an object of strings"):
        check_labels({"a": 1})
    with pytest.raises(ValueError, match="a key is"):
        check_labels({"-a": "1"})
