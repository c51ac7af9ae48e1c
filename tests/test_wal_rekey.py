"""braid rekey and the WAL archive: every archived WAL object, pack and history file gets its data key re-wrapped
(the key is in each object's head), the frames untouched; fetch works with the new key and not the old one; a
rerun has nothing left; an object that cannot be re-wrapped fails the run (exit and one line) and keeps the old key
in the config."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.cli.compose import default_key_file
from braid.format.keys import WrappedKey
from braid.format.repository import Repository
from braid.ops.rekey import rekey_repository
from braid.ops.wal import archived_files
from braid.ops.wal_fetch import fetch_wal_bytes
from braid.ops.wal_pack_process import process_staged_files
from conftest import run_braid
from support.faulty_store import FaultRule, FaultyStore
from test_wal_pack import StoreStaging, _stage
from test_wal_retention import push, seg

HEAD = struct.Struct(">4sBBHI")


def split(raw: bytes) -> tuple[WrappedKey, bytes]:
    """An archived object's wrapped key and every byte after it (the frames, and a pack's index)."""
    key_length = HEAD.unpack_from(raw)[4]
    return WrappedKey.from_json(json.loads(raw[HEAD.size : HEAD.size + key_length])), raw[HEAD.size + key_length :]


def objects(repo: Path) -> dict[str, bytes]:
    return {p.relative_to(repo).as_posix(): p.read_bytes() for p in (repo / "wal").rglob("*") if p.is_file() and p.name != "archive.json"}


def archive(repo: Path, tmp_path: Path) -> dict[str, bytes]:
    """Segments 1-2 pushed by a host (an object each), a history file, and segments 3-5 packed by the WAL worker's code."""
    push(repo, tmp_path, seg(1, 1), seg(1, 2))
    push(repo, tmp_path, "00000002.history", data=b"1\t0/300000\tno recovery target specified\n")
    repository = Repository.open(LocalStore(repo))
    keys = LocalKeyFile.open(default_key_file(repository.config.id))
    staging = StoreStaging(repository.store)  # type: ignore[arg-type]
    source = tmp_path / "packed"
    source.mkdir()
    process_staged_files(repository, keys, staging, "pg", _stage(repository, staging, source, [seg(1, n) for n in (3, 4, 5)]), pack_files=3)
    assert [k.rpartition("/")[2] for k in staging.puts] == ["pack-00000003-00000004-00000005"]
    files = {name: (source / name).read_bytes() for name in (seg(1, 3), seg(1, 4), seg(1, 5))}
    files |= {name: (tmp_path / "src" / name).read_bytes() for name in (seg(1, 1), seg(1, 2), "00000002.history")}
    return files


def test_rekey_rewraps_every_wal_object_and_pack_and_fetch_needs_the_new_key(repo: Path, tmp_path: Path) -> None:
    files = archive(repo, tmp_path)
    before = objects(repo)
    assert len(before) == 4  # two segments, the history file, one pack of three
    old_key = {split(raw)[0].key_id for raw in before.values()}
    new_file = tmp_path / "new.key"

    result = run_braid("rekey", "--repo", str(repo), "--new-key-file", str(new_file), "--json")

    assert result.code == 0, result.stderr
    report = json.loads(result.out)
    assert report["wal"] == {"rewrapped": 4, "already": 0, "failed": []} and report["config_switched"]
    after = objects(repo)
    assert sorted(after) == sorted(before)
    for key, raw in after.items():
        wrapped, rest = split(raw)
        old_wrapped, old_rest = split(before[key])
        assert wrapped.key_id == report["key_id"] and {wrapped.key_id} != old_key, key
        assert wrapped.context == old_wrapped.context, "still bound to its repository and file"
        assert rest == old_rest, f"{key}: only the wrapped key changes"
    (tmp_path / "fetched").mkdir()
    for name, data in files.items():
        dest = tmp_path / "fetched" / name
        got = run_braid("wal-fetch", "--repo", str(repo), "--name", "pg", "--prefetch", "0", "--key-file", str(new_file), name, str(dest))
        assert got.code == 0 and dest.read_bytes() == data, got.stderr
    refused = run_braid("wal-fetch", "--repo", str(repo), "--name", "pg", "--prefetch", "0", seg(1, 4), str(tmp_path / "old"))
    assert refused.code == 4 and "wrong key file" in refused.stderr and not (tmp_path / "old").exists(), refused.stderr
    again = json.loads(run_braid("rekey", "--repo", str(repo), "--new-key-file", str(new_file), "--json").out)
    assert again["wal"] == {"rewrapped": 0, "already": 4, "failed": []} and objects(repo) == after
    text = run_braid("rekey", "--repo", str(repo), "--new-key-file", str(new_file))
    assert text.code == 0 and "0 WAL object(s) re-wrapped, 4 already were" in text.stderr, text.stderr
    names = sorted(f.name for f, _key in archived_files(LocalStore(repo), "pg"))
    assert names == sorted(files)


