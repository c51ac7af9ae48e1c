"""The WAL worker's policy `wal-pack` without the cloud: packs written, read, verified, pruned, and each failure path.

braid.ops.wal_pack_process over a directory repository (the archived objects are real files, so LIST, ranged GETs
and prune's deletes are the store's) and the in-memory staging of tests/test_wal_stage.py.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tests.test_wal_stage import MemoryStaging
from tests.wal_segments import write_segment

from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.errors import AlreadyExistsError, IntegrityError, StorageError, WalConflictError, WalNotArchivedError
from braid.format.layout import wal_staging_key
from braid.format.repository import Repository, RepositoryConfig
from braid.format.wal import WalFile
from braid.format.wal_pack import pack_basename, pack_members
from braid.ops.wal import archived_files, read_archive_info, wal_range_present
from braid.ops.wal_fetch import fetch_wal_bytes
from braid.ops.wal_pack_process import process_staged_files
from braid.ops.wal_packed import PackListing
from braid.ops.wal_process import ALREADY, CONFLICT, GONE, STORED, Processed
from braid.ops.wal_stage import STAGED, stage_wal

NAMES = [f"0000000100000000000000{n:02X}" for n in range(3, 8)]


class StoreStaging(MemoryStaging):
    """The in-memory staging whose archived objects are the repository store's (create-only), as S3 holds them."""

    def __init__(self, store: LocalStore) -> None:
        super().__init__()
        self.store = store
        self.puts: list[str] = []
        self.fail_put = False

    def put_archived(self, key: str, blob: bytes, sha256: str) -> None:
        if self.fail_put:
            raise StorageError(f"injected: PUT {key} failed")
        self.puts.append(key)
        self.store.put(key, blob, create_only=True)


class CountingKeys(LocalKeyFile):
    generated = 0

    def generate_data_key(self, context):  # type: ignore[no-untyped-def]
        CountingKeys.generated += 1
        return super().generate_data_key(context)


@pytest.fixture
def cloud(tmp_path: Path) -> tuple[Repository, LocalKeyFile, StoreStaging]:
    keys = CountingKeys.create(tmp_path / "master.key")
    CountingKeys.generated = 0
    config = RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, "2026-11-28T00:00:00Z", {"stack": "Braid"})
    repository = Repository.create(LocalStore(tmp_path / "repo"), config)
    return repository, keys, StoreStaging(repository.store)  # type: ignore[arg-type]


def _stage(repository: Repository, staging: StoreStaging, tmp_path: Path, names: list[str], **kwargs: object) -> list[tuple[WalFile, str | None]]:
    files = []
    for name in names:
        stage_wal(repository, staging, "pg", write_segment(tmp_path, name, marker=b"PLAINTEXT-MARKER", **kwargs))
        files.append((WalFile.parse(name), staging.objects[wal_staging_key("pg", WalFile.parse(name))][2]))
    return files


def test_pack_keys_name_their_members_and_nothing_else_parses() -> None:
    members = [WalFile.parse(n) for n in NAMES[:3]]
    assert pack_basename(members) == "pack-00000003-00000004-00000005"
    assert [m.name for m in pack_members("0000000100000000", "pack-00000003-00000004-00000005") or []] == NAMES[:3]
    for other in ("pack-", "pack-00000004-00000003", "pack-3-4", "000000010000000000000003", "pack-00000003-00000003"):
        assert pack_members("0000000100000000", other) is None, other
    with pytest.raises(Exception, match="one directory"):
        pack_basename([WalFile.parse("000000010000000000000003"), WalFile.parse("000000010000000100000003")])


