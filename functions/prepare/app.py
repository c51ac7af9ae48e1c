"""Prepare Lambda: KMS GenerateDataKey for the backup; wrapped key to staging key.json.

Event: the execution input ({"backup": "NAME@ID", "prefix": ..., ...}).
Returns: {"repository", "chunk_size", "level", "inputs", "key_id", "usage"} (state $.prepared;
"usage": this invocation's, which Finalize adds to the manifest's).
"""

from __future__ import annotations

from typing import Any

from braid.adapters.aws.lambda_env import key_service, repository_store
from braid.pipeline.execution_input import ExecutionInput
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, memory_mb, pipeline_handler
from braid.pipeline.prepare import prepare_backup
from braid.ports.usage import metering


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    with metering("prepare", memory_mb(context)) as meter:
        request = ExecutionInput.from_event(event)
        prepared = prepare_backup(repository_store(request.prefix), key_service(), request.ref)
    add_metrics({"BackupsPrepared": (MetricUnit.Count, 1)})
    logger.info("data key staged", extra={"key_id": prepared.key_id, "inputs": prepared.inputs})
    return {**prepared.to_json(), "usage": meter.usage().to_json()}
