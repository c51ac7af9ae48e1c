"""Scheduled maintenance Lambda: deep-verify the latest backups, then start the prune run.

Event (from the EventBridge schedule): {"prefix": "", "sample_percent": 10,
"orphan_grace_hours": 48} and the stack's retention rules, any of keep_last,
keep_hourly, keep_daily, keep_weekly, keep_monthly, keep_yearly, keep_within
("1y6m"), keep_days; without any, each name's policy stored in the
repository applies, and names without one keep every backup.
Returns: {"ok", "verified": [VerifyReport JSON...], "skipped": [...], "prune_run": execution ARN}.
A failed verify also emits an EventBridge "Verify Failed" event and an error
metric. The prune itself runs in the prune state machine
(braid.pipeline.prune_plan), with the backups that failed here distrusted.
"""

from __future__ import annotations

from typing import Any

from braid import contract
from braid.adapters.aws.lambda_env import event_publisher, key_service, prune_runs, repository_store
from braid.format.repository import Repository
from braid.pipeline.maintenance import run_maintenance
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    event = event or {}
    sample = event.get("sample_percent")
    repository = Repository.open(repository_store(str(event.get("prefix", ""))))
    logger.append_keys(repository=repository.url)
    prune_input = {k: v for k, v in event.items() if k != "sample_percent"}
    report = run_maintenance(
        repository,
        key_service(),
        event_publisher(),
        prune_runs(),
        sample_percent=float(sample) if sample is not None else None,
        prune_input=prune_input,
        time_left=lambda: context.get_remaining_time_in_millis() / 1000,
    )
    failed = [r for r in report.verified if not r.get("ok")]
    add_metrics(
        {
            "BackupsVerified": (MetricUnit.Count, len(report.verified)),
            contract.METRIC_VERIFY_FAILURES: (MetricUnit.Count, len(failed)),
        }
    )
    if failed:
        logger.error("verify failed", extra={"failed": [r["backup"] for r in failed]})
    if report.skipped:
        logger.warning("verify ran short of time", extra={"skipped": report.skipped})
    return report.to_json()
