"""Pipeline steps run directly on a local store: what a person sees when a backup fails,
best-effort notifications, and the execution-name guard (the state machine tests run
the same steps through moto's Step Functions)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from braid import contract
from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.agent.limits import WORKER_BASE_MB, check_worker_chunk_size, max_worker_chunk_size
from braid.errors import IntegrityError, StorageError, UsageError
from braid.format.chunk import ChunkCodec
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.layout import CATALOG, chunk_key, data_prefix, manifest_key, staging_prefix
from braid.format.manifest import open_manifest
from braid.format.repository import Repository, RepositoryConfig
from braid.format.staging import (
    ItemFailure,
    ItemResult,
    MapItem,
    RoundFold,
    StagingArea,
    segment_record_key,
    stream_end_key,
)
from braid.format.staging.keys import FOLDS, SEGMENTS, failure_key, fold_key, result_key, staging_key
from braid.format.staging.protocol import PROTOCOL, ProtocolMismatchError
from braid.format.timestamps import utc_now
from braid.ops.chunk_reader import ChunkReader
from braid.pipeline import policies as policies_module
from braid.pipeline.cleanup import HINTS, actionable_cause, cleanup_step
from braid.pipeline.execution_input import ExecutionInput, ExecutionMismatchError
from braid.pipeline.finalize import finalize_step
from braid.pipeline.item_flow import ENCODERS
from braid.pipeline.plan import plan_next_round
from braid.pipeline.prepare import load_data_key, prepare_backup
from braid.pipeline.worker import ChunkLanes, process_item
from braid.ports.pipeline import PlainStoreJanitor, RecordingPublisher
from support.staged_stream import stage_stream

CHUNK = 4096
DATA = b"row 0001 " * 2000  # 18,000 bytes: 5 chunks in 3 segments of 2 parts


@dataclass
class Staged:
    store: LocalStore
    keys: LocalKeyFile
    ref: BackupRef
    repository_id: str


@pytest.fixture
def staged(tmp_path: Path) -> Staged:
    keys = LocalKeyFile.create(tmp_path / "master.key")
    (tmp_path / "repo").mkdir()
    store = LocalStore(tmp_path / "repo")
    # The pipeline requires a KMS repository; the local key file stands in for KMS (same KeyService port).
    repository = Repository.create(store, RepositoryConfig.new({"type": "kms", "key_id": keys.key_id}, utc_now()))
    ref = BackupRef.new("db")
    stage_stream(store, ref, repository.config.id, DATA, chunk=CHUNK, segment_chunks=2)
    return Staged(store, keys, ref, repository.config.id)


def run_workers(staged: Staged) -> None:
    prepare_backup(staged.store, staged.keys, staged.ref)
    key, _ = load_data_key(staged.store, staged.keys, staged.ref, staged.repository_id)
    lanes = ChunkLanes(2)
    while (status := plan_next_round(staged.store, staged.ref, max_concurrency=4, max_chunks_per_item=2, poll_seconds=1, stall_seconds=60)).status != "done":
        assert status.status == "ready", status
        for item in StagingArea(staged.store, staged.ref).read_rounds()[-1].items:
            process_item(staged.store, staged.ref, item, key=key, level=3, lanes=lanes)


class FailingPublisher:
    def __init__(self) -> None:
        self.attempts = 0

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None:
        self.attempts += 1
        raise StorageError("EventBridge PutEvents failed: ThrottlingException")


# -- 4. notifications are best-effort after publish ------------------------------------


def test_a_failed_notification_after_publish_still_returns_the_summary(staged: Staged) -> None:
    run_workers(staged)
    publisher = FailingPublisher()
    reported: list[tuple[BackupRef, Exception]] = []

    summary = finalize_step(
        staged.store, staged.keys, PlainStoreJanitor(), publisher, staged.ref, lambda ref, exc: reported.append((ref, exc))
    )

    assert publisher.attempts == 1
    assert summary.backup == str(staged.ref) and summary.plaintext_bytes == len(DATA)
    assert staged.store.head(manifest_key(staged.ref)) is not None
    assert [info.key for info in staged.store.list(staging_prefix(staged.ref))] == []
    assert [(ref, type(exc)) for ref, exc in reported] == [(staged.ref, StorageError)]


# -- 2. the failure a person sees -----------------------------------------------------


def test_the_hint_table_spells_aws_map_failure_and_fail_states_get_no_reserved_name() -> None:
    ref = BackupRef.new("db")
    assert "States.ExceedToleratedFailureThreshold" in HINTS and "States.ExceededToleratedFailureThreshold" not in HINTS
    worker = ItemFailure(4, 2, "IntegrityError", "part 1 of staging/x does not match the checksum the agent recorded")

    failure = actionable_cause(ref, {"Error": "States.ExceedToleratedFailureThreshold", "Cause": "The specified tolerated failure threshold was exceeded"}, False, worker)

    assert failure.error == "BackupFailed"  # AWS rejects a Fail state error beginning with "States."
    assert "(States.ExceedToleratedFailureThreshold)" in failure.cause
    assert "chunks 4..5: IntegrityError: part 1 of staging/x does not match the checksum" in failure.cause
    assert HINTS["States.ExceedToleratedFailureThreshold"] in failure.cause
    assert actionable_cause(ref, {"Error": "States.Timeout", "Cause": ""}, False).error == "BackupFailed"
    assert actionable_cause(ref, {"Error": "Sandbox.Timedout", "Cause": ""}, False).error == "Sandbox.Timedout"


def test_a_failing_worker_leaves_its_error_and_cleanup_reports_it(staged: Staged) -> None:
    prepare_backup(staged.store, staged.keys, staged.ref)
    key, _ = load_data_key(staged.store, staged.keys, staged.ref, staged.repository_id)
    assert plan_next_round(staged.store, staged.ref, max_concurrency=4, max_chunks_per_item=2, poll_seconds=1, stall_seconds=60).status == "ready"
    first, second, *_ = StagingArea(staged.store, staged.ref).read_rounds()[0].items
    lanes = ChunkLanes(1)
    process_item(staged.store, staged.ref, first, key=key, level=3, lanes=lanes)
    # The second segment's bytes change after the agent recorded them.
    staged.store.put(second.segment, b"X" * len(DATA[CHUNK * 2 : CHUNK * 4]))

    with pytest.raises(IntegrityError, match="does not match the checksum"):
        process_item(staged.store, staged.ref, second, key=key, level=3, lanes=lanes)

    area = StagingArea(staged.store, staged.ref)
    found = area.first_failure()
    assert found is not None and (found.first_index, found.count, found.error) == (second.first_index, second.count, "IntegrityError")
    # A failure of an item that later stored its result is no failure.
    area.write_failure(ItemFailure(first.first_index, first.count, "StorageError", "SlowDown, then retried"))
    assert area.first_failure() == found

    failure = cleanup_step(
        staged.store, PlainStoreJanitor(), RecordingPublisher(), staged.ref,
        {"Error": "IntegrityError", "Cause": "chunks 2..3 were never stored"}, execution=str(staged.ref),
    )

    assert failure.error == "IntegrityError"
    assert f"chunks {second.first_index}..{second.end_index - 1}: IntegrityError:" in failure.cause
    assert "does not match the checksum the agent recorded" in failure.cause
    assert [info.key for info in staged.store.list(staging_prefix(staged.ref))] == []
    assert [info.key for info in staged.store.list(data_prefix(staged.ref))] == []


def test_each_part_of_a_pack_is_read_into_its_own_pooled_buffer_and_the_frames_are_sent_from_them(staged: Staged) -> None:
    """No fresh chunk-sized allocation per chunk: each ranged GET fills a pooled buffer, the codec writes that
    chunk's frame over it, and the pack is sent from those buffers, which the next item takes again."""
    prepare_backup(staged.store, staged.keys, staged.ref)
    key, _ = load_data_key(staged.store, staged.keys, staged.ref, staged.repository_id)
    assert plan_next_round(staged.store, staged.ref, max_concurrency=4, max_chunks_per_item=2, poll_seconds=1, stall_seconds=60).status == "ready"
    items = StagingArea(staged.store, staged.ref).read_rounds()[0].items
    assert [item.count for item in items][:2] == [2, 2]  # two-chunk items: one pack of two each (pack_sizes)
    lanes = ChunkLanes(1)

    first = process_item(staged.store, staged.ref, items[0], key=key, level=3, lanes=lanes).result.entries
    before = lanes.pooled
    assert 1 <= len(before) <= 2 and all(len(buffer) >= CHUNK for buffer in before)  # the second part may reuse the first's
    second = process_item(staged.store, staged.ref, items[1], key=key, level=3, lanes=lanes).result.entries
    buffers = lanes.pooled
    assert {id(b) for b in before} <= {id(b) for b in buffers} and len(buffers) <= 2  # the same pages for every item
    for entry in second:  # each frame of the pack was sent from the buffer its part was read into (the frame at its start)
        frame = staged.store.get(chunk_key(staged.ref, entry.pack))[entry.pack_offset : entry.pack_offset + entry.stored_length]
        assert entry.compression == "zstd" and any(bytes(memoryview(b)[: entry.stored_length]) == frame for b in buffers)
    entries = [*first, *second] + [e for item in items[2:] for e in process_item(staged.store, staged.ref, item, key=key, level=3, lanes=lanes).result.entries]
    codec = ChunkCodec(key)
    plaintext = [
        bytes(codec.decode(staged.store.get_range(chunk_key(staged.ref, e.pack), e.pack_offset, e.stored_length), backup=str(staged.ref),
                           index=e.index, input_index=e.input_index, plaintext_length=e.length, plaintext_mac=e.mac))
        for e in entries
    ]
    assert b"".join(plaintext) == DATA  # and every chunk holds its own part


