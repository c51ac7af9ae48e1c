"""Sweep Lambda: one item of the prune map (braid.pipeline.sweep).

Event (built by the map's ItemSelector): {"run", "prefix", "now" (the plan's
ISO time), "grace_hours", "item": {"n", "kind", "backup", "after", "until"[, "storage_class"]}}
(kind "backup", "leftover" or "move": braid.pipeline.prune_plan).
Returns: the item's outcome, also written to its result record.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from braid.adapters.aws.lambda_env import S3StagingJanitor, repository_store
from braid.pipeline.observability import LambdaContext, logger, pipeline_handler
from braid.pipeline.prune_plan import SweepItem
from braid.pipeline.sweep import sweep_item


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    item = SweepItem.from_json(event["item"])
    logger.append_keys(run=event["run"], backup=item.backup, item=item.n)
    store = repository_store(str(event.get("prefix", "")))
    result = sweep_item(
        store,
        S3StagingJanitor(store),
        item,
        run=str(event["run"]),
        now=datetime.fromisoformat(str(event["now"])),
        grace=timedelta(hours=float(event["grace_hours"])),
    )
    logger.info("item swept", extra=result.to_json())
    return result.to_json()
