"""Prepare Lambda: KMS GenerateDataKey for the backup; wrapped key to staging key.json.

Event: the execution input ({"backup": "NAME@ID", "prefix": ..., ...}).
Returns: {"repository", "chunk_size", "level", "inputs", "key_id"} (state $.prepared).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from braid.adapters.aws.lambda_env import key_service, repository_store
from braid.pipeline.execution_input import ExecutionInput
from braid.pipeline.prepare import prepare_backup

logger = Logger()
tracer = Tracer()
metrics = Metrics()


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = ExecutionInput.from_event(event)
    logger.append_keys(backup=request.backup)
    prepared = prepare_backup(repository_store(request.prefix), key_service(), request.ref)
    metrics.add_metric(name="BackupsPrepared", unit=MetricUnit.Count, value=1)
    logger.info("data key staged", extra={"key_id": prepared.key_id, "inputs": prepared.inputs})
    return prepared.to_json()
