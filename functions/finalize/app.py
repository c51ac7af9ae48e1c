"""Finalize Lambda: check every planned chunk, publish the manifest last, delete staging.

Event: the state ({execution input..., "prepared", "plan"}).
Returns (state $.summary): {"backup", "repository", "manifest", "inputs", "chunks",
"plaintext_bytes", "stored_bytes", "ratio", "seconds"}; the same summary is the
detail of the EventBridge "Backup Completed" event.
"""

from __future__ import annotations

from typing import Any

from braid import contract
from braid.adapters.aws.lambda_env import S3StagingJanitor, event_publisher, key_service, repository_store
from braid.format.ids import BackupRef
from braid.pipeline.execution_input import ExecutionInput
from braid.pipeline.finalize import finalize_step
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, count_for_backup_name, logger, memory_mb, pipeline_handler
from braid.pipeline.usage import carried_usage
from braid.ports.usage import metering


def _notify_failed(ref: BackupRef, exc: Exception) -> None:
    """The backup is published; only its "Backup Completed" event was lost: say so, don't fail."""
    add_metrics({"NotificationsFailed": (MetricUnit.Count, 1)})
    logger.warning("backup published, but its event was not sent", extra={"error": type(exc).__name__, "cause": str(exc)})


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    with metering("finalize", memory_mb(context)) as meter:
        request = ExecutionInput.from_event(event)
        store = repository_store(request.prefix)
        carried = [carried_usage(event.get("prepared"), "$.prepared"), carried_usage(event.get("plan"), "$.plan")]
        summary = finalize_step(store, key_service(), S3StagingJanitor(store), event_publisher(), request.ref, _notify_failed, meter=meter, carried=carried)
    add_metrics(
        {
            "BackupsCompleted": (MetricUnit.Count, 1),
            "BackupBytesIn": (MetricUnit.Bytes, summary.plaintext_bytes),
            "BackupBytesOut": (MetricUnit.Bytes, summary.stored_bytes),
            "BackupCompressionRatio": (MetricUnit.NoUnit, round(summary.ratio, 4)),
        }
    )
    count_for_backup_name(contract.METRIC_BACKUP_PUBLISHED, request.ref.name)
    logger.info("backup published", extra=summary.to_json())
    return summary.to_json()
