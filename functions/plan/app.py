"""Plan Lambda: turn newly completed staging segments into the next map round.

Event: the state ({execution input..., "plan": previous result or absent}).
Returns (state $.plan): {"status": "ready"|"waiting"|"done", "round", "items_key",
"items_object" (full S3 key for the ItemReader), "items", "chunks",
"planned_chunks", "idle_seconds", "wait_seconds"}.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from braid.adapters.aws.lambda_env import repository_store
from braid.pipeline.execution_input import ExecutionInput
from braid.pipeline.plan import plan_next_round

logger = Logger()
tracer = Tracer()
metrics = Metrics()


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = ExecutionInput.from_event(event)
    logger.append_keys(backup=request.backup)
    previous = event.get("plan") or {}
    idle = int(previous.get("idle_seconds", 0)) if previous.get("status") == "waiting" else 0
    store = repository_store(request.prefix)
    status = plan_next_round(
        store,
        request.ref,
        max_concurrency=request.max_concurrency,
        max_chunks_per_item=request.max_chunks_per_item,
        poll_seconds=request.poll_seconds,
        stall_seconds=request.stall_seconds,
        idle_seconds=idle,
    )
    result = status.to_json()
    result["items_object"] = store.object_key(status.items_key) if status.items_key else ""
    if status.status == "ready":
        metrics.add_metric(name="ChunksPlanned", unit=MetricUnit.Count, value=status.chunks)
        metrics.add_metric(name="MapItemsPlanned", unit=MetricUnit.Count, value=status.items)
    logger.info("plan", extra={k: v for k, v in result.items() if k != "items_object"})
    return result
