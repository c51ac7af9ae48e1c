"""Cleanup: after any failure, leave nothing half-done and say why.

Aborts multipart uploads (S3 bills their parts until aborted), deletes the
backup's partial chunks and its staging, emits "Backup Failed", and returns
the error and a cause a person can act on, which the state machine's Fail
state reports and the agent prints.

One guard: if the manifest was already published (Finalize failed after
publishing, e.g. while deleting staging), the backup exists and its chunks
are kept; only staging goes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from braid.contract import BACKUP_FAILED
from braid.engine.finalize import discard_backup_data
from braid.format.ids import BackupRef
from braid.format.staging import StagingArea
from braid.pipeline.finalize import published_manifest
from braid.ports.pipeline import EventPublisher, StagingJanitor
from braid.ports.store import ObjectStore

# What to do about each error the pipeline raises or Step Functions reports.
HINTS: dict[str, str] = {
    "IntegrityError": "a check of the staged stream or of the stored chunks failed (the cause says which); run the backup again",
    "States.ExceededToleratedFailureThreshold": "workers kept failing on some chunks past every retry (see the map run's failed items); run the backup again",
    "StagingStalledError": "start the backup again; the agent must keep uploading until the stream ends",
    "StreamAbandonedError": "fix what the agent reported (the producer's own error, or why the stream was empty), then run the backup again",
    "KeyAccessError": "check that the stack's KMS key is enabled and its key policy lets the pipeline roles use it",
    "NotFoundError": "the agent must stage the backup (session.json) in the stack's bucket before starting the pipeline; removed staging cannot be resumed, start a new backup",
    "RepositoryError": "the stack's bucket must hold a Braid repository of this version (braid init --stack NAME creates it)",
    "StorageError": "S3 kept refusing or failing requests; check the bucket and retry the backup",
    "LimitError": "use a larger --chunk-size",
    "UsageError": "the execution input is invalid; start backups with the braid agent",
    "States.Timeout": "a step ran out of time; retry, or use a smaller --chunk-size",
    "Sandbox.Timedout": "a worker ran out of time; retry, or use a smaller --chunk-size",
    "Lambda.TooManyRequestsException": "Lambda throttled the workers past every retry; lower --max-concurrency or raise the account's concurrency",
    "States.ItemReaderFailed": "the chunk plan could not be read from S3; retry the backup",
    "States.DataLimitExceeded": "a step's output exceeded 256 KiB; report this as a Braid bug",
}
DEFAULT_HINT = "see the execution history for details, then run the backup again"


@dataclass(frozen=True)
class Failure:
    error: str
    cause: str

    def to_json(self) -> dict[str, str]:
        return {"error": self.error, "cause": self.cause}


def describe_error(error: Mapping[str, Any] | None) -> tuple[str, str]:
    """The error name and its message, unwrapped from a Lambda error payload when it is one."""
    if not error:
        return "BackupFailed", "the pipeline failed without an error record"
    name = str(error.get("Error") or "BackupFailed")
    cause = str(error.get("Cause") or "")
    try:
        payload = json.loads(cause)
        if isinstance(payload, dict) and "errorMessage" in payload:
            name = str(payload.get("errorType") or name)
            cause = str(payload["errorMessage"])
    except ValueError:
        pass
    return name, cause or "no cause given"


def actionable_cause(ref: BackupRef, error: Mapping[str, Any] | None, kept_manifest: bool) -> Failure:
    name, message = describe_error(error)
    hint = HINTS.get(name, DEFAULT_HINT)
    if kept_manifest:
        return Failure(name, f"backup {ref} was published, but the pipeline failed afterwards ({name}: {message}); staging was removed")
    return Failure(name, f"backup {ref} failed ({name}): {message}. Nothing was published. What to do: {hint}")


def cleanup_step(
    store: ObjectStore,
    uploads: StagingJanitor,
    events: EventPublisher,
    ref: BackupRef,
    error: Mapping[str, Any] | None,
) -> Failure:
    kept = published_manifest(store, ref) is not None
    if not kept:
        discard_backup_data(store, ref)
    StagingArea(store, ref).remove(uploads)
    failure = actionable_cause(ref, error, kept)
    events.publish(BACKUP_FAILED, {"backup": str(ref), "repository": store.url, **failure.to_json()})
    return failure
