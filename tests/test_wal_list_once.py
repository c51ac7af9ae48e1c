"""Policy worker-list-once (braid.ops.wal_bundle_process): a batch's bundles share one LIST of their directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tests.test_wal_bundle import SLOT, cloud  # noqa: F401 (the fixture)
from tests.wal_segments import write_segment

from braid.format.wal import WalFile
from braid.format.wal_bundle import BUNDLE_FILES
from braid.ops.wal import archived_files
from braid.ops.wal_bundle_process import process_bundle
from braid.ops.wal_bundled import stage_bundle
from braid.ops.wal_pack_process import Batch
from braid.ops.wal_process import ALREADY, GONE, STORED, Processed
from braid.ports.store import ObjectInfo

SECOND = [f"0000000100000000{int(SLOT[0][16:], 16) + BUNDLE_FILES + n:08X}" for n in range(BUNDLE_FILES)]  # the next slot


def _counting_lists(repository) -> list[str]:  # type: ignore[no-untyped-def]
    listed: list[str] = []
    plain = repository.store.list

    def counted(prefix: str) -> Iterator[ObjectInfo]:
        listed.append(prefix)
        return plain(prefix)

    repository.store.list = counted
    return listed


def _staged(repository, staging, tmp_path: Path, names: list[str]) -> str:  # type: ignore[no-untyped-def]
    stage_bundle(repository, staging, "pg", [write_segment(tmp_path, n) for n in names])
    return staging.objects[next(k for k in staging.objects if k.endswith(f"{names[0]}.bundle"))][2]


def test_a_batchs_bundles_share_one_listing_and_a_slot_met_again_is_listed_again(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    repository, keys, staging = cloud
    first, second = _staged(repository, staging, tmp_path, SLOT), _staged(repository, staging, tmp_path, SECOND)
    listed = _counting_lists(repository)
    batch = Batch(repository, keys, staging, "pg", known={}, listings={})
    for slot, version in ((SLOT[0], first), (SECOND[0], second)):
        done = process_bundle(batch, WalFile.parse(slot), version, pack_files=10)
        assert isinstance(done, Processed) and done.outcome == STORED
    assert len(listed) == 1, "one LIST of the directory for the batch's two bundles"
    # A second message for the first bundle in the same batch (SQS delivers at least once): listed again, so what the
    # first stored is seen; the bundle is gone by then.
    again = process_bundle(batch, WalFile.parse(SLOT[0]), first, pack_files=10)
    assert isinstance(again, Processed) and again.outcome == GONE
    archived = sorted(f.name for f, _k in archived_files(repository.store, "pg") if f.name in SLOT + SECOND)
    assert archived == sorted(SLOT + SECOND), "each member archived once"


def test_a_slot_met_twice_sees_its_own_pack_and_the_policy_off_lists_per_bundle(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    repository, keys, staging = cloud
    first = _staged(repository, staging, tmp_path, SLOT)
    batch = Batch(repository, keys, staging, "pg", known={}, listings={})
    assert process_bundle(batch, WalFile.parse(SLOT[0]), first, pack_files=10).outcome == STORED  # type: ignore[union-attr]
    # The same bundle staged again (as if its removal had failed) and met again in the batch: the slot is listed again,
    # so its members are found archived and compared, never packed twice.
    again = _staged(repository, staging, tmp_path, SLOT)
    listed = _counting_lists(repository)
    done = process_bundle(batch, WalFile.parse(SLOT[0]), again, pack_files=10)
    assert isinstance(done, Processed) and [m.outcome for m in done.members] == [ALREADY] * BUNDLE_FILES and len(listed) == 1
    third = [f"0000000100000000{int(SECOND[0][16:], 16) + BUNDLE_FILES + n:08X}" for n in range(BUNDLE_FILES)]
    versions = [(SECOND[0], _staged(repository, staging, tmp_path, SECOND)), (third[0], _staged(repository, staging, tmp_path, third))]
    listed.clear()
    off = Batch(repository, keys, staging, "pg", known={})  # BRAID_WAL_LIST_ONCE=off: a LIST per bundle
    for slot, version in versions:
        assert process_bundle(off, WalFile.parse(slot), version, pack_files=10).outcome == STORED  # type: ignore[union-attr]
    assert len(listed) == 2, "one LIST per bundle, the policy off"
