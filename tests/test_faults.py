"""The fault suite, local half: a store that fails, and commands killed at chosen points.

Never publish a bad backup, never lose a good one. Two kinds of harm:

- Store faults (support.faulty_store wraps the real LocalStore under the
  real CLI): the local engine has no retry layer, so a backup must fail with
  exit 7, publish nothing and remove its chunks; a restore must fail without
  leaving a byte under the output's name; a fault at finalize's read-back
  withdraws the manifest it just wrote.
- SIGKILL at fixed points of a backup, a restore, a prune and a forget
  (support.kill_points, which scripts/soak runs at many random points):
  afterwards `list` shows only backups that verify --deep, every completed
  backup is still there and restores identically, the next command
  completes, and the killed backup's leftovers are visible to
  `list --incomplete`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from braid.cli import compose
from braid.cli.main import main as braid_main
from support.faulty_store import FaultRule, FaultyStore
from support.kill_points import LocalRepo, Tally, audit, kill_backup, kill_removal, kill_restore, pattern, unlisted_leftovers

MiB = 1024**2
pytestmark = pytest.mark.e2e


# -- the CLI in this process, over a faulty store -----------------------------------------


class FaultyCli:
    """`braid` in-process with every store it opens wrapped; the stores are kept to count faults."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], repo: Path) -> None:
        self.repo = repo
        self.capsys = capsys
        self.monkeypatch = monkeypatch
        self.stores: list[FaultyStore] = []
        self._real_open = compose.open_store

    def __call__(self, rules: list[str], *argv: str, seed: int = 1) -> tuple[int, str, list[str]]:
        """(exit code, stdout, stderr lines) of `braid ARGV --repo REPO` with the faults of `rules`."""
        parsed = [FaultRule.parse(rule) for rule in rules]

        def open_faulty(url: str) -> FaultyStore:
            store = FaultyStore(self._real_open(url), parsed, seed)
            self.stores.append(store)
            return store

        self.monkeypatch.setattr(compose, "open_store", open_faulty)
        self.capsys.readouterr()
        code = braid_main([*argv, "--repo", str(self.repo)])
        captured = self.capsys.readouterr()
        return code, captured.out, captured.err.splitlines()

    @property
    def injected(self) -> int:
        return sum(store.total_injected for store in self.stores)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], repo: Path) -> FaultyCli:
    return FaultyCli(monkeypatch, capsys, repo)


@pytest.fixture
def dump(tmp_path: Path) -> Callable[[int, int], tuple[Path, bytes]]:
    def make(size: int, seed: int) -> tuple[Path, bytes]:
        data = pattern(size, seed)
        path = tmp_path / f"dump-{seed}.bin"
        path.write_bytes(data)
        return path, data

    return make


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()) if path.is_dir() else []


def backup_args(source: Path) -> list[str]:
    return ["backup", "--name", "db", "--input", str(source), "--chunk-size", "64KiB", "--workers", "2"]


def assert_nothing_published(cli: FaultyCli) -> None:
    code, out, _ = cli([], "list", "--json")
    assert (code, json.loads(out)) == (0, [])
    assert files_under(cli.repo / "manifests") == []
    assert files_under(cli.repo / "data") == []  # chunks, lease, temporary files: all removed


# -- store faults ------------------------------------------------------------------------------


def test_the_faulty_store_injects_what_its_rules_say_and_counts_it(tmp_path: Path) -> None:
    from braid.adapters.local.store import LocalStore
    from braid.errors import StorageError

    rules = [FaultRule.parse("put=0.5:fail:a/"), FaultRule.parse("get=1:corrupt:b"), FaultRule.parse("delete=1:after::1")]
    store = FaultyStore(LocalStore(tmp_path), rules, seed=3)
    outcomes = []
    for i in range(40):
        try:
            store.put(f"a/{i}", b"x")
            outcomes.append(True)
        except StorageError as exc:
            assert str(exc) == f"injected fault: put of a/{i} in {tmp_path} failed"
            outcomes.append(False)
    assert store.injected["put:fail"] == outcomes.count(False) and 10 < outcomes.count(False) < 30
    assert sorted(info.key for info in store.list("a/")) == sorted(f"a/{i}" for i, ok in enumerate(outcomes) if ok)
    store.put("b", b"abc")
    assert store.get("a/" + str(outcomes.index(True))) == b"x" and store.get("b") == b"a" + bytes([ord("b") ^ 1]) + b"c"
    with pytest.raises(StorageError, match="the answer was lost"):
        store.delete(["b"])
    assert store.head("b") is None  # it happened: only the answer was lost
    store.delete(["a/" + str(outcomes.index(True))])  # `times` 1: the rule is spent
    assert store.counts()["injected"] == {"put:fail": outcomes.count(False), "get:corrupt": 1, "delete:after": 1}