def test_failure_records_round_trip_and_a_long_cause_is_cut(staged: Staged) -> None:
    area = StagingArea(staged.store, staged.ref)
    assert area.first_failure() is None
    key = area.write_failure(ItemFailure(8, 2, "StorageError", "x" * 10_000))
    assert key == failure_key(staged.ref, 8) and key.startswith(staging_prefix(staged.ref))
    found = area.first_failure()
    assert found is not None and found.error == "StorageError" and len(found.cause) == 2000
    staged.store.put(failure_key(staged.ref, 0), b"not json")  # unreadable records are skipped, never fatal
    assert area.first_failure() == found
    area.write_result(ItemResult(8, ()))
    assert area.first_failure() is None


# -- 5. an execution only processes the backup it is named after ----------------------


def test_steps_refuse_a_backup_other_than_the_executions(staged: Staged) -> None:
    own = {"protocol": PROTOCOL, "backup": str(staged.ref), "execution": {"name": str(staged.ref)}}
    assert ExecutionInput.from_event(own).ref == staged.ref
    direct = {"protocol": PROTOCOL, "backup": str(staged.ref)}
    assert ExecutionInput.from_event(direct).ref == staged.ref  # invoked directly, not by the state machine
    for execution in ({"name": "intruder@20261123T000000Z-abcdef"}, {"name": 7}, "db"):
        with pytest.raises(ExecutionMismatchError):
            ExecutionInput.from_event({**own, "execution": execution})


