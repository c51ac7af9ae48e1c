"""The sleeping pipeline and the agent's wake: when the planner sleeps, what the wake record says, when the agent sends it."""

from __future__ import annotations

from pathlib import Path

import pytest

from braid.adapters.local.store import LocalStore
from braid.agent.wake import PipelineWaker
from braid.errors import ExecutionError, IntegrityError
from braid.format.ids import BackupRef
from braid.format.staging import StagingArea, WakeRecord, wake_key
from braid.format.staging.wake import ONLY_AT_END
from braid.format.usage import FunctionUse, Usage
from braid.pipeline import pacing
from braid.pipeline.pacing import ROUND_MAX_SECONDS, ROUND_TARGET_CHUNKS, SLEEP_BREAK_EVEN_SECONDS, sleep_plan
from braid.pipeline.usage import plan_call_usage


def test_the_wake_record_round_trips_and_is_refused_when_malformed() -> None:
    record = WakeRecord(130, 40, "AQB4AAAA-token_with+symbols/==")
    assert WakeRecord.from_bytes(record.to_bytes(), "k") == record
    assert WakeRecord.from_bytes(b"-1 0 tok\n", "k") == WakeRecord(ONLY_AT_END, 0, "tok")  # as States.Format writes it
    for raw in (b"", b"12 tok", b"x 0 tok", b"-2 0 tok", b"1 -1 tok", b"1 0 two words", b"\xff 0 t"):
        with pytest.raises(IntegrityError, match="wake record k is malformed"):
            WakeRecord.from_bytes(raw, "k")


def test_the_wake_is_due_at_the_chunks_after_the_delay_or_at_the_end() -> None:
    record = WakeRecord(100, 30, "t")
    assert not record.due(99, 60, ended=False) and not record.due(100, 29, ended=False)
    assert record.due(100, 30, ended=False) and record.due(5, 0, ended=True)
    assert not WakeRecord(ONLY_AT_END, 0, "t").due(10**9, 10**9, ended=False)
    assert WakeRecord(ONLY_AT_END, 0, "t").due(0, 0, ended=True)


def test_the_planner_sleeps_only_when_the_next_round_is_far_off() -> None:
    plan = dict(planned_chunks=1000, age_seconds=2000.0, stall_seconds=3600)
    # 1000 chunks in 2000 s (32 MB/s at 64 MiB): ROUND_TARGET_CHUNKS more take ~256 s: sleep until they are recorded.
    slow = sleep_plan(ready_chunks=0, since_last_seconds=5.0, **plan)
    assert slow is not None and slow.wake_chunks == 1000 + ROUND_TARGET_CHUNKS
    assert slow.wake_after_seconds == 15  # the round interval (age / 100 = 20 s) is not over for 15 s
    assert slow.timeout_seconds == ROUND_MAX_SECONDS - 5  # the longest a round waits
    # At 1 GB/s (~15 chunks a second) the target is seconds away: watching is cheaper than a sleep.
    assert sleep_plan(ready_chunks=0, since_last_seconds=5.0, planned_chunks=30_000, age_seconds=2000.0, stall_seconds=3600) is None
    # Enough is ready but the interval is far off: sleep until then, woken only by the stream's end.
    late = sleep_plan(ready_chunks=ROUND_TARGET_CHUNKS, since_last_seconds=10.0, planned_chunks=0, age_seconds=20_000.0, stall_seconds=3600)
    assert late is not None and (late.wake_chunks, late.timeout_seconds) == (ONLY_AT_END, 190)
    near = sleep_plan(ready_chunks=ROUND_TARGET_CHUNKS, since_last_seconds=200 - SLEEP_BREAK_EVEN_SECONDS, planned_chunks=0, age_seconds=20_000.0, stall_seconds=3600)
    assert near is None
    # Before the first round: woken by the first recorded chunk; never longer than a quarter of the stall window.
    first = sleep_plan(ready_chunks=0, since_last_seconds=None, planned_chunks=0, age_seconds=3.0, stall_seconds=60)
    assert first is not None and (first.wake_chunks, first.wake_after_seconds, first.timeout_seconds) == (1, 0, 15)
    assert sleep_plan(ready_chunks=2, since_last_seconds=None, planned_chunks=0, age_seconds=3.0, stall_seconds=60) is None
    assert sleep_plan(ready_chunks=0, since_last_seconds=5.0, planned_chunks=10, age_seconds=1e6, stall_seconds=10**6).timeout_seconds <= pacing.SLEEP_MAX_SECONDS  # type: ignore[union-attr]


