"""Planner: contiguous, persisted chunk indexes; a retried planner never renumbers."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from braid import contract
from braid.adapters.local.store import LocalStore
from braid.errors import IntegrityError, UsageError
from braid.format.checksum import stored_checksum
from braid.format.ids import BackupRef
from braid.format.lease import heartbeat_seconds
from braid.format.manifest import ChunkEntry
from braid.format.staging import (
    ItemFailure,
    ItemResult,
    MapItem,
    ResumeRequest,
    SegmentRecord,
    SessionRecord,
    StagingArea,
    StreamEnd,
    segment_key,
    segment_record_key,
    session_key,
    stream_end_key,
)
from braid.format.staging.keys import FOLDS, agent_lease_key, fold_key, staging_key
from braid.pipeline import pacing
from braid.pipeline.decide import StagingStalledError, items_for_segments
from braid.pipeline.failure import HoldEntry, hold_entry
from braid.pipeline.item_sizing import chunks_per_item
from braid.pipeline.plan import StreamAbandonedError, hold_step_failure, plan_next_round
from braid.pipeline.policies import Policies
from braid.pipeline.replan import HOLD_SECONDS, BackupHeldError

CHUNK = 100


def record(ref: BackupRef, input_index: int, segment: int, offset: int, length: int) -> SegmentRecord:
    parts = -(-length // CHUNK)
    return SegmentRecord(
        input_index, segment, segment_key(ref, input_index, segment), offset, length, parts, "crc64nvme:x", [f"part-{p}" for p in range(parts)]
    )


def plan(store: LocalStore, ref: BackupRef, idle: int = 0):  # type: ignore[no-untyped-def]
    return plan_next_round(store, ref, max_concurrency=2, max_chunks_per_item=3, poll_seconds=5, stall_seconds=20, idle_seconds=idle)


def test_rounds_number_chunks_contiguously_and_a_retry_adopts_the_written_round(tmp_path: Path) -> None:
    store, ref = LocalStore(tmp_path), BackupRef.new("db")
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a", "b"], "now").to_bytes())
    assert plan(store, ref).status == "waiting"
    first = record(ref, 1, 0, 0, 350)
    store.put(segment_record_key(ref, 1, 0), first.to_bytes())
    ready = plan(store, ref)
    assert (ready.status, ready.round, ready.chunks) == ("ready", 1, 4)
    # A racing attempt that computed round 1 differently loses and adopts what is stored.
    adopted = StagingArea(store, ref).write_round(1, items_for_segments([record(ref, 0, 0, 0, 400)], CHUNK, 0, 1))
    assert {(i.input_index, i.segment_index) for i in adopted.items} == {(1, 0)} and sum(i.count for i in adopted.items) == 4
    for segment, offset in ((0, 0), (1, 400)):
        store.put(segment_record_key(ref, 0, segment), record(ref, 0, segment, offset, 400 if segment == 0 else 50).to_bytes())
    second = plan(store, ref)
    assert (second.round, second.chunks, second.planned_chunks) == (2, 5, 9)
    indexes = sorted(c.index for r in StagingArea(store, ref).read_rounds() for item in r.items for c in item.chunks())
    assert indexes == list(range(9))
    assert plan(store, ref).status == "waiting"
    store.put(stream_end_key(ref), StreamEnd([450, 350], [2, 1]).to_bytes())
    assert plan(store, ref).status == "done"


def test_a_stalled_agent_fails_the_plan(tmp_path: Path) -> None:
    store, ref = LocalStore(tmp_path), BackupRef.new("db")
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    with pytest.raises(StagingStalledError, match="stopped uploading"):
        plan(store, ref, idle=20)


def test_items_are_a_few_chunks_only_when_that_still_fills_the_workers() -> None:
    assert chunks_per_item(10, 100, 8) == 1
    assert chunks_per_item(1000, 100, 8) == 8
    assert chunks_per_item(300, 100, 8) == 3


def test_items_stay_full_while_the_stream_is_still_arriving() -> None:
    # A streaming round is about one segment: filling 500 workers with it would
    # make every item a single unoverlapped chunk.
    assert chunks_per_item(32, 500, 8, streaming=True) == 8
    assert chunks_per_item(32, 500, 8, streaming=False) == 1


def test_planner_sizes_items_by_whether_the_stream_ended(tmp_path: Path) -> None:
    store, ref = LocalStore(tmp_path), BackupRef.new("db")
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    store.put(segment_record_key(ref, 0, 0), record(ref, 0, 0, 0, 400).to_bytes())
    streaming = plan(store, ref)  # max_concurrency=2 would want 2 items; streaming keeps items of 3
    assert [i.count for i in StagingArea(store, ref).read_rounds()[0].items] == [3, 1] and streaming.items == 2
    store.put(segment_record_key(ref, 0, 1), record(ref, 0, 1, 400, 400).to_bytes())
    store.put(stream_end_key(ref), StreamEnd([800], [2]).to_bytes())
    ended = plan(store, ref)  # after stream end: spread over both workers
    assert [i.count for i in StagingArea(store, ref).read_rounds()[1].items] == [2, 2] and ended.items == 2


def test_items_carry_their_chunks_checksums_and_records_must_list_them(tmp_path: Path) -> None:
    store, ref = LocalStore(tmp_path), BackupRef.new("db")
    items = items_for_segments([record(ref, 0, 0, 0, 400)], CHUNK, 0, 3)
    assert [c.checksum for item in items for c in item.chunks()] == ["part-0", "part-1", "part-2", "part-3"]
    assert MapItem.from_json(items[0].to_json()) == items[0]
    # The planner only sees records the staging area checked: one checksum per part.
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    broken = replace(record(ref, 0, 0, 0, 400), chunk_checksums=["part-0"])
    store.put(segment_record_key(ref, 0, 0), broken.to_bytes())
    with pytest.raises(IntegrityError, match="lists 1 chunk checksums for 4 chunks"):
        plan(store, ref)


# -- the cursor, the watch and pacing (braid.pipeline.plan_cursor, braid.pipeline.pacing) ------


class CountingLocalStore(LocalStore):
    """A local store that counts GETs and LISTs, to show what a Plan call reads."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gets = 0
        self.lists = 0

    def get(self, key: str) -> bytes:
        self.gets += 1
        return super().get(key)

    def list(self, prefix: str):  # type: ignore[no-untyped-def]
        self.lists += 1
        return super().list(prefix)