def test_a_backup_whose_chunk_writes_fail_exits_7_publishes_nothing_and_removes_its_chunks(cli: FaultyCli, dump: Callable[..., tuple[Path, bytes]]) -> None:
    source, data = dump(3 * MiB, 1)

    code, out, err = cli(["put=0.3:fail:data/"], *backup_args(source))

    assert (code, out) == (7, "")
    assert err[-1].startswith("braid: error: injected fault: put of data/db/") and err[-1].endswith(f"in {cli.repo} failed"), err
    assert cli.injected >= 1
    assert_nothing_published(cli)
    # The repository is fine: the next backup, without faults, completes and restores.
    code, out, err = cli([], *backup_args(source))
    assert code == 0, err
    restored = source.parent / "restored.bin"
    assert cli([], "restore", out.strip(), "--output", str(restored))[0] == 0
    assert restored.read_bytes() == data


def test_a_backup_whose_chunks_cannot_be_synced_fails_before_anything_is_published(cli: FaultyCli, dump: Callable[..., tuple[Path, bytes]]) -> None:
    source, _ = dump(1 * MiB, 2)

    code, out, err = cli(["sync=1"], *backup_args(source))

    assert (code, out) == (7, "")
    assert err[-1].startswith("braid: error: injected fault: sync of data/db/") and err[-1].endswith("failed"), err
    assert cli.injected == 1
    assert_nothing_published(cli)


@pytest.mark.parametrize(
    ("rule", "code", "message"),
    [
        ("get=1:fail:manifests/", 7, r"braid: error: injected fault: get of manifests/db/{id}\.json in {repo} failed"),
        ("get=1:corrupt:manifests/", 6, r"braid: error: manifest of db@{id} read back differently from what was written"),
    ],
)
def test_a_fault_at_finalizes_read_back_withdraws_the_manifest(
    cli: FaultyCli, dump: Callable[..., tuple[Path, bytes]], rule: str, code: int, message: str
) -> None:
    source, _ = dump(1 * MiB, 3)

    got, out, err = cli([rule], *backup_args(source))

    assert (got, out) == (code, "")
    assert re.fullmatch(message.format(id=r"\d{8}T\d{6}\.\d{3}Z-[0-9a-f]{8}", repo=re.escape(str(cli.repo))), err[-1]), err
    assert cli.injected == 1
    assert_nothing_published(cli)


def test_a_manifest_write_whose_answer_is_lost_is_withdrawn_before_the_chunks_go(cli: FaultyCli, dump: Callable[..., tuple[Path, bytes]]) -> None:
    source, _ = dump(1 * MiB, 4)

    code, out, err = cli(["put=1:after:manifests/"], *backup_args(source))

    # The manifest was written, but the engine was told it failed and removes
    # the chunks: the manifest must go first, or a backup without chunks is listed.
    assert (code, out) == (7, "")
    assert err[-1].startswith("braid: error: injected fault: put of manifests/db/") and err[-1].endswith("(the answer was lost)"), err
    assert cli.injected == 1
    assert_nothing_published(cli)


@pytest.mark.parametrize(
    ("rule", "code", "message"),
    [
        ("get=0.2:fail:data/", 7, "braid: error: injected fault: get of data/db/"),
        ("get=1:corrupt:data/:1", 6, "braid: error: chunk "),
    ],
)
def test_a_restore_over_failing_or_corrupt_reads_fails_without_writing_under_the_outputs_name(
    cli: FaultyCli, dump: Callable[..., tuple[Path, bytes]], tmp_path: Path, rule: str, code: int, message: str
) -> None:
    source, data = dump(2 * MiB, 5)
    _, out, _ = cli([], *backup_args(source))
    ref = out.strip()
    target = tmp_path / "restored.bin"

    got, stdout, err = cli([rule], "restore", ref, "--output", str(target), "--workers", "2")

    assert (got, stdout) == (code, "")
    assert err[-1].startswith(message), err
    if code == 6:
        assert "failed authentication" in err[-1] or "checksum" in err[-1], err
    assert cli.injected >= 1
    assert not target.exists() and not Path(str(target) + ".braid-partial").exists()
    # The backup itself is untouched by a failed read.
    assert cli([], "restore", ref, "--output", str(target))[0] == 0
    assert target.read_bytes() == data


