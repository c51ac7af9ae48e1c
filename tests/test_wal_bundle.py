"""Staged WAL bundles (policy async-bundle) without the cloud: the format, the host's staging and checks, the worker's step.

The staged objects live in the repository's directory store, as S3 keeps them in the repository's bucket, so the
readers that take a bundle's head with a ranged GET (the sync push's check, the -X none gate) read what was staged.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from tests.test_wal_pack import CountingKeys, StoreStaging
from tests.wal_segments import segment_bytes, write_segment

from braid.adapters.local.store import LocalStore
from braid.errors import AlreadyExistsError, BackupError, IntegrityError, StorageError, UsageError, WalConflictError
from braid.format.layout import wal_staged_bundle, wal_staged_file, wal_staging_bundle_key, wal_staging_key
from braid.format.repository import Repository, RepositoryConfig
from braid.format.wal import WalFile
from braid.format.wal_bundle import BUNDLE_FILES, MAGIC, WalBundle, WalBundleError, bundle_slot, encode_bundle, parse_head
from braid.ops.wal import archived_files, read_archive_info
from braid.ops.wal_bundle_process import process_bundle
from braid.ops.wal_bundled import BUNDLED, stage_bundle
from braid.ops.wal_fetch import fetch_wal_bytes
from braid.ops.wal_pack_process import Batch
from braid.ops.wal_process import ALREADY, CONFLICT, GONE, STORED, Processed, process_staged
from braid.ops.wal_stage import stage_wal
from braid.ops.wal_wait import staged_names
from braid.pipeline.wal_batch import staged_record
from braid.ports.wal_staging import StagedWal

FIRST = "000000010000000000000001"
START = 2 * BUNDLE_FILES
SLOT = [f"0000000100000000{n:08X}" for n in range(START, START + BUNDLE_FILES)]  # one whole slot
NEXT = f"0000000100000000{START + BUNDLE_FILES:08X}"  # the next slot's first


class BucketStaging(StoreStaging):
    """Staged objects in the repository's store (create-only), their SHA-256 kept beside them, as S3 keeps both."""

    ranges = 0

    def put_staged(self, key: str, data: bytes | bytearray, sha256: str) -> None:
        assert hashlib.sha256(data).hexdigest() == sha256, "S3 refuses bytes that do not match the PUT's checksum"
        self.store.put(key, data, create_only=True)
        self.versions += 1
        self.objects[key] = (b"", sha256, f"v{self.versions}")

    def staged(self, key: str) -> StagedWal | None:
        found = self.objects.get(key)
        return None if found is None else StagedWal(key, 0, found[1], found[2])

    def read_staged(self, key: str, version: str | None = None) -> StagedWal | None:
        found = self.objects.get(key)
        if found is None or (version is not None and found[2] != version):
            return None
        data = self.store.get(key)
        if hashlib.sha256(data).hexdigest() != found[1]:
            raise IntegrityError(f"staged WAL {key} does not match its SHA-256: damaged")
        return StagedWal(key, len(data), found[1], found[2], data)

    def read_staged_range(self, key: str, version: str | None, start: int, length: int) -> bytes | None:
        found = self.objects.get(key)
        if found is None or (version is not None and found[2] != version):
            return None
        self.ranges += 1
        return self.store.get_range(key, start, length)

    def remove_staged(self, key: str, version: str | None) -> None:
        self.removed.append((key, version))
        if key in self.objects and (version is None or self.objects[key][2] == version):
            del self.objects[key]
            self.store.delete([key])


@pytest.fixture
def cloud(tmp_path: Path) -> tuple[Repository, CountingKeys, BucketStaging]:
    keys = CountingKeys.create(tmp_path / "master.key")
    config = RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, "2026-11-28T00:00:00Z", {"stack": "Braid"})
    repository = Repository.create(LocalStore(tmp_path / "repo"), config)
    staging = BucketStaging(repository.store)  # type: ignore[arg-type]
    stage_wal(repository, staging, "pg", write_segment(tmp_path, FIRST))  # the archive's first segment records it (version 3)
    process_staged(repository, keys, staging, "pg", WalFile.parse(FIRST))
    return repository, keys, staging


def _members(tmp_path: Path, names: list[str], **kwargs: object) -> list[Path]:
    return [write_segment(tmp_path, n, marker=b"PLAINTEXT-MARKER", **kwargs) for n in names]


