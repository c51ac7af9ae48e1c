"""While the agent uploads, it watches its execution: a pipeline that failed or holds the backup stops the upload at once.

Without it a host would keep streaming for hours into a backup the pipeline
had already given up (or held for `--resume`), and learn so only after the
stream ended. A daemon thread polls DescribeExecution (and the staging hold
record) every `interval` seconds (30 s: DescribeExecution is throttled per account); on a terminal status other than success,
or a hold, it calls `stop` with an ExecutionError carrying the pipeline's
own cause, which the uploader raises to the reader at its next chunk.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from braid.errors import BackupError, ExecutionError
from braid.format.ids import BackupRef
from braid.ports.executions import ExecutionStatus

WATCH_INTERVAL_SECONDS = 30.0


class PipelineStopped(ExecutionError):
    """The pipeline failed while the agent was still uploading: nothing is left to resume."""


class PipelineHeld(ExecutionError):
    """The pipeline holds the backup (workers kept failing): `--resume` finishes it."""


class ExecutionWatch:
    def __init__(
        self,
        ref: BackupRef,
        describe: Callable[[BackupRef], ExecutionStatus],
        held: Callable[[BackupRef], str | None],
        stop: Callable[[BaseException], None],
        interval: float = WATCH_INTERVAL_SECONDS,
    ) -> None:
        self._ref, self._describe, self._held, self._stop = ref, describe, held, stop
        self._interval = interval
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.stopped_with: ExecutionError | None = None

    def check(self) -> ExecutionError | None:
        """One look: the error to stop with, or None to keep uploading (a failed look is no reason to stop)."""
        try:
            status = self._describe(self._ref)
            if status.done and status.status != "SUCCEEDED":
                return PipelineStopped(status.failure_message(self._ref))
            message = self._held(self._ref)
        except BackupError:
            return None
        return PipelineHeld(message) if message is not None else None

    def _run(self) -> None:
        while not self._done.wait(self._interval):
            error = self.check()
            if error is not None:
                self.stopped_with = error
                self._stop(error)
                return

    def __enter__(self) -> ExecutionWatch:
        self._thread = threading.Thread(target=self._run, name="braid-execution-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
