"""Policy sync-bundle (braid.ops.wal_lookahead): a plain wal-push at a backlog stages its ready slot-mates in one PUT.

Each call is what PostgreSQL runs: one file, in order, its `.ready` renamed `.done` once the call exits 0. The
staged objects live in the repository's directory store, as S3 keeps them (tests.test_wal_bundle.BucketStaging).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from tests.test_wal_bundle import SLOT, BucketStaging, cloud  # noqa: F401 (the fixture)
from tests.wal_segments import write_segment

from braid.errors import WalConflictError
from braid.format.layout import wal_staging_bundle_key, wal_staging_key
from braid.format.repository import Repository
from braid.format.wal import WalFile
from braid.format.wal_bundle import parse_head
from braid.ops.wal_bundle_process import process_bundle
from braid.ops.wal_bundled import BUNDLED
from braid.ops.wal_fetch import fetch_wal_bytes
from braid.ops.wal_lookahead import Looked, ready_slot_mates, stage_with_mates
from braid.ops.wal_pack_process import Batch, process_staged_files
from braid.ops.wal_process import ALREADY, STORED, Processed
from braid.ops.wal_stage import STAGED, stage_wal


def _pg_wal(tmp_path: Path, names: list[str], **kwargs: object) -> Path:
    """A pg_wal directory holding `names`, each marked ready as PostgreSQL marks a finished segment."""
    wal = tmp_path / "pg_wal"
    (wal / "archive_status").mkdir(parents=True, exist_ok=True)
    for name in names:
        write_segment(wal, name, marker=b"PLAINTEXT-MARKER", **kwargs)
        (wal / "archive_status" / f"{name}.ready").touch()
    return wal


def _archived(wal: Path, name: str) -> None:
    os.rename(wal / "archive_status" / f"{name}.ready", wal / "archive_status" / f"{name}.done")


def test_a_backlog_is_one_put_and_the_next_calls_find_their_segment_in_it(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    repository, keys, staging = cloud
    wal = _pg_wal(tmp_path, SLOT)
    assert ready_slot_mates(wal / SLOT[0]) == [wal / n for n in SLOT[1:]]
    before = staging.versions
    first = stage_with_mates(repository, staging, "pg", wal / SLOT[0])
    key = wal_staging_bundle_key("pg", SLOT[0])
    assert (first.outcome, first.key) == (BUNDLED, key) and list(staging.objects) == [key], "one PUT for the slot"
    _archived(wal, SLOT[0])
    for name in SLOT[1:]:  # PostgreSQL's next calls: each finds its segment in the bundle, compared, and stages nothing
        result = stage_with_mates(repository, staging, "pg", wal / name)
        assert (result.outcome, result.key) == (ALREADY, key)
        _archived(wal, name)
    assert list(staging.objects) == [key] and staging.versions == before + 1, "no PUT after the bundle's"
    for name in SLOT:  # wal-fetch of a segment still in staging
        assert bytes(fetch_wal_bytes(repository, keys, "pg", name, staging)) == (wal / name).read_bytes()
    done = process_bundle(Batch(repository, keys, staging, "pg", known={}), WalFile.parse(SLOT[0]), "v2", pack_files=10)
    assert isinstance(done, Processed) and [m.outcome for m in done.members] == [STORED] * len(SLOT)
    assert not staging.objects and b"PLAINTEXT-MARKER" not in repository.store.get(staging.puts[-1])
    for name in SLOT:
        assert bytes(fetch_wal_bytes(repository, keys, "pg", name)) == (wal / name).read_bytes()


def test_quiet_policy_off_or_not_a_segment_is_staged_alone(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    repository, _keys, staging = cloud
    wal = _pg_wal(tmp_path, SLOT[:3])
    (wal / "archive_status" / f"{SLOT[2]}.ready").unlink()  # written, not finished: PostgreSQL has not marked it ready
    off = stage_with_mates(repository, staging, "pg", wal / SLOT[0], bundle=False)  # BRAID_WAL_SYNC_BUNDLE=off
    assert off.outcome == STAGED and list(staging.objects) == [wal_staging_key("pg", WalFile.parse(SLOT[0]))]
    _archived(wal, SLOT[0])
    quiet = stage_with_mates(repository, staging, "pg", wal / SLOT[1])  # its only later neighbour is not ready
    assert quiet.outcome == STAGED and len(staging.objects) == 2
    history = wal / "00000002.history"
    history.write_text("1\t0/3000000\tno recovery target specified\n")
    assert ready_slot_mates(history) == [] and stage_with_mates(repository, staging, "pg", history).outcome == STAGED


def _archived_elsewhere(fixture, tmp_path: Path, names: tuple[str, ...]) -> list:  # type: ignore[no-untyped-def]
    """Another cluster's copies of `names` (in tmp_path/earlier), staged and archived first (one pack); the worker's outcomes."""
    repository, keys, staging = fixture
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for name in names:
        stage_wal(repository, staging, "pg", write_segment(earlier, name, seed=1))
    return process_staged_files(repository, keys, staging, "pg", [(WalFile.parse(n), None) for n in names], pack_files=10)


def test_a_slot_mate_archived_with_other_bytes_is_left_out_and_its_own_call_refuses_it(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    repository, keys, staging = cloud
    done = _archived_elsewhere(cloud, tmp_path, (SLOT[2], SLOT[5]))
    assert all(isinstance(d, Processed) and d.outcome == STORED for d in done) and staging.puts[-1].rpartition("/")[2].startswith("pack-")
    wal = _pg_wal(tmp_path, SLOT[:4])
    assert stage_with_mates(repository, staging, "pg", wal / SLOT[0]).outcome == BUNDLED
    head = parse_head(repository.store.get(wal_staging_bundle_key("pg", SLOT[0])), "test")
    assert head.names == [SLOT[0], SLOT[1], SLOT[3]], "the archived mate is left for its own call"
    for name in SLOT[:2]:
        _archived(wal, name)
    with pytest.raises(WalConflictError) as caught:
        stage_with_mates(repository, staging, "pg", wal / SLOT[2])
    sums = (hashlib.sha256((tmp_path / "earlier" / SLOT[2]).read_bytes()).hexdigest(), hashlib.sha256((wal / SLOT[2]).read_bytes()).hexdigest())
    assert caught.value.exit_code == 7 and all(s in str(caught.value) for s in sums)
    assert stage_with_mates(repository, staging, "pg", wal / SLOT[3]).outcome == ALREADY


def test_a_push_whose_bundled_copy_holds_other_bytes_is_refused_before_any_put(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    repository, _keys, staging = cloud
    wal = _pg_wal(tmp_path, SLOT[:2])
    stage_with_mates(repository, staging, "pg", wal / SLOT[0])
    other = tmp_path / "other"
    other.mkdir()
    staged = dict(staging.objects)
    with pytest.raises(WalConflictError) as caught:
        stage_with_mates(repository, staging, "pg", write_segment(other, SLOT[1], seed=3))
    assert caught.value.exit_code == 7 and "already staged" in str(caught.value)
    assert staging.objects == staged, "nothing staged for the refused push"


def test_an_archive_that_may_not_stage_bundles_gets_one_object_per_call(tmp_path: Path) -> None:
    from tests.test_wal_pack import CountingKeys
    from tests.wal_segments import SYSID

    from braid.adapters.local.store import LocalStore
    from braid.format.repository import RepositoryConfig

    keys = CountingKeys.create(tmp_path / "master.key")
    config = RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, "2026-11-28T00:00:00Z", {"stack": "Braid"})
    repository = Repository.create(LocalStore(tmp_path / "repo"), config)
    staging = BucketStaging(repository.store)  # type: ignore[arg-type]
    info = b'{"format": "braid-wal-archive", "name": "pg", "segment_size": 1048576, "system_identifier": "%d", "version": 2}'
    repository.store.put("wal/pg/archive.json", info % SYSID, create_only=True)
    wal = _pg_wal(tmp_path, SLOT[:3])
    assert stage_with_mates(repository, staging, "pg", wal / SLOT[0]).outcome == STAGED
    assert list(staging.objects) == [wal_staging_key("pg", WalFile.parse(SLOT[0]))], "a reader of version 2 reads no bundle"


def test_a_call_answers_from_its_slots_bundle_before_reading_the_config(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from braid.ops.wal_lookahead import look_in_bundle

    repository, _keys, staging = cloud
    wal = _pg_wal(tmp_path, SLOT[:2])
    assert look_in_bundle(repository.store, "pg", wal / SLOT[0]) == Looked(None), "no bundle yet: a 404"
    stage_with_mates(repository, staging, "pg", wal / SLOT[0])
    looked = look_in_bundle(repository.store, "pg", wal / SLOT[1])
    assert looked is not None and looked.result is not None and (looked.result.outcome, looked.result.key) == (ALREADY, wal_staging_bundle_key("pg", SLOT[0]))
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(WalConflictError) as caught:
        look_in_bundle(repository.store, "pg", write_segment(other, SLOT[1], seed=4))
    assert caught.value.exit_code == 7 and "already staged" in str(caught.value)
    missing = look_in_bundle(repository.store, "pg", write_segment(other, SLOT[2]))
    assert missing is not None and missing.result is None and missing.index is not None, "the slot is bundled, without it"
    history = wal / "00000002.history"
    history.write_text("1\t0/3000000\tno recovery target specified\n")
    assert look_in_bundle(repository.store, "pg", history) is None


def test_a_call_whose_own_segment_is_archived_with_other_bytes_is_refused_and_bundles_nothing(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    repository, keys, staging = cloud
    _archived_elsewhere(cloud, tmp_path, (SLOT[0], SLOT[5]))
    wal = _pg_wal(tmp_path, SLOT[:3])
    with pytest.raises(WalConflictError) as caught:
        stage_with_mates(repository, staging, "pg", wal / SLOT[0])
    assert caught.value.exit_code == 7 and "already archived" in str(caught.value)
    assert wal_staging_bundle_key("pg", SLOT[0]) not in staging.objects, "nothing bundled with a refused segment"