def test_a_batch_is_one_pack_one_key_and_every_reader_finds_its_files(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    first = _stage(repository, staging, tmp_path, NAMES[:1])
    assert process_staged_files(repository, keys, staging, "pg", first, pack_files=10)[0].outcome == STORED  # type: ignore[union-attr]
    assert read_archive_info(repository.store, "pg").version == 3  # type: ignore[union-attr]
    CountingKeys.generated = 0
    files = _stage(repository, staging, tmp_path, NAMES[1:])
    done = process_staged_files(repository, keys, staging, "pg", files, pack_files=10)
    assert [d.outcome for d in done] == [STORED] * 4  # type: ignore[union-attr]
    assert staging.puts[-1] == "wal/pg/0000000100000000/pack-00000004-00000005-00000006-00000007" and CountingKeys.generated == 1
    assert not staging.objects, "every staged file removed"
    blob = repository.store.get(staging.puts[-1])
    assert b"PLAINTEXT-MARKER" not in blob
    for name in NAMES:  # the single object and the pack's members, each verified
        assert bytes(fetch_wal_bytes(repository, keys, "pg", name)) == (tmp_path / name).read_bytes()
    assert sorted(f.name for f, _key in archived_files(repository.store, "pg")) == NAMES
    assert wal_range_present(repository, "pg", 1, "0/300000", "0/800000") == []  # the -X none gate's check
    assert wal_range_present(repository, "pg", 1, "0/300000", "0/900000") == ["000000010000000000000008"]
    with pytest.raises(WalNotArchivedError):
        fetch_wal_bytes(repository, keys, "pg", "000000010000000000000008")


def test_with_the_policy_off_every_file_is_one_object(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    files = _stage(repository, staging, tmp_path, NAMES)
    assert [d.outcome for d in process_staged_files(repository, keys, staging, "pg", files, pack_files=1)] == [STORED] * 5  # type: ignore[union-attr]
    assert staging.puts == [f"wal/pg/0000000100000000/{n}" for n in NAMES] and CountingKeys.generated == 5


def test_a_version_1_archive_is_never_packed(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    info = b'{"format": "braid-wal-archive", "name": "pg", "segment_size": 1048576, "system_identifier": "%d", "version": 1}'
    from tests.wal_segments import SYSID

    repository.store.put("wal/pg/archive.json", info % SYSID, create_only=True)
    lists: list[str] = []
    listing = repository.store.list
    repository.store.list = lambda prefix: lists.append(prefix) or listing(prefix)  # type: ignore[method-assign]
    files = _stage(repository, staging, tmp_path, NAMES[:3])
    assert lists == [], "a version 1 record holds no packs: wal-push does not list them"
    assert [d.outcome for d in process_staged_files(repository, keys, staging, "pg", files, pack_files=10)] == [STORED] * 3  # type: ignore[union-attr]
    assert all("pack-" not in key for key in staging.puts)


def test_a_bad_file_is_left_out_of_the_pack_and_fails_alone(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    files = _stage(repository, staging, tmp_path, NAMES[:1]) 
    process_staged_files(repository, keys, staging, "pg", files, pack_files=10)
    files = _stage(repository, staging, tmp_path, NAMES[1:])
    key = wal_staging_key("pg", files[1][0])
    data, sha, version = staging.objects[key]
    staging.objects[key] = (data[:-1] + b"X", sha, version)  # damaged after S3 checked it
    done = process_staged_files(repository, keys, staging, "pg", files, pack_files=10)
    assert isinstance(done[1], IntegrityError) and "does not match its SHA-256" in str(done[1])
    assert [d.outcome for d in done if isinstance(d, Processed)] == [STORED] * 3
    assert staging.puts[-1].endswith("pack-00000004-00000006-00000007") and key in staging.objects, "kept for the retry"


def test_a_failed_pack_put_fails_its_files_and_the_redelivery_packs_them(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    process_staged_files(repository, keys, staging, "pg", _stage(repository, staging, tmp_path, NAMES[:1]), pack_files=10)
    files = _stage(repository, staging, tmp_path, NAMES[1:])
    staging.fail_put = True
    done = process_staged_files(repository, keys, staging, "pg", files, pack_files=10)
    assert all(isinstance(d, StorageError) and "injected: PUT" in str(d) for d in done) and len(staging.objects) == 4
    staging.fail_put = False
    assert [d.outcome for d in process_staged_files(repository, keys, staging, "pg", files, pack_files=10)] == [STORED] * 4  # type: ignore[union-attr]


def test_a_redelivery_after_the_pack_is_already_and_a_conflict_is_refused(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    process_staged_files(repository, keys, staging, "pg", _stage(repository, staging, tmp_path, NAMES[:1]), pack_files=10)
    files = _stage(repository, staging, tmp_path, NAMES[1:3])
    saved = dict(staging.objects)
    process_staged_files(repository, keys, staging, "pg", files, pack_files=10)
    staging.objects.update(saved)  # the staged removals were lost (the function died): SQS delivers the batch again
    puts = list(staging.puts)
    again = process_staged_files(repository, keys, staging, "pg", files, pack_files=10)
    assert [d.outcome for d in again] == [ALREADY, ALREADY] and staging.puts == puts and not staging.objects  # type: ignore[union-attr]
    assert process_staged_files(repository, keys, staging, "pg", files, pack_files=10)[0].outcome == GONE  # type: ignore[union-attr]
    other = tmp_path / "other"
    other.mkdir()
    pushed = write_segment(other, NAMES[1], marker=b"PLAINTEXT-MARKER", seed=9)
    with pytest.raises(WalConflictError) as refused_push:  # the host's HEAD misses a packed file: its pack's index answers
        stage_wal(repository, staging, "pg", pushed)
    stored, digest = hashlib.sha256((tmp_path / NAMES[1]).read_bytes()).hexdigest(), hashlib.sha256(pushed.read_bytes()).hexdigest()
    assert f"archived sha256:{stored}" in str(refused_push.value) and f"pushed sha256:{digest}" in str(refused_push.value)
    assert refused_push.value.exit_code == 7
    conflict = [(WalFile.parse(NAMES[1]), staging.objects[wal_staging_key("pg", WalFile.parse(NAMES[1]))][2])]
    (refused,) = process_staged_files(repository, keys, staging, "pg", conflict, pack_files=10)  # PUT first: the worker refuses it too
    assert refused.outcome == CONFLICT and "archived sha256:" in refused.detail and not staging.objects  # type: ignore[union-attr]
    assert bytes(fetch_wal_bytes(repository, keys, "pg", NAMES[1])) == (tmp_path / NAMES[1]).read_bytes(), "nothing was overwritten"


def test_a_push_of_a_packed_file_is_compared_with_its_packs_index(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """wal-push of a file inside a pack: the same bytes are ALREADY (the staged copy left for the worker), other bytes
    exit 7 naming both checksums; the async pusher's listing lists a directory once; a version 1 record never lists."""
    repository, keys, staging = cloud
    process_staged_files(repository, keys, staging, "pg", _stage(repository, staging, tmp_path, NAMES[:1]), pack_files=10)
    process_staged_files(repository, keys, staging, "pg", _stage(repository, staging, tmp_path, NAMES[1:4]), pack_files=10)
    assert staging.puts[-1].endswith("pack-00000004-00000005-00000006") and not staging.objects
    lists: list[str] = []
    listing = repository.store.list
    repository.store.list = lambda prefix: lists.append(prefix) or listing(prefix)  # type: ignore[method-assign]
    assert stage_wal(repository, staging, "pg", tmp_path / NAMES[1]).outcome == ALREADY
    assert lists == ["wal/pg/0000000100000000/pack-"] and wal_staging_key("pg", WalFile.parse(NAMES[1])) in staging.objects
    process_staged_files(repository, keys, staging, "pg", [(WalFile.parse(NAMES[1]), None)], pack_files=10)  # the worker removes it
    assert not staging.objects
    lists.clear()  # the worker listed the directory too
    packs = PackListing()
    other = tmp_path / "other"
    other.mkdir()
    for name in NAMES[2:4]:
        with pytest.raises(WalConflictError, match=rf"{name} is already archived under 'pg' with different content \(archived sha256:[0-9a-f]{{64}}, pushed sha256:"):
            stage_wal(repository, staging, "pg", write_segment(other, name, seed=5), packs)
    assert lists == ["wal/pg/0000000100000000/pack-"], "one LIST for both files: the pusher's listing"
    assert stage_wal(repository, staging, "pg", write_segment(other, NAMES[4]), packs).outcome == STAGED
    assert len(lists) == 1


def test_a_damaged_pack_head_fails_the_push_with_its_own_line(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    process_staged_files(repository, keys, staging, "pg", _stage(repository, staging, tmp_path, NAMES[:1]), pack_files=10)
    process_staged_files(repository, keys, staging, "pg", _stage(repository, staging, tmp_path, NAMES[1:3]), pack_files=10)
    key = staging.puts[-1]
    (Path(repository.store.root) / key).write_bytes(b"XXXX" + repository.store.get(key)[4:])
    with pytest.raises(IntegrityError, match=rf"WAL pack .*{key}: not a Braid WAL pack \(bad magic\)") as damaged:
        stage_wal(repository, staging, "pg", tmp_path / NAMES[1])  # never taken for "not archived": it cannot be compared
    assert damaged.value.exit_code == IntegrityError.exit_code


def test_a_damaged_pack_is_refused_and_another_copy_is_read(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    process_staged_files(repository, keys, staging, "pg", _stage(repository, staging, tmp_path, NAMES[:1]), pack_files=10)
    process_staged_files(repository, keys, staging, "pg", _stage(repository, staging, tmp_path, NAMES[1:3]), pack_files=10)
    key = staging.puts[-1]
    path = Path(repository.store.root) / key  # type: ignore[attr-defined]
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 1  # in the last member's frame
    path.chmod(0o600)
    path.write_bytes(bytes(raw))
    assert bytes(fetch_wal_bytes(repository, keys, "pg", NAMES[1])) == (tmp_path / NAMES[1]).read_bytes(), "its other member still reads"
    with pytest.raises(IntegrityError, match="WAL pack .*00000005"):
        fetch_wal_bytes(repository, keys, "pg", NAMES[2])
    moved = key.replace("pack-00000004-00000005", "pack-00000006-00000007")  # a pack copied under other members' names
    repository.store.put(moved, bytes(path.read_bytes()), create_only=True)
    with pytest.raises(IntegrityError, match="the pack.s index lists .* its key"):
        fetch_wal_bytes(repository, keys, "pg", NAMES[3])
    repository.store.delete([moved])
    other = key.replace("wal/pg/", "wal/pg2/")  # the same members under another name: the key's context refuses it
    repository.store.put(other, bytes(path.read_bytes()), create_only=True)
    with pytest.raises(IntegrityError, match="moved or copied"):
        fetch_wal_bytes(repository, keys, "pg2", NAMES[1])

    class Unlisted(LocalStore):  # two deliveries racing: the second one's LIST saw no pack yet
        def list(self, prefix: str):  # type: ignore[no-untyped-def]
            return iter(())

    racing = Repository(Unlisted(repository.store.root), repository.config)  # type: ignore[attr-defined]
    process_staged_files(racing, keys, staging, "pg", _stage(repository, staging, tmp_path, NAMES[2:4]), pack_files=10)
    assert staging.puts[-1].endswith("pack-00000005-00000006")
    assert bytes(fetch_wal_bytes(repository, keys, "pg", NAMES[2])) == (tmp_path / NAMES[2]).read_bytes(), "the good copy is read"
    assert sorted(f.name for f, _key in archived_files(repository.store, "pg")).count(NAMES[2]) == 2


def test_prune_verify_and_fetch_through_the_cli_on_a_mixed_archive(tmp_path: Path, repo: Path) -> None:
    from braid.cli.compose import default_key_file
    from conftest import run_braid
    from test_wal_retention import base_backup, push, seg

    push(repo, tmp_path, seg(1, 1), seg(1, 2))  # a host with the key: one object per file
    repository = Repository.open(LocalStore(repo))
    keys = LocalKeyFile.open(default_key_file(repository.config.id))
    staging = StoreStaging(repository.store)  # type: ignore[arg-type]
    source = tmp_path / "packed"
    source.mkdir()
    files = _stage(repository, staging, source, [seg(1, n) for n in range(3, 9)])
    assert all(isinstance(d, Processed) for d in process_staged_files(repository, keys, staging, "pg", files, pack_files=3))
    assert [k.rpartition("/")[2] for k in staging.puts] == ["pack-00000003-00000004-00000005", "pack-00000006-00000007-00000008"]
    old = base_backup(repo, 1, 2)
    new = base_backup(repo, 1, 5)
    ok = run_braid("verify", "--repo", str(repo), "--wal", "--name", "pg")
    assert ok.code == 0 and f"{seg(1, 2)} .. {seg(1, 8)}: continuous" in ok.out, ok.out
    dest = tmp_path / "fetched"
    got = run_braid("wal-fetch", "--repo", str(repo), "--name", "pg", "--prefetch", "2", seg(1, 7), str(dest))
    assert got.code == 0 and dest.read_bytes() == (source / seg(1, 7)).read_bytes(), got.stderr
    missing = run_braid("wal-fetch", "--repo", str(repo), "--name", "pg", "--prefetch", "0", seg(1, 9), str(tmp_path / "missing"))
    assert missing.code == 1 and "is not in the WAL archive" in missing.stderr and not (tmp_path / "missing").exists()
    # 3 and 4 are before the kept backup's start, but their pack holds 5, which it needs: the pack stays.
    forget = run_braid("forget", "--repo", str(repo), old, "--dry-run")
    assert f"then 'braid prune' removes 2 WAL file(s) of pg, {seg(1, 1)} .. {seg(1, 2)}" in forget.out, forget.out
    doc = json.loads(run_braid("prune", "--repo", str(repo), "--keep-last", "1", "--dry-run", "--json").out)
    assert doc["wal"] == [{"name": "pg", "files": [seg(1, 1), seg(1, 2)], "kept_from": [{"backup": new, "timeline": 1, "segno": 5}]}]
    done = run_braid("prune", "--repo", str(repo), "--keep-last", "1")
    assert done.code == 0 and f"removed 2 WAL file(s) of pg, {seg(1, 1)} .. {seg(1, 2)}" in done.out, done.out
    assert sorted(f.name for f, _key in archived_files(repository.store, "pg")) == [seg(1, n) for n in range(3, 9)]
    push(repo, tmp_path, seg(1, 9))
    repository.store.delete([staging.puts[1]])  # a lost pack: verify names its three files as one gap
    gap = run_braid("verify", "--repo", str(repo), "--wal", "--name", "pg")
    assert gap.code == 6 and f"gap: {seg(1, 6)} .. {seg(1, 8)} (3 segment(s) missing)" in gap.out, gap.out


def test_a_duplicate_pack_put_is_compared_not_replaced(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    process_staged_files(repository, keys, staging, "pg", _stage(repository, staging, tmp_path, NAMES[:1]), pack_files=10)
    files = _stage(repository, staging, tmp_path, NAMES[1:3])
    original = staging.put_archived

    def racing(key: str, blob: bytes, sha256: str) -> None:  # another delivery stored the same pack between the LIST and the PUT
        original(key, blob, sha256)
        raise AlreadyExistsError(key)

    staging.put_archived = racing  # type: ignore[method-assign]
    assert [d.outcome for d in process_staged_files(repository, keys, staging, "pg", files, pack_files=10)] == [ALREADY, ALREADY]  # type: ignore[union-attr]
    assert not staging.objects



def test_worker_overlap_reads_the_next_member_while_this_one_is_checked_and_off_takes_turns(tmp_path: Path) -> None:
    import threading

    class WatchedStore(LocalStore):
        """archive.json is read on the main thread while a member is checked (known=None): it waits for the next member's read."""

        waited: list[bool] = []
        armed = False

        def get(self, key: str) -> bytes:
            if key.endswith("archive.json") and WatchedStore.armed and staging.reads:  # the first member's check
                WatchedStore.armed = False
                WatchedStore.waited.append(next_read.wait(30))
            return super().get(key)

    class WatchedStaging(StoreStaging):
        reads: list[tuple[str, str]] = []

        def read_staged(self, key, version=None):  # type: ignore[no-untyped-def]
            self.reads.append((key.rpartition("/")[2], threading.current_thread().name))
            if len(self.reads) == 2:
                next_read.set()
            return super().read_staged(key, version)

    next_read = threading.Event()
    keys = LocalKeyFile.create(tmp_path / "master.key")
    config = RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, "2026-11-28T00:00:00Z", {"stack": "Braid"})
    repository = Repository.create(WatchedStore(tmp_path / "repo"), config)
    staging = WatchedStaging(repository.store)  # type: ignore[arg-type]
    process_staged_files(repository, keys, staging, "pg", _stage(repository, staging, tmp_path, NAMES[:1]), pack_files=10)
    files = _stage(repository, staging, tmp_path, NAMES[1:3])
    staging.reads.clear()
    WatchedStore.armed = True
    done = process_staged_files(repository, keys, staging, "pg", files, pack_files=10, overlap=True)  # known=None: checked by a GET
    assert [d.outcome for d in done] == [STORED, STORED]  # type: ignore[union-attr]
    assert WatchedStore.waited == [True], "the second member was read while the first was checked"
    assert {thread for _name, thread in staging.reads} == {"wal-read_0"}

    next_read.set()  # off: the reads take turns with the codec, on the function's own thread
    files = _stage(repository, staging, tmp_path, NAMES[3:5])
    staging.reads.clear()
    done = process_staged_files(repository, keys, staging, "pg", files, pack_files=10, overlap=False)
    assert [d.outcome for d in done] == [STORED, STORED] and staging.puts[-1].endswith("pack-00000006-00000007")  # type: ignore[union-attr]
    assert {thread for _name, thread in staging.reads} == {threading.current_thread().name}