def test_a_sleeping_plan_call_adds_the_sleep_state_and_its_put() -> None:
    own = Usage(requests={"s3:GetObject": 2}, functions={"plan": FunctionUse(1, 0.1, 0.1)})
    asleep = plan_call_usage(None, own, "sleeping", 0)
    assert asleep.transitions == 3 and asleep.requests["s3:PutObject"] == 1  # PlanSegments, SegmentsReady?, SleepUntilWoken


class Executions:
    """The Executions port as the waker uses it: SendTaskSuccess, recorded."""

    def __init__(self, *, stale: set[str] = frozenset(), failing: int = 0) -> None:  # type: ignore[assignment]
        self.sent: list[str] = []
        self.stale, self.failing = stale, failing

    def wake(self, token: str) -> bool:
        if self.failing:
            self.failing -= 1
            raise ExecutionError("SendTaskSuccess throttled")
        self.sent.append(token)
        return token not in self.stale


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_agent_wakes_once_what_the_planner_waits_for_is_recorded(tmp_path: Path) -> None:
    store, ref = LocalStore(tmp_path), BackupRef.new("db")
    area, executions, clock = StagingArea(store, ref), Executions(), Clock()
    state = {"recorded": 0, "ended": False}
    waker = PipelineWaker(area, executions, lambda: state["recorded"], lambda: state["ended"], clock=clock)
    assert waker.poke() is False  # not sleeping: no record, nothing sent
    store.put(wake_key(ref), WakeRecord(64, 20, "t1").to_bytes())
    state["recorded"] = 64
    assert waker.poke() is False  # recorded, but the planner asked for 20 s from the first read
    clock.now += 20
    assert waker.poke() is True and executions.sent == ["t1"]
    assert waker.poke() is False and executions.sent == ["t1"]  # a token is sent once
    # A new sleep: only the stream's end wakes it.
    store.put(wake_key(ref), WakeRecord(ONLY_AT_END, 0, "t2").to_bytes())
    state["recorded"] = 10**6
    assert waker.poke() is False
    state["ended"] = True
    assert waker.poke() is True and executions.sent == ["t1", "t2"] and waker.wakes == 2


def test_a_failed_wake_is_tried_again_and_a_stale_token_is_dropped(tmp_path: Path) -> None:
    store, ref = LocalStore(tmp_path), BackupRef.new("db")
    executions = Executions(stale={"old"}, failing=1)
    waker = PipelineWaker(StagingArea(store, ref), executions, lambda: 0, lambda: True)
    store.put(wake_key(ref), WakeRecord(ONLY_AT_END, 0, "old").to_bytes())
    assert waker.poke() is False and executions.sent == []  # the send failed: nothing raised, tried at the next poke
    assert waker.poke() is False and executions.sent == ["old"]  # the execution no longer waits for it
    assert waker.poke() is False and executions.sent == ["old"]  # and it is not sent again
    store.put(wake_key(ref), b"garbage")
    assert waker.poke() is False  # a malformed record is no reason to fail the upload


def test_lingering_pokes_until_its_time_is_up(tmp_path: Path) -> None:
    store, ref = LocalStore(tmp_path), BackupRef.new("db")
    executions, clock = Executions(), Clock()
    waker = PipelineWaker(StagingArea(store, ref), executions, lambda: 0, lambda: True, clock=clock)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds
        if len(slept) == 3:  # the planner went to sleep just after the stream ended: its token appears now
            store.put(wake_key(ref), WakeRecord(ONLY_AT_END, 0, "late").to_bytes())

    waker.linger(10, sleep=sleep)
    assert executions.sent == ["late"] and sum(slept) == 4  # then it stops: the planner's next look sees the end
    slept.clear()
    store.delete([wake_key(ref)])  # the pipeline went on; no sleep since
    PipelineWaker(StagingArea(store, ref), executions, lambda: 0, lambda: True, clock=clock).linger(3, sleep=lambda s: (slept.append(s), setattr(clock, "now", clock.now + s)))
    assert sum(slept) == 3 and executions.sent == ["late"]  # nothing new to wake: it looks for the whole time
