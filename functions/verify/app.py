"""Scheduled maintenance Lambda: start the prune run with the stack's retention rules, and measure staging.

The verifying is the verify state machine's (its own daily schedule,
braid_infra.verify_pipeline); the prune state machine's planner distrusts
the backups whose newest verify record failed (braid.pipeline.prune_plan).

Event (from the EventBridge schedule): {"prefix": "", "orphan_grace_hours": 48}
(a "sample_percent" is ignored) and the stack's retention rules, any of keep_last,
keep_hourly, keep_daily, keep_weekly, keep_monthly, keep_yearly, keep_within
("1y6m"), keep_days; without any, each name's policy stored in the
repository applies, and names without one keep every backup.
Returns: {"ok", "prune_run": execution ARN, "oldest_staging": NAME@ID | null,
"oldest_staging_hours"}; the hours are also the OldestStagingHours metric,
which alarms past a day.
"""

from __future__ import annotations

from typing import Any

from braid import contract
from braid.adapters.aws.lambda_env import prune_runs, repository_store
from braid.pipeline.maintenance import run_maintenance
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    event = event or {}
    prune_input = {k: v for k, v in event.items() if k != "sample_percent"}
    report = run_maintenance(prune_runs(), prune_input=prune_input, store=repository_store(str(event.get("prefix", ""))))
    add_metrics({contract.METRIC_OLDEST_STAGING_HOURS: (MetricUnit.NoUnit, report.oldest_staging_hours)})
    logger.info("prune started", extra=report.to_json())
    return report.to_json()
