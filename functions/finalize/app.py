"""Finalize Lambda: check every planned chunk, publish the manifest last, delete staging.

Event: the state ({execution input..., "prepared", "plan"}).
Returns (state $.summary): {"backup", "repository", "manifest", "inputs", "chunks",
"plaintext_bytes", "stored_bytes", "ratio", "seconds"}; the same summary is the
detail of the EventBridge "Backup Completed" event.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from braid.adapters.aws.lambda_env import S3StagingJanitor, event_publisher, key_service, repository_store
from braid.pipeline.execution_input import ExecutionInput
from braid.pipeline.finalize import finalize_step

logger = Logger()
tracer = Tracer()
metrics = Metrics()


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = ExecutionInput.from_event(event)
    logger.append_keys(backup=request.backup)
    store = repository_store(request.prefix)
    summary = finalize_step(store, key_service(), S3StagingJanitor(store), event_publisher(), request.ref)
    metrics.add_metric(name="BackupsCompleted", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="BackupBytesIn", unit=MetricUnit.Bytes, value=summary.plaintext_bytes)
    metrics.add_metric(name="BackupBytesOut", unit=MetricUnit.Bytes, value=summary.stored_bytes)
    metrics.add_metric(name="BackupCompressionRatio", unit=MetricUnit.NoUnit, value=round(summary.ratio, 4))
    logger.info("backup published", extra=summary.to_json())
    return summary.to_json()
