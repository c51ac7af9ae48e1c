"""PlanVerify Lambda: the backups and chunks a cloud verify checks; quick mode checks them here.

Event: the state (the execution input, braid.pipeline.verify_request, and
$.execution.name). Returns (state $.plan): {"run", "mode", "map" (true when
the map has items), "items", "items_object" (full S3 key for the ItemReader),
"chunks", "backups", "max_concurrency" (clamped to the worker's reserved
concurrency)}.
"""

from __future__ import annotations

from typing import Any

from braid.adapters.aws.lambda_env import key_service, repository_store, worker_concurrency
from braid.errors import UsageError
from braid.format.repository import Repository
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler
from braid.pipeline.verify_plan import plan_verify, write_plan
from braid.pipeline.verify_request import VerifyRequest


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = VerifyRequest.from_event(event)
    run = str((event.get("execution") or {}).get("name") or "")
    if not run:
        raise UsageError("the verify state machine passes $.execution.name: the run is named after its execution")
    store = repository_store(request.prefix)
    repository = Repository.open(store)
    plan = plan_verify(repository, key_service() if request.deep else None, request, run)
    status = write_plan(repository, plan)
    add_metrics({"ChunksToVerify": (MetricUnit.Count, status["chunks"]), "VerifyItemsPlanned": (MetricUnit.Count, status["items"])})
    logger.info("verify plan", extra=status)
    return {
        **status,
        "items_object": store.object_key(status["items_key"]) if status["items_key"] else "",
        "max_concurrency": min(request.max_concurrency, worker_concurrency()),
    }
