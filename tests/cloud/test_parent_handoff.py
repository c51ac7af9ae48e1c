"""The pipeline's side of chains on the cloud path, step by step on a local store (the end-to-end runs through the
agent CLI are tests/cloud/test_chains_cloud.py): Finalize seals the members the agent staged, Prepare opens an
incremental's parent chain and hands its values over (or refuses), and every record is read strictly."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.agent.parent_wait import await_parent
from braid.engine.port import BackupRequest
from braid.errors import ExecutionError, IntegrityError, UsageError
from braid.format.chain import Lineage
from braid.format.ids import BackupRef
from braid.format.layout import metadata_key, staging_prefix
from braid.format.repository import Repository, RepositoryConfig
from braid.format.staging import SessionRecord, StagingArea
from braid.format.staging.chain import CapturedIndex, ParentRecord
from braid.format.staging.keys import session_key
from braid.format.staging.protocol import PROTOCOL, ProtocolMismatchError
from braid.format.timestamps import utc_now
from braid.ops.metadata import read_backup_metadata
from braid.pipeline.finalize import finalize_step
from braid.pipeline.plan import plan_next_round
from braid.pipeline.prepare import load_data_key, prepare_backup
from braid.pipeline.worker import ChunkLanes, process_item
from braid.ports.executions import ExecutionStatus
from braid.ports.pipeline import PlainStoreJanitor, RecordingPublisher
from support.staged_stream import stage_stream

CHUNK = 4096
LABEL = b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nCHECKPOINT LOCATION: 0/2000060\nSTART TIMELINE: 1\n"
PG_MANIFEST = b'{ "PostgreSQL-Backup-Manifest-Version": 2, "Files": [], "WAL-Ranges": [{ "Timeline": 1, "Start-LSN": "0/2000028", "End-LSN": "0/2000100" }] }\n'
CHECKPOINTS = b"backup_type = full-backuped\nfrom_lsn = 0\nto_lsn = 4242\nlast_lsn = 4250\n"


FULL = Lineage()


class Repo:
    def __init__(self, tmp_path: Path) -> None:
        self.keys = LocalKeyFile.create(tmp_path / "master.key")
        (tmp_path / "repo").mkdir()
        self.store = LocalStore(tmp_path / "repo")
        # The pipeline requires a KMS repository; the local key file stands in for KMS (same KeyService port).
        self.id = Repository.create(self.store, RepositoryConfig.new({"type": "kms", "key_id": self.keys.key_id}, utc_now())).config.id

    def stage(self, members: dict[str, bytes], lineage: Lineage = FULL, values: tuple[str, ...] = ()) -> BackupRef:
        ref = BackupRef.new("db")
        stage_stream(self.store, ref, self.id, b"row " * 3000, chunk=CHUNK, segment_chunks=2)
        area = StagingArea(self.store, ref)
        if lineage.is_incremental:  # the agent writes this session create-only, first; here it replaces the stand-in's
            self.store.put(session_key(ref), replace(area.read_session(), lineage=lineage, parent_values=list(values)).to_bytes())
        if members:
            area.write_captured(members)
        return ref

    def publish(self, ref: BackupRef) -> None:
        key, _ = load_data_key(self.store, self.keys, ref, self.id)
        while plan_next_round(self.store, ref, max_concurrency=4, max_chunks_per_item=2, poll_seconds=1, stall_seconds=60).status != "done":
            for item in StagingArea(self.store, ref).read_rounds()[-1].items:
                process_item(self.store, ref, item, key=key, level=3, lanes=ChunkLanes(2))
        finalize_step(self.store, self.keys, PlainStoreJanitor(), RecordingPublisher(), ref)

    def backup(self, members: dict[str, bytes], lineage: Lineage = FULL, values: tuple[str, ...] = ()) -> BackupRef:
        ref = self.stage(members, lineage, values)
        prepare_backup(self.store, self.keys, ref)
        self.publish(ref)
        return ref


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path)


def test_finalize_seals_the_staged_members_as_the_local_engine_does_and_leaves_no_staging(repo: Repo) -> None:
    ref = repo.backup({"backup_label": LABEL, "backup_manifest": PG_MANIFEST, "PG_VERSION": b"18\n"})
    repository = Repository.open(repo.store)
    manifest = repository.load(ref).manifest
    assert manifest.wal is not None
    assert {k: manifest.wal.fields[k] for k in ("start_lsn", "stop_lsn", "timeline", "pg_version")} == {
        "start_lsn": "0/2000028", "stop_lsn": "0/2000100", "timeline": 1, "pg_version": 18,
    }
    assert set(manifest.metadata) == {"backup_manifest"}
    assert read_backup_metadata(repository, ref, "backup_manifest", repo.keys) == PG_MANIFEST
    assert list(repo.store.list(staging_prefix(ref))) == []


def test_a_staged_member_that_differs_from_its_index_fails_finalize(repo: Repo) -> None:
    ref = repo.stage({"backup_label": LABEL, "backup_manifest": PG_MANIFEST})
    repo.store.put(f"{staging_prefix(ref)}captured/1", PG_MANIFEST.replace(b"2000100", b"2000200"))  # members in sorted order
    prepare_backup(repo.store, repo.keys, ref)
    with pytest.raises(IntegrityError, match=r"staged captured member .*captured/1 \(backup_manifest\) is not what its index records"):
        repo.publish(ref)


def test_prepare_hands_over_the_parents_values_and_finalize_seals_the_lineage(repo: Repo) -> None:
    full = repo.backup({"backup_label": LABEL, "backup_manifest": PG_MANIFEST, "xtrabackup_checkpoints": CHECKPOINTS})
    lineage = Lineage.incremental(full, Lineage())
    ref = repo.stage({}, lineage, ("parent_manifest", "parent_lsn"))
    prepare_backup(repo.store, repo.keys, ref)
    found = StagingArea(repo.store, ref).read_parent()
    assert found is not None
    record, manifest = found
    assert (record.parent, record.lsn, record.refused, record.unavailable, manifest) == (str(full), "4242", None, None, PG_MANIFEST)
    prepare_backup(repo.store, repo.keys, ref)  # a retried Prepare keeps the answer the agent may have acted on
    repo.publish(ref)
    assert Repository.open(repo.store).load(ref).manifest.lineage == lineage
    assert list(repo.store.list(staging_prefix(ref))) == []  # parent.json and the handed-over manifest went with staging


def test_prepare_refuses_an_unreadable_or_missing_parent_and_names_a_value_the_parent_lacks(repo: Repo) -> None:
    full = repo.backup({"backup_label": LABEL, "backup_manifest": PG_MANIFEST})

    def answer(values: tuple[str, ...]) -> ParentRecord:
        ref = repo.stage({}, Lineage.incremental(full, Lineage()), values)
        prepare_backup(repo.store, repo.keys, ref)
        found = StagingArea(repo.store, ref).read_parent()
        assert found is not None
        return found[0]

    lacking = answer(("parent_lsn",))
    assert lacking.unavailable == f"{{parent_lsn}}: the parent {full} has no xtrabackup_checkpoints (its stream was not a MariaDB xbstream); nothing was started"
    stored = repo.store.get(metadata_key(full, "backup_manifest"))
    repo.store.put(metadata_key(full, "backup_manifest"), stored[:-1] + bytes([stored[-1] ^ 1]))
    corrupt = answer(("parent_manifest",))
    assert corrupt.refused is not None and corrupt.refused.startswith(f"the incremental's parent {full} is unreadable: backup_manifest of backup {full}")
    repo.store.delete([f"manifests/{full.name}/{full.id}.json"])
    missing = answer(())
    assert missing.refused is not None and missing.refused.startswith(f"the incremental's parent is missing: {full} not found")


class Running:
    """The Executions port as await_parent reads it: an execution that stays RUNNING, or has FAILED."""

    def __init__(self, status: str = "RUNNING", cause: str | None = None) -> None:
        self.status = ExecutionStatus("arn", status, "BackupFailed" if cause else None, cause)
        self.described = 0

    def describe(self, ref: BackupRef) -> ExecutionStatus:
        self.described += 1
        return self.status


def test_the_agent_waits_for_prepare_within_bounds_and_raises_its_refusal(repo: Repo) -> None:
    full = BackupRef.parse("db@20260101T000000.000Z-00000000")
    ref = repo.stage({}, Lineage.incremental(full, Lineage()), ("parent_manifest",))
    request = BackupRequest(ref, [], CHUNK, 3, 1, lineage=Lineage.incremental(full, Lineage()))
    area = StagingArea(repo.store, ref)
    events: list[dict] = []
    with pytest.raises(ExecutionError, match=rf"the pipeline did not open the parent {full} of {ref} within 0 s \(its Prepare step\); nothing was started"):
        await_parent(area, Running(), request, events.append, poll_seconds=0.01, wait_seconds=0)
    # Step Functions is asked once per watch period while the session is staged (DescribeExecution is throttled per account).
    running = Running()
    with pytest.raises(ExecutionError, match="did not open the parent"):
        await_parent(area, running, request, events.append, poll_seconds=0.01, watch_seconds=3600, wait_seconds=0.2)
    assert running.described == 1
    with pytest.raises(ExecutionError, match="KMS said no"):
        await_parent(area, Running("FAILED", "KMS said no"), request, events.append, poll_seconds=0.01)
    area.write_parent(ParentRecord(str(full), refused="the incremental's parent is missing"))
    with pytest.raises(IntegrityError, match="the incremental's parent is missing"):
        await_parent(area, Running(), request, events.append, poll_seconds=0.01)
    area.write_parent(ParentRecord(str(full), unavailable="{parent_lsn}: no"))
    with pytest.raises(UsageError, match="parent_lsn"):
        await_parent(area, Running(), request, events.append, poll_seconds=0.01)
    area.write_parent(ParentRecord(str(BackupRef.new("db")), lsn="1"))
    with pytest.raises(IntegrityError, match=f"not the parent {full} this backup names"):
        await_parent(area, Running(), request, events.append, poll_seconds=0.01)
    started: list[tuple[str | None, bytes | None]] = []
    area.write_parent(ParentRecord(str(full), manifest=CapturedIndex.of({"backup_manifest": PG_MANIFEST}).members["backup_manifest"]), PG_MANIFEST)
    assert await_parent(area, Running(), replace(request, start_sources=lambda lsn, m: started.append((lsn, m)) or []), events.append, poll_seconds=0.01) == []
    assert started == [(None, PG_MANIFEST)]
    area.write_parent(ParentRecord(str(full), manifest=(len(PG_MANIFEST), "0" * 64)), PG_MANIFEST)
    with pytest.raises(IntegrityError, match="is not what parent.json records"):
        await_parent(area, Running(), request, events.append, poll_seconds=0.01)


def test_the_new_records_are_read_strictly_and_speak_this_protocol_only() -> None:
    ref = BackupRef.new("db")
    index = CapturedIndex.of({"backup_label": LABEL})
    doc = json.loads(index.to_bytes())
    assert doc["protocol"] == PROTOCOL == 5
    with pytest.raises(ProtocolMismatchError, match=f"speaks staging protocol 2; this braid speaks protocol {PROTOCOL}"):
        CapturedIndex.from_bytes(json.dumps({**doc, "protocol": 2}).encode(), "captured.json")
    with pytest.raises(IntegrityError, match="member 'etc/passwd' .* is not one Braid captures"):
        CapturedIndex.from_bytes(json.dumps({**doc, "members": {"etc/passwd": {"size": 1, "sha256": "0" * 64}}}).encode(), "captured.json")
    with pytest.raises(IntegrityError, match="refusing to stage captured member"):
        CapturedIndex.of({"PG_VERSION": b"1" * 65})
    record = ParentRecord(f"db@{ref.id}", lsn="7")
    assert ParentRecord.from_bytes(record.to_bytes(), "parent.json") == record
    with pytest.raises(IntegrityError, match="unknown extra"):
        ParentRecord.from_bytes(json.dumps({**json.loads(record.to_bytes()), "extra": 1}).encode(), "parent.json")
    with pytest.raises(ProtocolMismatchError):
        ParentRecord.from_bytes(json.dumps({"parent": "db@x"}).encode(), "parent.json")  # no "protocol": version 1
    session = SessionRecord(str(ref), "repo", CHUNK, 2, 3, ["pipe0"], utc_now(), parent_values=["parent_manifest"])
    with pytest.raises(IntegrityError, match="only an incremental asks"):
        SessionRecord.from_bytes(json.dumps({**json.loads(session.to_bytes()), "parent_values": ["parent_manifest"]}).encode())
    parent = BackupRef.parse("db@20260101T000000.000Z-00000000")
    incremental = replace(session, backup="db@20260102T000000.000Z-00000000", lineage=Lineage.incremental(parent, Lineage()))
    assert SessionRecord.from_bytes(incremental.to_bytes()) == incremental


def test_a_parent_record_names_only_its_present_fields_and_reads_back() -> None:
    record = ParentRecord("db@1", lsn="0/5000028", manifest=(12, "a" * 64))
    raw = record.to_bytes()
    assert raw == b'{"parent":"db@1","parent_lsn":"0/5000028","parent_manifest":{"sha256":"' + b"a" * 64 + b'","size":12},"protocol":5}'
    assert ParentRecord.from_bytes(raw, "parent.json") == record
    refused = ParentRecord("db@1", refused="the incremental's parent is missing")
    assert ParentRecord.from_bytes(refused.to_bytes(), "parent.json") == refused
    with pytest.raises(IntegrityError, match="parent record parent.json is malformed: refused must be a string, not 1"):
        ParentRecord.from_bytes(b'{"parent":"db@1","protocol":5,"refused":1}', "parent.json")