def test_the_execution_input_carries_an_integer_protocol_and_the_pipeline_refuses_another(staged: Staged) -> None:
    started = ExecutionInput(backup=str(staged.ref)).to_json()
    assert started["protocol"] == PROTOCOL and type(started["protocol"]) is int
    assert ExecutionInput.from_event(started) == ExecutionInput(backup=str(staged.ref))
    older = {k: v for k, v in started.items() if k != "protocol"}  # as an agent of protocol 1 starts it
    with pytest.raises(ProtocolMismatchError, match=f"speaks staging protocol 1; this braid speaks protocol {PROTOCOL}") as refused:
        ExecutionInput.from_event(older)
    assert refused.value.exit_code == 2 and type(refused.value).__name__ in contract.FINAL_PIPELINE_ERRORS  # Cleanup, not a hold
    with pytest.raises(ProtocolMismatchError, match=f"protocol {PROTOCOL + 1}; this braid speaks protocol {PROTOCOL}"):
        ExecutionInput.from_event({**started, "protocol": PROTOCOL + 1})
    for name, wrong in (("protocol", True), ("protocol", "2"), ("max_concurrency", True), ("max_concurrency", "0"), ("poll_seconds", 4.9)):
        with pytest.raises((IntegrityError, UsageError), match=f"{name} must be a.*integer"):
            ExecutionInput.from_event({**started, name: wrong})