class VirtualClock:
    """Epoch seconds that only move when the planner sleeps; `at` runs agent actions when their time comes."""

    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.actions: list[tuple[float, object]] = []

    def __call__(self) -> float:
        return self.now

    def at(self, seconds: float, action) -> None:  # type: ignore[no-untyped-def]
        self.actions.append((self.now + seconds, action))

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        due = [a for a in self.actions if a[0] <= self.now]
        self.actions = [a for a in self.actions if a[0] > self.now]
        for _, action in due:
            action()  # type: ignore[operator]


def finish(store: LocalStore, ref: BackupRef, status, *, failing: set[int] = frozenset()) -> None:  # type: ignore[no-untyped-def,assignment]
    """What the map's workers leave: a result record per item (none for items whose first chunk is in `failing`)."""
    area = StagingArea(store, ref)
    for item in area.read_items(status.items_key, status.round):
        if item.first_index not in failing:
            area.write_result(result_of(item))


def result_of(item: MapItem) -> ItemResult:
    mac = bytes(32)
    return ItemResult(item.first_index, tuple(ChunkEntry(c.index, item.input_index, c.offset, c.length, c.length, stored_checksum(b""), mac, "zstd") for c in item.chunks()))


def watch(store: LocalStore, ref: BackupRef, clock: VirtualClock, cursor=None, *, seconds: float = 60, stall: int = 3600, rounds: float = 10):  # type: ignore[no-untyped-def]
    return plan_next_round(
        store, ref, max_concurrency=2, max_chunks_per_item=3, poll_seconds=5, stall_seconds=stall, cursor=cursor,
        watch_seconds=seconds, min_round_seconds=rounds, clock=clock, sleep=clock.sleep,
    )


