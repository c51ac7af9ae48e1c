"""The agent watches its execution while it uploads: a failed or held pipeline stops the upload at once."""

from __future__ import annotations

import threading

from braid.agent.watch import ExecutionWatch, PipelineHeld, PipelineStopped
from braid.errors import ExecutionError, StorageError
from braid.format.ids import BackupRef
from braid.ports.executions import ExecutionStatus


def running() -> ExecutionStatus:
    return ExecutionStatus("arn:x", "RUNNING", None, None)


def test_a_failed_pipeline_stops_the_upload_with_its_own_cause() -> None:
    ref = BackupRef.new("db")
    statuses = iter([running(), StorageError("DescribeExecution throttled"), ExecutionStatus("arn:x", "FAILED", "StagingStalledError", f"backup {ref} failed (StagingStalledError): no lease")])
    stopped: list[BaseException] = []
    done = threading.Event()

    def describe(_: BackupRef) -> ExecutionStatus:
        found = next(statuses)
        if isinstance(found, Exception):
            raise found  # a failed look is no reason to stop
        return found

    def stop(exc: BaseException) -> None:
        stopped.append(exc)
        done.set()

    with ExecutionWatch(ref, describe, lambda _: None, stop, interval=0.01) as watch:
        assert done.wait(5)

    (error,) = stopped
    assert isinstance(error, PipelineStopped) and isinstance(error, ExecutionError) and error.exit_code == 9
    assert str(error) == f"backup {ref} failed (StagingStalledError): no lease"
    assert watch.stopped_with is error


def test_a_held_backup_stops_the_upload_with_the_way_back_in_and_a_running_one_does_not() -> None:
    ref = BackupRef.new("db")
    watch = ExecutionWatch(ref, lambda _: running(), lambda _: None, lambda _: None)
    assert watch.check() is None
    held = ExecutionWatch(ref, lambda _: running(), lambda _: f"backup {ref} is held: ... 'braid backup --resume {ref}'", lambda _: None)
    error = held.check()
    assert isinstance(error, PipelineHeld) and "--resume" in str(error)