def test_the_planner_removes_each_finished_segment_through_purge_by_version(staged: Staged) -> None:
    """Plan's early removal goes through `purge` (on S3: every version of exactly that key), never a plain delete."""
    prepare_backup(staged.store, staged.keys, staged.ref)
    key, _ = load_data_key(staged.store, staged.keys, staged.ref, staged.repository_id)
    segments = sorted(info.key for info in staged.store.list(staging_key(staged.ref, SEGMENTS)))
    purged: list[str] = []
    deletes: list[list[str]] = []
    plain_delete = staged.store.delete

    def purge(segment: str) -> None:
        purged.append(segment)
        plain_delete([segment])

    staged.store.delete = lambda keys: (deletes.append(list(keys)), plain_delete(keys))[1]  # type: ignore[method-assign]
    cursor = None
    while (status := plan_next_round(
        staged.store, staged.ref, max_concurrency=4, max_chunks_per_item=2, poll_seconds=1, stall_seconds=60, cursor=cursor, purge=purge,
    )).status != "done":
        for item in StagingArea(staged.store, staged.ref).read_rounds()[-1].items:
            process_item(staged.store, staged.ref, item, key=key, level=3, lanes=ChunkLanes(2))
        cursor = status.to_json()["cursor"]  # as the state machine carries it: the next call checks this map
    assert len(segments) > 1 and sorted(purged) == segments
    assert not [batch for batch in deletes if set(batch) & set(segments)]  # never a plain delete (a delete marker on S3)


def test_cleanup_of_a_mismatched_execution_touches_nothing(staged: Staged) -> None:
    run_workers(staged)
    before = sorted(info.key for info in staged.store.list(""))
    assert any(k.startswith(data_prefix(staged.ref)) for k in before) and chunk_key(staged.ref, 0) in before
    events = RecordingPublisher()

    failure = cleanup_step(
        staged.store, PlainStoreJanitor(), events, staged.ref, {"Error": "ExecutionMismatchError", "Cause": "..."}, execution="intruder@x"
    )

    assert failure.error == "ExecutionMismatchError" and "nothing of" in failure.cause and str(staged.ref) in failure.cause
    assert sorted(info.key for info in staged.store.list("")) == before
    assert events.events == []


# -- 1. chunk sizes the worker can hold -----------------------------------------------

MiB = 1024**2


def test_chunk_sizes_beyond_the_workers_memory_are_refused_naming_the_largest() -> None:
    largest = max_worker_chunk_size()
    # The worker reads ahead into a buffer per lane, keeps two packs' frames in theirs, and each encoder has a payload
    # and an incompressible chunk's stored form: all within its memory, beside what the runtime takes.
    buffers = contract.DEFAULT_WORKER_LANES + 2 * contract.CHUNKS_PER_PACK + 2 * ENCODERS
    assert buffers * largest <= (contract.WORKER_MEMORY_MB - WORKER_BASE_MB) * MiB
    assert largest == 67 * MiB  # (1,472 - 256) MiB / 18 buffers
    check_worker_chunk_size(64 * MiB)  # the default
    check_worker_chunk_size(largest)
    with pytest.raises(UsageError, match="the largest allowed is 67 MiB: use --chunk-size 67MiB or less") as refused:
        check_worker_chunk_size(128 * MiB)
    assert refused.value.exit_code == 2
    assert max_worker_chunk_size(lanes=2) > largest  # fewer lanes, larger chunks