def test_a_planner_with_its_cursor_reads_only_what_is_new(tmp_path: Path) -> None:
    store, ref, clock = CountingLocalStore(tmp_path), BackupRef.new("db"), VirtualClock()
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    cursor = None
    for segment in range(40):
        store.put(segment_record_key(ref, 0, segment), record(ref, 0, segment, segment * 400, 400).to_bytes())
        status = watch(store, ref, clock, cursor, seconds=0, rounds=0)
        assert status.status == "ready" and status.round == segment + 1
        finish(store, ref, status)
        cursor = status.to_json()["cursor"]
    store.gets = store.lists = 0
    checked = watch(store, ref, clock, cursor, seconds=0)
    # The last map's items file, one LIST of its results, the stream end (is it the last map?) and the
    # map's result records (folded into one); then the watch's reads.
    assert (checked.status, store.gets, store.lists) == ("waiting", 1 + 1 + 2 + 4, 1)
    assert len(list(store.list(staging_key(ref, FOLDS)))) == 40
    store.gets = store.lists = 0
    idle = watch(store, ref, clock, checked.to_json()["cursor"], seconds=0)
    # session, the next segment record (not there), stream end, the lease: whatever came before.
    assert (idle.status, store.gets, store.lists) == ("waiting", 4, 0)
    cursor = idle.to_json()["cursor"]
    store.put(segment_record_key(ref, 0, 40), record(ref, 0, 40, 40 * 400, 100).to_bytes())
    store.put(stream_end_key(ref), StreamEnd([40 * 400 + 100], [41]).to_bytes())
    store.gets = store.lists = 0
    last = watch(store, ref, clock, cursor, seconds=0)
    assert (last.status, last.chunks, last.planned_chunks) == ("ready", 1, 161)
    assert store.gets <= 6 and store.lists == 0
    finish(store, ref, last)
    assert watch(store, ref, clock, last.to_json()["cursor"], seconds=0).status == "done"
    # The last map is not folded (Finalize comes next and reads its few records itself).
    assert fold_key(ref, 41, 0) not in {info.key for info in store.list(staging_key(ref, FOLDS))}
    # The round files, which a call without a cursor rebuilds it from, agree.
    indexes = sorted(c.index for r in StagingArea(store, ref).read_rounds() for item in r.items for c in item.chunks())
    assert indexes == list(range(161))


def test_with_the_results_index_off_the_planner_folds_nothing_and_finalize_reads_every_record(tmp_path: Path) -> None:
    """`--no-policy results_index` (the policy's off switch): the call after a map writes no fold (a streaming round's items
    are cut items, whose records it reads to find what they left), and Finalize's one reader then reads every item's
    record (StagingArea.read_results)."""
    store, ref, clock = CountingLocalStore(tmp_path), BackupRef.new("db"), VirtualClock()
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    cursor = None
    for segment in range(3):
        store.put(segment_record_key(ref, 0, segment), record(ref, 0, segment, segment * 400, 400).to_bytes())
        status = plan_next_round(
            store, ref, max_concurrency=2, max_chunks_per_item=3, poll_seconds=5, stall_seconds=3600, cursor=cursor,
            watch_seconds=0, min_round_seconds=0, clock=clock, sleep=clock.sleep, policies=Policies.without(["results_index"]),
        )
        assert status.status == "ready" and status.round == segment + 1
        finish(store, ref, status)
        cursor = status.to_json()["cursor"]
    checked = plan_next_round(
        store, ref, max_concurrency=2, max_chunks_per_item=3, poll_seconds=5, stall_seconds=3600, cursor=cursor,
        watch_seconds=0, clock=clock, sleep=clock.sleep, policies=Policies.without(["results_index"]),
    )
    assert checked.status == "waiting" and list(store.list(staging_key(ref, FOLDS))) == []
    area = StagingArea(store, ref)
    rounds = area.read_rounds()
    expected = [entry for found in rounds for item in found.items for entry in result_of(item).entries]
    assert area.read_results(rounds) == expected