def test_a_wal_object_that_cannot_be_rewrapped_fails_the_rekey_and_the_config_keeps_its_key(repo: Path, tmp_path: Path) -> None:
    archive(repo, tmp_path)
    config = json.loads((repo / "config.json").read_text())
    directory = repo / "wal" / "pg" / "0000000100000000"
    moved = directory / seg(1, 7)
    shutil.copyfile(directory / seg(1, 2), moved)  # an object copied under another file's name: its key names seg 2
    result = run_braid("rekey", "--repo", str(repo), "--new-key-file", str(tmp_path / "new.key"))
    assert result.code == 6, result.stderr
    key = f"wal/pg/0000000100000000/{seg(1, 7)}"
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"braid: error: 1 WAL object(s) could not be re-wrapped (the others were); first: {key}: ") and "moved or copied" in line
    assert line.endswith("the repository still names its old key: fix this and run rekey again")
    assert f"FAILED {key}" in result.out
    assert json.loads((repo / "config.json").read_text())["key"] == config["key"]
    moved.unlink()
    done = run_braid("rekey", "--repo", str(repo), "--new-key-file", str(tmp_path / "new.key"), "--json")
    assert done.code == 0 and json.loads(done.out)["wal"] == {"rewrapped": 0, "already": 4, "failed": []} and json.loads(done.out)["config_switched"]


def test_a_rekey_whose_wal_write_fails_keeps_every_object_openable_and_a_rerun_finishes(repo: Path, tmp_path: Path) -> None:
    """A PUT of a re-wrapped WAL object that fails (the store refused it): that object keeps its old key and still opens;
    the config stays on the old key; the rerun re-wraps what is left and switches."""
    files = archive(repo, tmp_path)
    opened = Repository.open(LocalStore(repo))
    old = LocalKeyFile.open(default_key_file(opened.config.id))
    new = LocalKeyFile.create(tmp_path / "new.key")
    target = {"type": "local", "key_id": new.key_id}
    pack = "wal/pg/0000000100000000/pack-00000003-00000004-00000005"
    faulty = Repository(FaultyStore(opened.store, [FaultRule("put", 1.0, "fail", pack)]), opened.config)  # type: ignore[arg-type]

    report = rekey_repository(faulty, old, new, old.rewrapper(new), target)

    assert (report.wal.rewrapped, [k for k, _e in report.wal.failed]) == (3, [pack]) and not report.config_switched
    assert "injected fault: put of " + pack in str(report.wal.failed[0][1])
    assert split((repo / pack).read_bytes())[0].key_id == old.key_id  # untouched: it still opens under the old key
    for name in (seg(1, 3), seg(1, 4), seg(1, 5)):
        assert bytes(fetch_wal_bytes(opened, old, "pg", name)) == files[name]
    assert json.loads((repo / "config.json").read_text())["key"]["key_id"] == old.key_id

    again = rekey_repository(Repository.open(LocalStore(repo)), old, new, old.rewrapper(new), target)
    assert (again.wal.rewrapped, again.wal.already, again.wal.failed, again.config_switched) == (1, 3, [], True)
    reopened = Repository.open(LocalStore(repo))
    for name, data in files.items():
        assert bytes(fetch_wal_bytes(reopened, new, "pg", name)) == data