def test_the_pipelines_events_carry_exactly_the_fields_the_docs_document(staged: Staged, tmp_path: Path) -> None:
    from braid.contract import BACKUP_COMPLETED, BACKUP_FAILED
    from support.event_docs import documented_events

    documented = documented_events()
    run_workers(staged)
    events = RecordingPublisher()
    finalize_step(staged.store, staged.keys, PlainStoreJanitor(), events, staged.ref)
    cleanup_step(staged.store, PlainStoreJanitor(), events, BackupRef.new("other"), {"Error": "StorageError", "Cause": "SlowDown"})

    published = {kind: set(detail) for kind, detail in events.events}
    assert published == {BACKUP_COMPLETED: documented[BACKUP_COMPLETED], BACKUP_FAILED: documented[BACKUP_FAILED]}



def test_each_published_backup_is_counted_under_its_name_for_the_freshness_alarm(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from braid import contract
    from braid.pipeline.observability import count_for_backup_name

    count_for_backup_name(contract.METRIC_BACKUP_PUBLISHED, "pg")

    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    emf = json.loads(line)
    (directive,) = emf["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == contract.METRICS_NAMESPACE  # what the stack's NoBackup-NAME alarms watch
    assert directive["Metrics"] == [{"Name": contract.METRIC_BACKUP_PUBLISHED, "Unit": "Count"}]
    assert sorted(directive["Dimensions"][0]) == sorted(["service", contract.DIMENSION_BACKUP_NAME])
    assert (emf["service"], emf[contract.DIMENSION_BACKUP_NAME], emf[contract.METRIC_BACKUP_PUBLISHED]) == ("braid", "pg", [1.0])


# -- results folded by the planner: Finalize reads folds, and still checks every chunk -------------


def stream_in_two_rounds(staged: Staged, monkeypatch: pytest.MonkeyPatch) -> tuple[DataKey, list[MapItem]]:
    """Plan and process the first segment before the rest of the stream is staged, then the rest.

    The planner lays out packs of one chunk here (CHUNKS_PER_PACK 1), so this small stream's two-chunk items have a
    pack boundary to be cut at, as a real stream's 16-chunk items (4 packs) do.
    Returns the data key and the first round's items (the round whose results the planner folds)."""
    monkeypatch.setattr(policies_module, "CHUNKS_PER_PACK", 1)
    area = StagingArea(staged.store, staged.ref)
    later = {key: staged.store.get(key) for key in (segment_record_key(staged.ref, 0, 1), segment_record_key(staged.ref, 0, 2), stream_end_key(staged.ref))}
    staged.store.delete(list(later))
    prepare_backup(staged.store, staged.keys, staged.ref)
    key, _ = load_data_key(staged.store, staged.keys, staged.ref, staged.repository_id)
    lanes = ChunkLanes(2)

    def plan(cursor: Mapping[str, Any] | None) -> Any:
        return plan_next_round(staged.store, staged.ref, max_concurrency=4, max_chunks_per_item=2, poll_seconds=1, stall_seconds=60, cursor=cursor)

    first = plan(None)
    assert (first.status, first.round) == ("ready", 1)
    first_items = area.read_items(first.items_key, first.round)
    for item in first_items:
        process_item(staged.store, staged.ref, item, key=key, level=3, lanes=lanes)
    for name, body in later.items():
        if name != stream_end_key(staged.ref):
            staged.store.put(name, body)
    status = plan(first.to_json()["cursor"])  # checks round 1's map and folds it (the stream still arrives), then plans the rest
    assert [info.key for info in staged.store.list(staging_key(staged.ref, FOLDS))] == [fold_key(staged.ref, 1, 0)]
    # The stream ends before round 2's workers run: round 2 was planned while it arrived, so its items are cut
    # items, and each worker stops after its first pack; the planner gives their last packs to round 3.
    staged.store.put(stream_end_key(staged.ref), later[stream_end_key(staged.ref)])
    second = area.read_items(status.items_key, status.round)
    assert status.round == 2 and all(item.cut for item in [*first_items, *second])
    while status.status != "done":
        assert status.status == "ready", status
        for item in area.read_items(status.items_key, status.round):
            process_item(staged.store, staged.ref, item, key=key, level=3, lanes=lanes)
        status = plan(status.to_json()["cursor"])
    # After stream end only the cut results are folded: the prefixes the planner planned the rest after.
    assert [info.key for info in staged.store.list(staging_key(staged.ref, FOLDS))] == [fold_key(staged.ref, 1, 0), fold_key(staged.ref, 2, 0)]
    folded = RoundFold.from_bytes(staged.store.get(fold_key(staged.ref, 2, 0)), "fold")
    two_chunk = [item for item in second if item.count > 1]
    assert two_chunk and [(r.first_index, len(r.entries)) for r in folded.results] == [(item.first_index, 1) for item in two_chunk]
    third = area.read_rounds()[2].items
    finishing = [item for item in third if item.finishes_cut]
    assert [(i.first_index, i.count, i.layout) for i in finishing] == [(item.first_index + 1, 1, (item.first_chunk, 2)) for item in two_chunk]
    return key, first_items


def publishes_the_stream(staged: Staged, key: DataKey) -> None:
    """Finalize publishes every chunk of DATA, and the manifest reads back as DATA."""
    summary = finalize_step(staged.store, staged.keys, PlainStoreJanitor(), RecordingPublisher(), staged.ref)

    assert (summary.chunks, summary.plaintext_bytes) == (5, len(DATA))
    manifest = open_manifest(staged.store.get(manifest_key(staged.ref)), "m").authenticate(key)
    reader = ChunkReader(staged.store, manifest, key)
    assert b"".join(bytes(reader.read(chunk, bytearray(CHUNK))) for chunk in manifest.chunks()) == DATA


def test_finalize_publishes_from_the_folds_and_a_late_worker_changes_nothing(staged: Staged, monkeypatch: pytest.MonkeyPatch) -> None:
    key, first_items = stream_in_two_rounds(staged, monkeypatch)
    area = StagingArea(staged.store, staged.ref)
    # A late worker of a folded item rewrites its record after the fold (here one that even disagrees with
    # the stored chunk), and another folded item's record is gone: the fold, checked against the plan and
    # the stored chunks, is what Finalize uses.
    late = ItemResult.from_bytes(staged.store.get(result_key(staged.ref, first_items[0].first_index)), "late")
    area.write_result(ItemResult(late.first_index, tuple(replace(e, mac=bytes(32)) for e in late.entries)))
    staged.store.delete([result_key(staged.ref, item.first_index) for item in first_items[1:]])

    publishes_the_stream(staged, key)


def test_a_late_attempt_of_a_cut_item_cannot_move_where_finalize_follows_it(staged: Staged, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner planned a cut item's last packs after the prefix it read; a late attempt that stores the whole item
    (it never saw the stream end) rewrites the record, and meets the very packs the finishing items stored."""
    key, _ = stream_in_two_rounds(staged, monkeypatch)
    area = StagingArea(staged.store, staged.ref)
    cut = [item for item in area.read_rounds()[1].items if item.count > 1][0]
    prefix = ItemResult.from_bytes(staged.store.get(result_key(staged.ref, cut.first_index)), "cut")
    rest = ItemResult.from_bytes(staged.store.get(result_key(staged.ref, cut.first_index + len(prefix.entries))), "rest")
    # What a late attempt that stored the whole item writes (put_pack reports the packs already there).
    area.write_result(ItemResult(cut.first_index, prefix.entries + rest.entries))

    publishes_the_stream(staged, key)


def test_finalize_refuses_a_cut_item_whose_last_packs_were_never_stored(staged: Staged, monkeypatch: pytest.MonkeyPatch) -> None:
    stream_in_two_rounds(staged, monkeypatch)
    area = StagingArea(staged.store, staged.ref)
    finishing = [item for item in area.read_rounds()[2].items if item.finishes_cut]
    staged.store.delete([result_key(staged.ref, finishing[0].first_index)])
    fold = fold_key(staged.ref, 3, 0)
    assert not list(staged.store.list(fold))  # the final round is not folded: its records are all there is

    with pytest.raises(IntegrityError, match=rf"chunks {finishing[0].first_index}\.\.{finishing[0].end_index - 1} of backup .* were never stored"):
        finalize_step(staged.store, staged.keys, PlainStoreJanitor(), RecordingPublisher(), staged.ref)
    assert not list(staged.store.list(manifest_key(staged.ref)))  # nothing published


class ManifestReadsBack(LocalStore):
    """Serves other bytes than were written for the backup's manifest (`change` makes them from the stored ones)."""

    def __init__(self, root: Path, ref: BackupRef, change: Callable[[bytes], bytes]) -> None:
        super().__init__(root)
        self.target = manifest_key(ref)
        self.change = change

    def get(self, key: str) -> bytes:
        data = super().get(key)
        return self.change(data) if key == self.target else data


def flip_last_body_byte(raw: bytes) -> bytes:
    """Corrupt: the self-checksum no longer matches."""
    at = raw.rindex(b',"sha256":') - 1
    return raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :]


@pytest.mark.parametrize("sealed_again", [False, True], ids=["corrupt", "authentic-but-other"])
def test_finalize_withdraws_a_manifest_that_reads_back_other_than_written(staged: Staged, tmp_path: Path, sealed_again: bool) -> None:
    """The read-back compares the stored bytes with the sealed ones: a corrupt copy, and even one that opens and
    authenticates under the backup's key but is not what was written, fails Finalize and is withdrawn; a rerun publishes."""
    run_workers(staged)
    key, _ = load_data_key(staged.store, staged.keys, staged.ref, staged.repository_id)

    def other(raw: bytes) -> bytes:
        if not sealed_again:
            return flip_last_body_byte(raw)
        manifest = open_manifest(raw, "m").authenticate(key)
        return replace(manifest, stats={**manifest.stats, "rounds": 99}).seal(key)

    store = ManifestReadsBack(tmp_path / "repo", staged.ref, other)
    with pytest.raises(IntegrityError, match=rf"^manifest of {staged.ref} read back differently from what was written$"):
        finalize_step(store, staged.keys, PlainStoreJanitor(), RecordingPublisher(), staged.ref)
    assert staged.store.head(manifest_key(staged.ref)) is None and list(staged.store.list(CATALOG)) == []
    assert StagingArea(staged.store, staged.ref).read_session().backup == str(staged.ref)

    summary = finalize_step(staged.store, staged.keys, PlainStoreJanitor(), RecordingPublisher(), staged.ref)
    published = open_manifest(staged.store.get(manifest_key(staged.ref)), "m").authenticate(key)
    assert (published.chunk_count, published.plaintext_bytes, summary.chunks) == (5, len(DATA), 5)


def test_finalize_refuses_a_folded_chunk_that_is_missing_or_a_fold_that_disagrees_with_the_plan(staged: Staged, monkeypatch: pytest.MonkeyPatch) -> None:
    _, first_items = stream_in_two_rounds(staged, monkeypatch)
    area = StagingArea(staged.store, staged.ref)
    fold = RoundFold.from_bytes(staged.store.get(fold_key(staged.ref, 1, 0)), "fold")
    chunk = chunk_key(staged.ref, first_items[0].first_index)
    stored = staged.store.get(chunk)
    staged.store.delete([chunk])
    # The item's first chunk begins its first pack: the pack (keyed by that chunk) is what went missing.
    start, size = first_items[0].first_index, first_items[0].packs[0]  # as the planner laid it out
    first_pack = f"pack of chunks {start}-{start + size - 1}" if size > 1 else f"chunk {start}"
    with pytest.raises(IntegrityError, match=f"{first_pack} of backup {staged.ref} is missing from the repository"):
        finalize_step(staged.store, staged.keys, PlainStoreJanitor(), RecordingPublisher(), staged.ref)
    staged.store.put(chunk, stored)
    first = fold.results[0]
    wrong = ItemResult(first.first_index, tuple(replace(e, length=e.length - 1) for e in first.entries))
    staged.store.put(fold_key(staged.ref, 1, 0), RoundFold(1, 0, (wrong, *fold.results[1:])).to_bytes())
    with pytest.raises(IntegrityError, match=f"result for chunk {first.first_index} of {staged.ref} describes"):
        finalize_step(staged.store, staged.keys, PlainStoreJanitor(), RecordingPublisher(), staged.ref)
    assert staged.store.head(manifest_key(staged.ref)) is None and area.read_session().backup == str(staged.ref)