def test_a_bundle_round_trips_and_its_key_names_its_slot() -> None:
    members = [(n, segment_bytes(n)) for n in SLOT]
    blob = encode_bundle(members)
    assert blob[:4] == MAGIC
    bundle = WalBundle.parse(blob, "test")
    assert bundle.index.slot == SLOT[0] and bundle.index.names == SLOT
    assert [bundle.member(e) for e in bundle.index.members] == [data for _n, data in members]
    assert all(bundle_slot(WalFile.parse(n)) == SLOT[0] for n in SLOT)
    assert bundle_slot(WalFile.parse(NEXT)) != SLOT[0]
    key = wal_staging_bundle_key("pg", SLOT[0])
    assert key == f"wal-staging/pg/{SLOT[0]}.bundle" and wal_staged_file(key) is None
    assert wal_staged_bundle(key) == ("pg", WalFile.parse(SLOT[0])) and wal_staged_bundle(wal_staging_key("pg", WalFile.parse(SLOT[0]))) is None
    record = staged_record(f"prefix/{key}", "v1")
    assert record is not None and record.bundle and record.file.name == SLOT[0] and record.prefix == "prefix"
    with pytest.raises(UsageError, match="distinct whole segments"):
        encode_bundle([members[1], members[0]])
    with pytest.raises(UsageError, match="distinct whole segments"):
        encode_bundle([members[0], (NEXT, b"x")])
    with pytest.raises(UsageError, match="only whole segments"):
        bundle_slot(WalFile.parse("00000002.history"))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:7], "truncated"),
        (lambda b: b[:40], "truncated"),
        (lambda b: b"BRWX" + b[4:], "bad magic"),
        (lambda b: b[:4] + b"\x02" + b[5:], "version 2 is not supported"),
        (lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:], "index does not match its SHA-256"),
        (lambda b: b[:-1], "truncated or damaged"),
    ],
)
def test_a_truncated_or_damaged_bundle_is_refused_with_a_typed_error(damage, message: str) -> None:  # type: ignore[no-untyped-def]
    blob = encode_bundle([(n, segment_bytes(n)[: 1 << 16]) for n in SLOT[:2]])
    with pytest.raises(WalBundleError, match=message) as caught:
        WalBundle.parse(damage(blob), "staged WAL bundle test")
    assert isinstance(caught.value, IntegrityError) and caught.value.exit_code == 6


def test_a_damaged_member_is_refused_by_its_recorded_sha256() -> None:
    blob = bytearray(encode_bundle([(n, segment_bytes(n)[: 1 << 16]) for n in SLOT[:2]]))
    blob[-5] ^= 1
    bundle = WalBundle.parse(bytes(blob), "test")
    assert bundle.member(bundle.index.members[0]) == segment_bytes(SLOT[0])[: 1 << 16]
    with pytest.raises(WalBundleError, match=f"member {SLOT[1]} does not match"):
        bundle.member(bundle.index.members[1])
    head = parse_head(bytes(blob), "test")  # the head alone is enough for a reader of names and checksums
    assert head.entry(SLOT[1]) is not None and head.entry(FIRST) is None