def test_rounds_are_paced_while_streaming_and_planned_at_once_when_the_stream_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the stream arrives a round waits for the round interval and ROUND_TARGET_CHUNKS ready chunks, or
    ROUND_MAX_SECONDS since the last; the stream's end is planned at the next poll, whatever is ready."""
    monkeypatch.setattr(pacing, "ROUND_TARGET_CHUNKS", 8)  # two of these 4-chunk segments
    store, ref, clock = LocalStore(tmp_path), BackupRef.new("db"), VirtualClock()
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    store.put(segment_record_key(ref, 0, 0), record(ref, 0, 0, 0, 400).to_bytes())
    first = watch(store, ref, clock)
    assert first.status == "ready"  # the first round at once
    finish(store, ref, first)
    store.put(segment_record_key(ref, 0, 1), record(ref, 0, 1, 400, 400).to_bytes())
    started = clock.now
    waiting = watch(store, ref, clock, first.to_json()["cursor"], seconds=60, rounds=10)
    assert waiting.status == "waiting" and clock.now - started >= 58  # 4 chunks ready: fewer than the target
    store.put(segment_record_key(ref, 0, 2), record(ref, 0, 2, 800, 400).to_bytes())
    started = clock.now
    second = watch(store, ref, clock, waiting.to_json()["cursor"], seconds=60, rounds=10)
    assert second.status == "ready" and second.chunks == 8 and clock.now - started <= 2  # the target reached
    finish(store, ref, second)
    store.put(segment_record_key(ref, 0, 3), record(ref, 0, 3, 1200, 400).to_bytes())
    started = clock.now
    slow = watch(store, ref, clock, second.to_json()["cursor"], seconds=400, rounds=10)
    assert slow.status == "ready" and slow.chunks == 4 and pacing.ROUND_MAX_SECONDS <= clock.now - started <= pacing.ROUND_MAX_SECONDS + 3
    finish(store, ref, slow)
    store.put(segment_record_key(ref, 0, 4), record(ref, 0, 4, 1600, 400).to_bytes())
    clock.at(3, lambda: store.put(stream_end_key(ref), StreamEnd([2000], [5]).to_bytes()))
    started = clock.now
    last = watch(store, ref, clock, slow.to_json()["cursor"], seconds=60, rounds=10)
    assert last.status == "ready" and clock.now - started <= 4  # the stream's end is noticed at the next poll
    finish(store, ref, last)
    assert watch(store, ref, clock, last.to_json()["cursor"]).status == "done"


def test_round_due_needs_the_interval_then_the_volume_or_the_longest_wait() -> None:
    target, longest = pacing.ROUND_TARGET_CHUNKS, pacing.ROUND_MAX_SECONDS
    assert not pacing.round_due(9.9, 0, target)  # the interval first (10 s at the start)
    assert pacing.round_due(10, 0, target) and not pacing.round_due(10, 0, target - 1)
    assert not pacing.round_due(longest - 1, 0, 1) and pacing.round_due(longest, 0, 1)
    assert not pacing.round_due(50, 10_000, target)  # an execution 10,000 s old: rounds 100 s apart
    assert pacing.round_due(100, 10_000, target)
    assert pacing.round_due(100, 10_000, 0, min_round_seconds=0)  # unpaced (a direct call): the interval alone


def test_a_watch_with_nothing_new_ends_at_its_limit(tmp_path: Path) -> None:
    store, ref, clock = LocalStore(tmp_path), BackupRef.new("db"), VirtualClock()
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    started = clock.now
    idle = watch(store, ref, clock, seconds=60)
    assert idle.status == "waiting" and 58 <= clock.now - started <= 60 and idle.wait_seconds == 1


