"""A cloud incremental's agent waits for its parent's values before it starts the producer.

The host holds no key, so it cannot read the parent's encrypted metadata.
Prepare can: it authenticates the parent's chain and writes its answer to
the backup's own staging (braid.pipeline.parent). The agent polls for it
(bounded by PARENT_WAIT_SECONDS, and by the execution's own end), then
either starts the producer with the values (`BackupRequest.start_sources`)
or raises the refusal: IntegrityError (exit 6: the parent or an ancestor is
missing or unreadable) or UsageError (exit 2: a placeholder the parent has
no value for). The caller abandons the stream on any error, so the pipeline
fails at once and Cleanup removes the staging: nothing is published.
"""

from __future__ import annotations

import time

from braid.engine.port import BackupRequest
from braid.engine.stream import InputSource
from braid.errors import ExecutionError, IntegrityError, UsageError
from braid.format.staging import StagingArea
from braid.ports.executions import Executions
from braid.ports.progress import ProgressFn

# Prepare answers within seconds (one Lambda; a KMS Decrypt and a GET per link of the chain); a cold start under load,
# retries of a throttled step, a long chain: minutes at worst.
PARENT_WAIT_SECONDS = 300.0


def await_parent(
    area: StagingArea, pipeline: Executions, request: BackupRequest, progress: ProgressFn, *, poll_seconds: float,
    watch_seconds: float = 0.0, wait_seconds: float = PARENT_WAIT_SECONDS,
) -> list[InputSource]:
    """The inputs to read: the producer, started with the parent's values, or the request's own sources.

    Reads its staging every `poll_seconds`; asks Step Functions (DescribeExecution, throttled per account) only
    every `watch_seconds`, or at once when the session is gone (Cleanup removed it: the execution failed)."""
    ref = request.ref
    progress({"event": "waiting", "backup": str(ref), "message": f"waiting for the pipeline to open the parent {request.lineage.parent}"})
    deadline = time.monotonic() + wait_seconds
    described = -float("inf")
    while (found := area.read_parent()) is None:
        if time.monotonic() - described >= watch_seconds or not area.session_staged():
            status, described = pipeline.describe(ref), time.monotonic()
            if status.done:
                raise ExecutionError(status.failure_message(ref))
        if time.monotonic() > deadline:
            raise ExecutionError(
                f"the pipeline did not open the parent {request.lineage.parent} of {ref} within {wait_seconds:.0f} s (its Prepare step);"
                " nothing was started: look at the execution with 'braid status', then run the backup again"
            )
        time.sleep(poll_seconds)
    record, manifest = found
    if record.parent != request.lineage.parent:
        raise IntegrityError(f"the pipeline opened {record.parent}, not the parent {request.lineage.parent} this backup names")
    if record.refused is not None:
        raise IntegrityError(record.refused)
    if record.unavailable is not None:
        raise UsageError(record.unavailable)
    if request.start_sources is None:
        return list(request.sources)
    return request.start_sources(record.lsn, manifest)