def test_a_backlog_is_one_staged_object_and_the_worker_makes_one_pack(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    assert read_archive_info(repository.store, "pg").may_stage_bundles  # type: ignore[union-attr]
    results = stage_bundle(repository, staging, "pg", _members(tmp_path, SLOT))
    key = wal_staging_bundle_key("pg", SLOT[0])
    assert [r.outcome for r in results] == [BUNDLED] * BUNDLE_FILES  # type: ignore[union-attr]
    assert list(staging.objects) == [key], "one PUT for the slot"
    assert staged_names(repository.store, "pg") == set(SLOT), "the -X none gate sees the members"
    for name in SLOT:  # wal-fetch of a segment still in staging
        assert bytes(fetch_wal_bytes(repository, keys, "pg", name, staging)) == (tmp_path / name).read_bytes()
    CountingKeys.generated = 0
    done = process_bundle(Batch(repository, keys, staging, "pg", known={}), WalFile.parse(SLOT[0]), "v2", pack_files=10)
    assert isinstance(done, Processed) and [m.outcome for m in done.members] == [STORED] * BUNDLE_FILES
    assert CountingKeys.generated == 1 and staging.puts[-1].rpartition("/")[2].startswith("pack-")
    assert not staging.objects and staging.removed[-1] == (key, "v2"), "the bundle's version removed once all are stored"
    assert b"PLAINTEXT-MARKER" not in repository.store.get(staging.puts[-1])
    assert sorted(f.name for f, _k in archived_files(repository.store, "pg") if f.name in SLOT) == SLOT
    for name in SLOT:
        assert bytes(fetch_wal_bytes(repository, keys, "pg", name)) == (tmp_path / name).read_bytes()
    again = process_bundle(Batch(repository, keys, staging, "pg"), WalFile.parse(SLOT[0]), "v2", pack_files=10)
    assert isinstance(again, Processed) and again.outcome == GONE, "a redelivery after the removal finds nothing"


def test_with_the_pack_policy_off_a_bundles_members_are_one_object_each(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    stage_bundle(repository, staging, "pg", _members(tmp_path, SLOT[:3]))
    done = process_bundle(Batch(repository, keys, staging, "pg"), WalFile.parse(SLOT[0]), None, pack_files=1)
    assert isinstance(done, Processed) and [m.outcome for m in done.members] == [STORED] * 3
    assert staging.puts[-3:] == [f"wal/pg/0000000100000000/{n}" for n in SLOT[:3]] and not staging.objects


def test_a_worker_stopped_after_the_pack_leaves_the_bundle_and_the_redelivery_removes_it(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The DELETE of the bundle fails (as a worker killed between the pack's PUT and it): the message fails, the bundle
    stays; the redelivery finds every member packed, compares them by their authenticated bytes and removes it."""
    repository, keys, staging = cloud
    paths = _members(tmp_path, SLOT[:4])
    stage_bundle(repository, staging, "pg", paths)
    key = wal_staging_bundle_key("pg", SLOT[0])
    remove = staging.remove_staged

    def stopped(key: str, version: str | None) -> None:
        raise StorageError(f"injected: DELETE {key} failed")

    staging.remove_staged = stopped  # type: ignore[method-assign]
    failed = process_bundle(Batch(repository, keys, staging, "pg"), WalFile.parse(SLOT[0]), None, pack_files=10)
    assert isinstance(failed, StorageError) and key in staging.objects
    packs = [k for k in staging.puts if "pack-" in k]
    staging.remove_staged = remove  # type: ignore[method-assign]
    again = process_bundle(Batch(repository, keys, staging, "pg"), WalFile.parse(SLOT[0]), None, pack_files=10, overlap=False)
    assert isinstance(again, Processed) and [m.outcome for m in again.members] == [ALREADY] * 4
    assert [k for k in staging.puts if "pack-" in k] == packs, "nothing packed again"
    assert not staging.objects, "no raw byte left"


def test_a_bad_member_fails_the_bundle_but_the_good_ones_are_stored_first(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    paths = _members(tmp_path, SLOT[:2]) + [write_segment(tmp_path, SLOT[2], sysid=42)]  # another cluster's segment
    blob = encode_bundle([(p.name, p.read_bytes()) for p in paths])  # staged by hand: the host would refuse it
    key = wal_staging_bundle_key("pg", SLOT[0])
    staging.put_staged(key, blob, hashlib.sha256(blob).hexdigest())
    failed = process_bundle(Batch(repository, keys, staging, "pg"), WalFile.parse(SLOT[0]), None, pack_files=10)
    assert isinstance(failed, IntegrityError) and f"{SLOT[2]} is from the cluster with system identifier 42" in str(failed), failed
    assert key in staging.objects, "the bundle stays for the redelivery and the dead-letter queue"
    for name in SLOT[:2]:  # the good members are in their final form
        assert bytes(fetch_wal_bytes(repository, keys, "pg", name)) == (tmp_path / name).read_bytes()
    again = process_bundle(Batch(repository, keys, staging, "pg"), WalFile.parse(SLOT[0]), None, pack_files=10)
    assert type(again) is type(failed) and key in staging.objects


def test_a_redelivered_bundle_compares_its_members_and_is_removed(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    paths = _members(tmp_path, SLOT[:3])
    for path in paths[:2]:  # two members archived already (pushed alone before), one of them with other bytes
        stage_wal(repository, staging, "pg", path)
        process_staged(repository, keys, staging, "pg", WalFile.parse(path.name))
    other = bytearray(paths[1].read_bytes())
    other[-10] ^= 1
    blob = encode_bundle([(paths[0].name, paths[0].read_bytes()), (paths[1].name, bytes(other)), (paths[2].name, paths[2].read_bytes())])
    staging.put_staged(wal_staging_bundle_key("pg", SLOT[0]), blob, hashlib.sha256(blob).hexdigest())
    done = process_bundle(Batch(repository, keys, staging, "pg"), WalFile.parse(SLOT[0]), None, pack_files=10, overlap=False)
    assert isinstance(done, Processed) and [m.outcome for m in done.members] == [ALREADY, CONFLICT, STORED]
    assert "different content" in done.members[1].detail and not staging.objects, "no raw byte left"
    assert bytes(fetch_wal_bytes(repository, keys, "pg", SLOT[1])) == paths[1].read_bytes(), "the archive keeps its copy"


def test_the_host_compares_a_push_with_a_bundled_member(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    paths = _members(tmp_path, SLOT[:3])
    stage_bundle(repository, staging, "pg", paths)
    again = tmp_path / "again"
    again.mkdir()
    duplicate = write_segment(again, SLOT[1], marker=b"PLAINTEXT-MARKER")
    assert stage_wal(repository, staging, "pg", duplicate).outcome == ALREADY  # same bytes: accepted
    other = tmp_path / "other"
    other.mkdir()
    conflicting = write_segment(other, SLOT[2], seed=1)
    with pytest.raises(WalConflictError) as caught:
        stage_wal(repository, staging, "pg", conflicting)
    sums = (hashlib.sha256(paths[2].read_bytes()).hexdigest(), hashlib.sha256(conflicting.read_bytes()).hexdigest())
    assert caught.value.exit_code == 7 and all(s in str(caught.value) for s in sums)
    # The pusher, again for the slot (a second life): the bundle is there, so each file goes alone, compared with it
    # (the refused push above left its staged copy for the worker to refuse: a third variant is compared with the bundle).
    third = tmp_path / "third"
    third.mkdir()
    results = stage_bundle(repository, staging, "pg", [paths[0], write_segment(third, SLOT[2], seed=2)])
    assert results[0].outcome == ALREADY and isinstance(results[1], WalConflictError)  # type: ignore[union-attr]


def test_a_version_2_archive_and_a_single_segment_are_never_bundled(tmp_path: Path) -> None:
    keys = CountingKeys.create(tmp_path / "master.key")
    config = RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, "2026-11-28T00:00:00Z", {"stack": "Braid"})
    repository = Repository.create(LocalStore(tmp_path / "repo"), config)
    staging = BucketStaging(repository.store)  # type: ignore[arg-type]
    from tests.wal_segments import SYSID

    info = b'{"format": "braid-wal-archive", "name": "pg", "segment_size": 1048576, "system_identifier": "%d", "version": 2}'
    repository.store.put("wal/pg/archive.json", info % SYSID, create_only=True)
    stage_bundle(repository, staging, "pg", _members(tmp_path, SLOT[:3]))
    assert sorted(staging.objects) == [wal_staging_key("pg", WalFile.parse(n)) for n in SLOT[:3]], "a reader of version 2 reads no bundle"
    with pytest.raises(AlreadyExistsError):
        repository.store.put("wal/pg/archive.json", b"{}", create_only=True)


def test_the_pusher_groups_a_slots_wanted_segments_only_where_the_policy_and_the_record_allow(tmp_path: Path) -> None:
    from braid.cli.wal_pusher import Pusher
    from braid.ops.wal import ArchiveInfo

    wanted = [(n, tmp_path / n) for n in [*SLOT[:3], NEXT, "00000002.history", f"{SLOT[3]}.partial"]]
    pusher = object.__new__(Pusher)
    pusher.bundling, pusher.bundled, pusher.record_read = True, set(), 0.0
    pusher.record = ArchiveInfo("pg", 1, 1 << 20, 3)
    units = pusher.tasks(wanted)
    assert [[f for f, _p in unit] for unit in units] == [SLOT[:3], [NEXT], ["00000002.history"], [f"{SLOT[3]}.partial"]]
    pusher.bundled.add(SLOT[0])  # bundled once in this pusher's life: its later segments go alone
    assert all(len(unit) == 1 for unit in pusher.tasks(wanted))
    pusher.bundled.clear()
    pusher.record = ArchiveInfo("pg", 1, 1 << 20, 2)  # an archive whose readers may predate bundles
    assert all(len(unit) == 1 for unit in pusher.tasks(wanted))
    pusher.record, pusher.bundling = ArchiveInfo("pg", 1, 1 << 20, 3), False  # BRAID_WAL_BUNDLE=off
    assert all(len(unit) == 1 for unit in pusher.tasks(wanted))


def test_a_file_that_cannot_be_bundled_fails_alone_and_the_others_are_bundled(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, _keys, staging = cloud
    paths = _members(tmp_path, SLOT[:2]) + [write_segment(tmp_path, SLOT[2], sysid=42), tmp_path / SLOT[3], *_members(tmp_path, SLOT[4:5])]
    results = stage_bundle(repository, staging, "pg", paths)
    assert [getattr(r, "outcome", None) for r in results] == [BUNDLED, BUNDLED, None, None, BUNDLED]
    assert isinstance(results[2], IntegrityError) and "system identifier 42" in str(results[2])
    assert isinstance(results[3], BackupError) and str(results[3]) == f"WAL file {tmp_path / SLOT[3]} not found"
    head = parse_head(repository.store.get(wal_staging_bundle_key("pg", SLOT[0])), "test")
    assert head.names == [SLOT[0], SLOT[1], SLOT[4]] and list(staging.objects) == [wal_staging_bundle_key("pg", SLOT[0])]


def test_a_host_with_the_key_records_version_2_and_the_worker_version_3(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Only the stack's archives may stage bundles: a host that stores files itself keeps the record older readers read."""
    from braid.ops.wal_push import push_wal

    repository, keys, _staging = cloud
    assert read_archive_info(repository.store, "pg").version == 3  # type: ignore[union-attr]
    push_wal(repository, keys, "local", write_segment(tmp_path, FIRST))
    assert read_archive_info(repository.store, "local").version == 2  # type: ignore[union-attr]
