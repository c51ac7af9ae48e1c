"""The scheduled prune moves old backups' chunks: PlanPrune decides, Sweep's "move" items copy, TallyPrune records.

The three steps in one process (support.prune_inline) on an `s3://`
repository served by moto on loopback, with real backups whose ids say
when they started. Each name's stored policy applies, else the stack's
`braid:storageClass` (PlanPrune's BRAID_STORAGE_CLASS); a failed move
item leaves no record, so the next run moves the rest; a later run that
removes a moved backup reports the early-deletion charge (from the
storage record's date, computed here independently).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from tests.conftest import run_braid

from braid import contract
from braid.cli.compose import open_key_service, open_repository
from braid.format.ids import BackupRef
from braid.format.layout import chunk_key, data_prefix
from braid.format.policy import KeepRules
from braid.format.repository import Repository
from braid.format.storage_class import GLACIER_IR, STANDARD, STANDARD_IA, Placement, StoragePolicy
from braid.ops.retention import save_policy
from braid.ops.storage_class import placements
from braid.pipeline.prune_plan import MOVE, SweepItem
from braid.ports.pipeline import RecordingPublisher
from support.prune_inline import InlinePruneRuns
from support.synthetic_backup import write_backup

pytestmark = pytest.mark.cloud

GB = 2**30
IA_PRICE = 0.0125


@pytest.fixture
def repository(aws_env: None, isolated_config: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Repository]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="plain")
    try:  # a prefix of its own: moto's buckets outlive a server within the process (tests/cloud/test_storage_class_host.py has r)
        assert run_braid("init", "--repo", "s3://plain/prune-classes", "--engine", "local", env=env).code == 0
        yield open_repository("s3://plain/prune-classes")
    finally:
        server.stop()


def classes_of(repository: Repository, ref: BackupRef) -> set[str | None]:
    return {info.storage_class for info in repository.store.list(data_prefix(ref))}


def test_the_scheduled_prune_moves_due_backups_by_policy_or_stack_default(repository: Repository, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = open_key_service(repository, None)
    now = datetime.now(UTC)
    oldest = write_backup(repository, keys, "pg", now - timedelta(days=100), chunks=3)
    old = write_backup(repository, keys, "pg", now - timedelta(days=40), chunks=3)
    young = write_backup(repository, keys, "pg", now - timedelta(days=1), chunks=3)
    other = write_backup(repository, keys, "db", now - timedelta(days=10), chunks=2)
    save_policy(repository, "pg", KeepRules(keep_last=2), StoragePolicy(STANDARD_IA, 30))
    monkeypatch.setattr(contract, "MOVE_SLICE_CHUNKS", 1)  # one item per chunk: the slices cover the prefix
    events = RecordingPublisher()
    runs = InlinePruneRuns(repository, keys, events, now=now)
    runs.storage_default = StoragePolicy(GLACIER_IR, 7)  # the stack's: db has no policy of its own
    failing = {"yes": True}
    runs.fail = lambda item: failing["yes"] and item.kind == MOVE and item.backup == str(other) and item.after == ""
    runs.start("first", {})

    (state,) = runs.states
    assert state["moves"] == 2 and state["pruned"] == 1
    report = runs.reports[0]
    assert report.pruned == [str(oldest)] and report.moved == [str(old)] and report.move_incomplete == [str(other)]
    assert classes_of(repository, old) == {STANDARD_IA} and classes_of(repository, young) == {STANDARD}
    assert classes_of(repository, other) == {GLACIER_IR, STANDARD}  # one slice failed: the rest moved
    assert set(placements(repository.store)) == {old}  # only the whole move is recorded
    assert report.failed_items == 1 and report.objects_moved == 3 + 1
    assert any("not all its chunks moved" in str(event) for event in events.events), events.events

    failing["yes"] = False
    runs.start("second", {})
    report = runs.reports[1]
    assert report.moved == [str(other)] and report.move_incomplete == [] and report.objects_moved == 1  # only what was left
    assert classes_of(repository, other) == {GLACIER_IR}
    assert runs.states[1]["moves"] == 1  # old is recorded: never planned again

    # Five days later keep-last 1 lets `old` go: 25 days of its 30-day minimum are charged.
    save_policy(repository, "pg", KeepRules(keep_last=1), StoragePolicy(STANDARD_IA, 30))
    later = now + timedelta(days=5)
    runs.now = later
    runs.start("third", {})
    report = runs.reports[2]
    assert report.pruned == [str(old)]
    (early,) = report.storage["early_deletion"]
    moved_at = datetime.fromisoformat(early["storage_since"].replace("Z", "+00:00"))
    stored = early["stored_bytes"]
    short = 30 - (later - moved_at).total_seconds() / 86400
    assert early["backup"] == str(old) and early["storage_class"] == STANDARD_IA and 24.9 < short <= 25.0
    assert report.storage["early_deletion_charge"] == pytest.approx(stored / GB * IA_PRICE * short / 30, rel=1e-4)
    assert old not in placements(repository.store)  # its record went with its manifest
    assert repository.store.head(chunk_key(old, 0)) is None


def test_a_move_item_is_refused_without_a_class_and_a_class_without_a_move() -> None:
    with pytest.raises(Exception, match="a move item with storage class ''"):
        SweepItem.from_json({"n": 0, "kind": "move", "backup": "pg@20260101T000000.000Z-00000001"})
    with pytest.raises(Exception, match="a backup item with storage class 'GLACIER_IR'"):
        SweepItem.from_json({"n": 0, "kind": "backup", "backup": "pg@20260101T000000.000Z-00000001", "storage_class": "GLACIER_IR"})
    item = SweepItem(3, MOVE, "pg@20260101T000000.000Z-00000001", "", "", GLACIER_IR)
    assert SweepItem.from_json(item.to_json()) == item
    assert Placement(GLACIER_IR).to_json() == {"class": GLACIER_IR, "since": None}
