"""Cleanup Lambda: after any failure, abort uploads, remove partial chunks and staging.

Event: the state with the caught error ({execution input..., "execution": {"name"},
"error": {"Error", "Cause"}}), or Step Functions' EventBridge event for an execution
that timed out (braid.pipeline.cleanup.timed_out_state: no Catch runs then). An
execution not named after its backup only reports.
Returns (state $.failure): {"error", "cause"}; the Fail state reports them, and
the EventBridge "Backup Failed" event carries them.
"""

from __future__ import annotations

from typing import Any

from braid.adapters.aws.lambda_env import S3StagingJanitor, event_publisher, repository_store
from braid.format.ids import BackupRef
from braid.pipeline.cleanup import cleanup_step, timed_out_state
from braid.pipeline.execution_input import ExecutionMismatchError, running_execution
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, str]:
    event = timed_out_state(event) or event
    # Parsed leniently: Cleanup must run even when the input itself was the problem.
    ref = BackupRef.parse(str(event["backup"]))
    try:
        execution = running_execution(event)
    except ExecutionMismatchError:
        execution = "<malformed>"  # never clean up after an execution that cannot say which it is
    store = repository_store(str(event.get("prefix", "")))
    failure = cleanup_step(store, S3StagingJanitor(store), event_publisher(), ref, event.get("error"), execution)
    add_metrics({"BackupsFailed": (MetricUnit.Count, 1)})
    logger.error("backup failed", extra=failure.to_json())
    return failure.to_json()