def test_a_prune_whose_chunk_deletes_fail_exits_7_and_leaves_no_listed_backup_incomplete(cli: FaultyCli, dump: Callable[..., tuple[Path, bytes]]) -> None:
    refs = []
    for seed in (6, 7, 8):
        source, data = dump(512 * 1024, seed)
        refs.append(cli([], *backup_args(source))[1].strip())

    code, out, err = cli(["delete=1:fail:data/"], "prune", "--keep-last", "1")

    assert code == 7
    assert err[-1].startswith("braid: error: injected fault: delete of data/db/"), err
    assert cli.injected >= 1
    # Prune stopped at the first failure: the backup it was forgetting lost its
    # manifest first (so it is not listed half-deleted), the next one is untouched.
    code, listed, _ = cli([], "list", "--json")
    assert [row["backup"] for row in json.loads(listed)] == refs[1:]
    assert cli([], "verify", "--all", "--deep")[0] == 0
    code, incomplete, _ = cli([], "list", "--incomplete", "--json")
    assert code == 0 and [row["backup"] for row in json.loads(incomplete)] == refs[:1]  # its chunks: visible leftovers
    code, _, err = cli([], "prune", "--keep-last", "1")
    assert code == 0, err
    assert [row["backup"] for row in json.loads(cli([], "list", "--json")[1])] == refs[-1:]


# -- kill points ---------------------------------------------------------------------------------


def test_backups_killed_mid_stream_and_in_finalize_never_leave_an_incomplete_backup_listed(tmp_path: Path) -> None:
    repo = LocalRepo(tmp_path / "kill-backup")
    good: dict[str, bytes] = {}
    first = pattern(1 * MiB, 10)
    good[repo.backup("db", first)] = first
    tally = Tally()
    points = [("chunks", 1), ("chunks", 7), ("eof", 0.0), ("eof", 0.004)]
    for number, point in enumerate(points):
        data = pattern(2 * MiB, 20 + number)
        kill_backup(repo, "db", data, point, good, tally)
        listed = audit(repo, good, tally, f"after a kill at {point}", restore_newest=False)
        assert unlisted_leftovers(repo, "db", listed) == []
    after = pattern(256 * 1024, 40)
    good[repo.backup("db", after)] = after  # the next backup completes
    audit(repo, good, tally, "at the end")

    assert tally.problems == [] and tally.losses == 0
    assert tally.cases == len(points) and tally.kills >= 2  # the mid-stream ones cannot miss


def test_restores_killed_midway_leave_the_old_file_or_the_whole_backup_under_the_real_name(tmp_path: Path) -> None:
    repo = LocalRepo(tmp_path / "kill-restore")
    data, old = pattern(6 * MiB, 11), pattern(100_000, 12)
    ref = repo.backup("db", data)
    tally = Tally()

    kill_restore(repo, ref, data, tmp_path / "fresh.bin", ("bytes", 1 * MiB), tally)
    previous = tmp_path / "previous.bin"
    previous.write_bytes(old)
    kill_restore(repo, ref, data, previous, ("bytes", 2 * MiB), tally, previous=old)

    assert tally.problems == [] and tally.losses == 0
    assert (tally.cases, tally.kills) == (2, 2)


def test_a_prune_killed_midway_leaves_only_whole_backups_and_the_next_prune_completes(tmp_path: Path) -> None:
    repo = LocalRepo(tmp_path / "kill-prune")
    refs = [repo.backup("db", pattern(1 * MiB, 30 + i)) for i in range(3)]
    keep = {refs[-1]: pattern(1 * MiB, 32)}
    tally = Tally()

    kill_removal(repo, ["prune", "--keep-last", "1"], ("gone", 1), tally)
    audit(repo, keep, tally, "after a killed prune", restore_newest=False)
    done = repo.run("prune", "--keep-last", "1", "--json")

    assert done.code == 0, done.stderr
    listed, _ = repo.listed()
    assert listed == [refs[-1]]
    audit(repo, keep, tally, "after the next prune")
    assert set(repo.incomplete()) <= set(refs[:-1])  # what the kill left: visible, never a kept backup
    assert tally.problems == [] and tally.cases == 1


def test_a_forget_killed_midway_never_leaves_the_backup_half_listed(tmp_path: Path) -> None:
    repo = LocalRepo(tmp_path / "kill-forget")
    doomed = repo.backup("db", pattern(2 * MiB, 50))
    kept = pattern(1 * MiB, 51)
    data = {repo.backup("db", kept): kept}
    tally = Tally()

    killed = kill_removal(repo, ["forget", doomed], ("gone", 1), tally)
    audit(repo, data, tally, "after a killed forget", restore_newest=False)
    again = repo.run("forget", doomed)

    listed, _ = repo.listed()
    assert doomed not in listed
    if killed:  # the manifest went first: what is left is an incomplete backup's data, shown as such
        assert again.code == 8, again.stderr
        assert again.error.startswith(f"braid: error: backup {doomed} not found in {repo.path}")
        assert "'braid prune' collects it" in again.error or doomed not in repo.incomplete()
    assert tally.problems == [] and tally.cases == 1
