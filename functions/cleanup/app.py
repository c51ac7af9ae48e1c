"""Cleanup Lambda: after any failure, abort uploads, remove partial chunks and staging.

Event: the state with the caught error ({execution input..., "error": {"Error", "Cause"}}).
Returns (state $.failure): {"error", "cause"}; the Fail state reports them, and
the EventBridge "Backup Failed" event carries them.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from braid.adapters.aws.lambda_env import S3StagingJanitor, event_publisher, repository_store
from braid.format.ids import BackupRef
from braid.pipeline.cleanup import cleanup_step

logger = Logger()
tracer = Tracer()
metrics = Metrics()


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, str]:
    # Parsed leniently: Cleanup must run even when the input itself was the problem.
    ref = BackupRef.parse(str(event["backup"]))
    logger.append_keys(backup=str(ref))
    store = repository_store(str(event.get("prefix", "")))
    failure = cleanup_step(store, S3StagingJanitor(store), event_publisher(), ref, event.get("error"))
    metrics.add_metric(name="BackupsFailed", unit=MetricUnit.Count, value=1)
    logger.error("backup failed", extra=failure.to_json())
    return failure.to_json()