def test_a_renewed_lease_keeps_a_slow_upload_alive_and_a_silent_agent_is_declared_stalled(tmp_path: Path) -> None:
    store, ref, clock = LocalStore(tmp_path), BackupRef.new("db"), VirtualClock()
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    lease = agent_lease_key(ref)
    for minute in range(1, 6):
        clock.at(60 * minute, lambda minute=minute: store.put(lease, f"refreshed {minute}".encode()))
    # No segment for 300 s, far past a 100 s stall limit, but the lease keeps being renewed.
    status = watch(store, ref, clock, seconds=300, stall=100)
    assert status.status == "waiting"
    with pytest.raises(StagingStalledError, match="no lease renewal"):
        watch(store, ref, clock, status.to_json()["cursor"], seconds=300, stall=100)  # the agent went silent


def test_unfinished_items_are_planned_again_then_held_for_resume_and_finished_work_is_kept(tmp_path: Path) -> None:
    store, ref, clock = LocalStore(tmp_path), BackupRef.new("db"), VirtualClock()
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    for segment in range(2):
        store.put(segment_key(ref, 0, segment), b"x" * 400)
        store.put(segment_record_key(ref, 0, segment), record(ref, 0, segment, segment * 400, 400).to_bytes())
    store.put(stream_end_key(ref), StreamEnd([800], [2]).to_bytes())
    first = watch(store, ref, clock)
    items = StagingArea(store, ref).read_items(first.items_key, first.round)
    failing = {i.first_index for i in items if i.segment_index == 1}
    finish(store, ref, first, failing=failing)

    status = first
    for attempt in (1, 2):  # re-planned twice, only the unfinished items, same chunk indexes
        status = watch(store, ref, clock, status.to_json()["cursor"])
        again = StagingArea(store, ref).read_items(status.items_key, status.round)
        assert status.status == "ready" and status.items_key.endswith(f"retry-00001-{attempt:02d}.json")
        assert {i.first_index for i in again} == failing
        finish(store, ref, status, failing=failing)
    # The finished segment's raw bytes are gone already; the unfinished one's stay.
    assert store.head(segment_key(ref, 0, 0)) is None and store.head(segment_key(ref, 0, 1)) is not None
    StagingArea(store, ref).write_failure(ItemFailure(min(failing), 2, "StorageError", "S3 refused writing: InternalError"))

    held = watch(store, ref, clock, status.to_json()["cursor"])
    hold = StagingArea(store, ref).read_hold()
    assert held.status == "held" and hold is not None and hold.items == len(failing)
    assert hold.cause.startswith(f"chunks {min(failing)}..") and "StorageError: S3 refused writing" in hold.cause
    # Held, the backup waits (no stall, no new round) and keeps what is done.
    held = watch(store, ref, clock, held.to_json()["cursor"], seconds=400, stall=100)
    assert held.status == "held" and store.head(segment_key(ref, 0, 1)) is not None

    StagingArea(store, ref).write_resume_request(ResumeRequest("resume-1"))  # braid backup --resume
    resumed = watch(store, ref, clock, held.to_json()["cursor"])
    assert resumed.status == "ready" and {i.first_index for i in StagingArea(store, ref).read_items(resumed.items_key, resumed.round)} == failing
    assert StagingArea(store, ref).read_hold() is None
    finish(store, ref, resumed)
    assert watch(store, ref, clock, resumed.to_json()["cursor"]).status == "done"
    assert store.head(segment_key(ref, 0, 1)) is None


