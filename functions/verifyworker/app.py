"""VerifyWorker Lambda: deep-check one map item (a few chunks of one backup).

Event (built by the map's ItemSelector): {"prefix": ..., "item": {"backup": "NAME@ID", "chunks": [index, ...]}}.
Returns the item's outcome (braid.pipeline.verify_request.ItemOutcome JSON):
counts and failure messages only; no chunk byte leaves the worker.
"""

from __future__ import annotations

from typing import Any

from braid.adapters.aws.lambda_env import key_service, repository_store, worker_lanes
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler
from braid.pipeline.verify_worker import OpenedBackups, VerifyWorkerEvent, check_item

# Per container, reused across invocations: one manifest read and one KMS Decrypt per backup.
_backups: OpenedBackups | None = None


def _container() -> OpenedBackups:
    global _backups
    if _backups is None:
        _backups = OpenedBackups(key_service())
    return _backups


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = VerifyWorkerEvent.from_event(event)
    logger.append_keys(backup=request.item.backup, chunks=len(request.item.chunks))
    outcome = check_item(repository_store(request.prefix), request.item, _container(), workers=worker_lanes())
    add_metrics({"ChunksVerified": (MetricUnit.Count, outcome.chunks_checked), "BytesVerified": (MetricUnit.Bytes, outcome.bytes_checked)})
    if outcome.failures:
        logger.error("chunks failed verification", extra={"failures": [m for _, m in outcome.failures][:10]})
    return outcome.to_json()
