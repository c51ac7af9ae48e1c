"""Cleanup: after any failure, leave nothing half-done and say why.

Aborts multipart uploads, deletes the backup's partial chunks and its
staging, emits "Backup Failed", and returns the error and a cause a person
can act on (the Fail state reports it; the agent prints it). A published
manifest (Finalize failed after publishing) keeps the backup's chunks: only
staging goes. An execution not named after its input's backup touches
nothing and sends no event: it only reports. The cause names the first
failed worker's own error from staging; an error named `States.*` (AWS
reserves them for a Fail state) is reported as "BackupFailed", its name
kept in the cause.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from braid.contract import BACKUP_FAILED
from braid.engine.finalize import discard_backup_data
from braid.errors import BackupError, UsageError
from braid.format.ids import BackupRef
from braid.format.staging import ItemFailure, StagingArea
from braid.pipeline.execution_input import ExecutionMismatchError
from braid.pipeline.failure import describe_error
from braid.pipeline.finalize import published_manifest
from braid.ports.pipeline import EventPublisher, StagingJanitor
from braid.ports.store import ObjectStore

# What to do about each error the pipeline raises or Step Functions reports.
HINTS: dict[str, str] = {
    "IntegrityError": "a check of the staged stream or of the stored chunks failed (the cause says which); run the backup again",
    "States.ExceedToleratedFailureThreshold": "workers kept failing on some chunks past every retry (the cause names the first worker's error; the map run lists every failed item); run the backup again",
    "BackupHeldError": "workers kept failing on some chunks and nobody ran 'braid backup --resume' within the hold; fix the cause (the cause names the worker's error), then run the backup again",
    "StagingStalledError": "start the backup again; the agent must keep uploading until the stream ends",
    "StreamAbandonedError": "fix what the agent reported (the producer's own error, or why the stream was empty), then run the backup again",
    "KeyAccessError": "check that the stack's KMS key is enabled and its key policy lets the pipeline roles use it",
    "NotFoundError": "the agent must stage the backup (session.json) in the stack's bucket before starting the pipeline; removed staging cannot be resumed, start a new backup",
    "RepositoryError": "the stack's bucket must hold a Braid repository of this version (braid init --stack NAME creates it)",
    "StorageError": "S3 kept refusing or failing requests; check the bucket and retry the backup",
    "LimitError": "use a larger --chunk-size",
    "UsageError": "the execution input is invalid; start backups with the braid agent",
    "ExecutionMismatchError": "an execution may only process the backup it is named after; start backups with the braid agent",
    "States.Timeout": "a step ran out of time; retry, or use a smaller --chunk-size",
    "Sandbox.Timedout": "a worker ran out of time; retry, or use a smaller --chunk-size",
    "Lambda.TooManyRequestsException": "Lambda throttled the workers past every retry; lower --max-concurrency or raise the account's concurrency",
    "States.ItemReaderFailed": "the chunk plan could not be read from S3; retry the backup",
    "States.DataLimitExceeded": "a step's output exceeded 256 KiB; report this as a Braid bug",
    "ExecutionTimedOut": "the backup ran past the execution's time limit (its stream was too slow for its size); back up at a higher rate, or in parts",
}
# The EventBridge event Step Functions sends when an execution changes status ("Step Functions Execution Status Change").
STATUS_CHANGE = ("aws.states", "Step Functions Execution Status Change")
DEFAULT_HINT = "see the execution history for details, then run the backup again"
# What the Fail state reports instead of a name AWS reserves for itself.
GENERIC_ERROR = "BackupFailed"
RESERVED_PREFIX = "States."


@dataclass(frozen=True)
class Failure:
    error: str
    cause: str

    def to_json(self) -> dict[str, str]:
        return {"error": self.error, "cause": self.cause}


def reportable(name: str) -> str:
    """An error name a Fail state may report: none of AWS's reserved `States.*` names."""
    return GENERIC_ERROR if name.startswith(RESERVED_PREFIX) else name


def actionable_cause(ref: BackupRef, error: Mapping[str, Any] | None, kept_manifest: bool, worker: ItemFailure | None = None) -> Failure:
    name, message = describe_error(error)
    hint = HINTS.get(name, DEFAULT_HINT)
    if worker is not None:
        message = f"{message}. The first failed worker ({worker.describe()})"
    if kept_manifest:
        return Failure(reportable(name), f"backup {ref} was published, but the pipeline failed afterwards ({name}: {message}); staging was removed")
    return Failure(reportable(name), f"backup {ref} failed ({name}): {message}. Nothing was published. What to do: {hint}")


def mismatched_execution(execution: str, ref: BackupRef) -> Failure:
    return Failure(
        ExecutionMismatchError.__name__,
        f"execution {execution!r} was started for backup {ref}; an execution may only process the backup it is named after,"
        f" so nothing of {ref} was touched. What to do: {HINTS[ExecutionMismatchError.__name__]}",
    )


def cleanup_step(
    store: ObjectStore,
    uploads: StagingJanitor,
    events: EventPublisher,
    ref: BackupRef,
    error: Mapping[str, Any] | None,
    execution: str | None = None,
) -> Failure:
    """`execution`: the running execution's name (None when not run by the state machine)."""
    if execution is not None and execution != str(ref):
        return mismatched_execution(execution, ref)
    area = StagingArea(store, ref)
    try:
        worker = area.first_failure()
    except BackupError:  # it only explains the failure: never let it stop the cleanup
        worker = None
    kept = published_manifest(store, ref) is not None
    if not kept:
        discard_backup_data(store, ref)
    area.remove(uploads)
    failure = actionable_cause(ref, error, kept, worker)
    events.publish(BACKUP_FAILED, {"backup": str(ref), "repository": store.url, **failure.to_json()})
    return failure


def timed_out_state(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The state Cleanup is given, from Step Functions' event for an execution that TIMED_OUT; None for any other event.

    An execution past its TimeoutSeconds ends without running any Catch, so Cleanup would never run: an EventBridge
    rule sends it this event instead (braid_infra.timeouts). The execution's input names the backup and the
    execution's name must be that backup, as in every step: an execution named otherwise only reports.
    """
    if (event.get("source"), event.get("detail-type")) != STATUS_CHANGE:
        return None
    detail = event.get("detail")
    if not isinstance(detail, Mapping) or detail.get("status") != "TIMED_OUT":
        raise UsageError(f"cleanup is sent only timed-out executions, not {detail!r}")
    try:
        state = json.loads(str(detail.get("input")))
    except ValueError:
        state = None
    if not isinstance(state, dict) or "backup" not in state:
        raise UsageError(f"execution {detail.get('name')!r} timed out, but its event carries no execution input naming the backup")
    cause = f"execution {detail.get('name')} ran past its time limit (started {detail.get('startDate')}, stopped {detail.get('stopDate')})"
    return {**state, "execution": {"name": str(detail.get("name"))}, "error": {"Error": "ExecutionTimedOut", "Cause": cause}}