def test_a_hold_nobody_resumes_ends_and_an_abandon_ends_it_at_once(tmp_path: Path) -> None:
    store, ref, clock = LocalStore(tmp_path), BackupRef.new("db"), VirtualClock()
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    store.put(segment_record_key(ref, 0, 0), record(ref, 0, 0, 0, 400).to_bytes())
    store.put(stream_end_key(ref), StreamEnd([400], [1]).to_bytes())
    status = watch(store, ref, clock)
    for _ in range(3):
        status = watch(store, ref, clock, status.to_json()["cursor"])  # no worker ever stores a result
    assert status.status == "held"
    cursor = status.to_json()["cursor"]
    clock.now += HOLD_SECONDS
    with pytest.raises(BackupHeldError, match="was held 24 h for 'braid backup --resume"):
        watch(store, ref, clock, cursor)
    clock.now -= HOLD_SECONDS
    store.put(stream_end_key(ref), StreamEnd([400], [1], abandoned="the operator gave it up").to_bytes())
    with pytest.raises(StreamAbandonedError, match="the operator gave it up"):
        watch(store, ref, clock, cursor)


def test_a_short_stall_window_reads_the_lease_often_enough_to_see_its_renewals(tmp_path: Path) -> None:
    # --stall-timeout 20: the agent renews its lease every 5 s (heartbeat_seconds), and the planner must read it
    # as often, not once a minute, or a live upload would be declared dead after 20 s.
    assert heartbeat_seconds(20) == 5 and heartbeat_seconds(3600) == 60
    store, ref, clock = LocalStore(tmp_path), BackupRef.new("db"), VirtualClock()
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    for tick in range(1, 25):
        clock.at(5 * tick, lambda tick=tick: store.put(agent_lease_key(ref), f"renewal {tick}".encode()))
    status = watch(store, ref, clock, seconds=110, stall=20)
    assert status.status == "waiting" and status.idle_seconds < 20
    with pytest.raises(StagingStalledError, match="no lease renewal from the agent for 2"):
        watch(store, ref, clock, status.to_json()["cursor"], seconds=110, stall=20)


def test_a_failed_coordinator_step_holds_the_backup_and_resume_carries_on_from_the_cursor(tmp_path: Path) -> None:
    store, ref, clock = LocalStore(tmp_path), BackupRef.new("db"), VirtualClock()
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    store.put(segment_key(ref, 0, 0), b"x" * 400)
    store.put(segment_record_key(ref, 0, 0), record(ref, 0, 0, 0, 400).to_bytes())
    store.put(stream_end_key(ref), StreamEnd([400], [1]).to_bytes())
    first = watch(store, ref, clock)
    finish(store, ref, first)
    done = watch(store, ref, clock, first.to_json()["cursor"])
    assert done.status == "done"

    # Finalize fails (S3 refused a write): the Hold state holds the backup, naming the step and its error.
    error = {"Error": "StorageError", "Cause": json.dumps({"errorType": "StorageError", "errorMessage": "S3 refused writing: InternalError"})}
    held = hold_step_failure(store, ref, "Finalize", error, done.to_json(), clock=clock)
    hold = StagingArea(store, ref).read_hold()
    assert held.status == "held" and hold is not None
    assert (hold.cause, hold.items) == ("Finalize failed: StorageError: S3 refused writing: InternalError", 0)
    # Held, nothing is deleted and nothing planned; past the stall window the agent is not declared dead.
    still = watch(store, ref, clock, held.to_json()["cursor"], seconds=400, stall=100)
    assert still.status == "held" and len(StagingArea(store, ref).read_rounds()) == 1

    StagingArea(store, ref).write_resume_request(ResumeRequest("resume-1"))  # braid backup --resume
    assert watch(store, ref, clock, still.to_json()["cursor"]).status == "done"  # Finalize again
    assert StagingArea(store, ref).read_hold() is None


def test_a_call_is_a_hold_only_when_the_hold_state_makes_it_one() -> None:
    """The Hold state calls the Plan function with its entry (braid_infra.pipeline): no id is compared. The state after
    a hold still carries $.failed, and the planner's later calls, given the state itself, are never holds."""
    error = {"Error": "StorageError", "Cause": "S3 refused"}
    state = {"backup": "db@x", "plan": {"status": "held"}, "failed": {"step": "Finalize"}, "error": error}
    entry = hold_entry({contract.HOLD_ENTRY: {"step": "Finalize", "error": error}, contract.HOLD_STATE: state})
    assert entry == HoldEntry("Finalize", error, state)
    assert hold_entry(state) is None  # a PlanSegments call after the hold: the state, with its old $.failed
    assert hold_entry({contract.HOLD_ENTRY: {"step": "PlanSegments"}, contract.HOLD_STATE: {}}) == HoldEntry("PlanSegments", None, {})
    for malformed in (
        {contract.HOLD_ENTRY: {"step": "Finalize", "error": error}},  # no state
        {contract.HOLD_ENTRY: {"error": error}, contract.HOLD_STATE: state},  # no step
        {contract.HOLD_ENTRY: {"step": "", "error": error}, contract.HOLD_STATE: state},
        {contract.HOLD_ENTRY: "Finalize", contract.HOLD_STATE: state},
        {contract.HOLD_ENTRY: {"step": "Finalize", "error": "boom"}, contract.HOLD_STATE: state},
    ):
        with pytest.raises(UsageError, match="the Hold state's"):
            hold_entry(malformed)


def test_a_hold_after_a_failed_step_ends_like_any_hold(tmp_path: Path) -> None:
    store, ref, clock = LocalStore(tmp_path), BackupRef.new("db"), VirtualClock()
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())
    held = hold_step_failure(store, ref, "PlanSegments", {"Error": "KeyAccessError", "Cause": "kms:Decrypt denied"}, None, clock=clock)
    clock.now += HOLD_SECONDS
    with pytest.raises(BackupHeldError, match="after a pipeline step failed \\(PlanSegments failed: KeyAccessError: kms:Decrypt denied\\)"):
        watch(store, ref, clock, held.to_json()["cursor"])


def test_a_planner_that_may_sleep_sleeps_rather_than_watch_until_the_next_round_is_due(tmp_path: Path) -> None:
    """The Plan function's calls (may_sleep): with the next round far off, "sleeping" at once, no watch billed; the wake
    record the state machine then writes asks for the round's chunks. After the stream's end it never sleeps."""
    store, ref, clock = LocalStore(tmp_path), BackupRef.new("db"), VirtualClock()
    store.put(session_key(ref), SessionRecord(str(ref), "repo", CHUNK, 4, 3, ["a"], "now").to_bytes())

    def call(cursor=None):  # type: ignore[no-untyped-def]
        return plan_next_round(
            store, ref, max_concurrency=2, max_chunks_per_item=3, poll_seconds=5, stall_seconds=3600, cursor=cursor,
            watch_seconds=400, min_round_seconds=10, clock=clock, sleep=clock.sleep, may_sleep=True,
        )

    started = clock.now
    before = call()
    assert (before.status, before.wake_chunks, clock.now - started) == ("sleeping", 1, 0)  # the first recorded chunk wakes it
    store.put(segment_record_key(ref, 0, 0), record(ref, 0, 0, 0, 400).to_bytes())
    clock.now += 60  # a slow stream: 4 chunks in a minute
    first = call(before.to_json()["cursor"])
    assert first.status == "ready"
    finish(store, ref, first)
    started = clock.now
    asleep = call(first.to_json()["cursor"])
    shown = asleep.to_json()
    assert (shown["status"], shown["wake_chunks"], clock.now - started) == ("sleeping", 4 + pacing.ROUND_TARGET_CHUNKS, 0)
    assert 0 < shown["wait_seconds"] <= 900 and shown["wake_after_seconds"] >= 0
    store.put(segment_record_key(ref, 0, 1), record(ref, 0, 1, 400, 100).to_bytes())
    store.put(stream_end_key(ref), StreamEnd([500], [2]).to_bytes())
    last = call(asleep.to_json()["cursor"])
    assert last.status == "ready"  # woken by the end: planned at once
