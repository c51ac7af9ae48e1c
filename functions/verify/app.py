"""Scheduled maintenance Lambda: apply retention, distrusting backups whose newest verification failed.

The verifying is the verify state machine's (its own daily schedule,
braid_infra.verify_pipeline); this reads the records it leaves.

Event (from the EventBridge schedule): {"prefix": "", "orphan_grace_hours": 48}
(a "sample_percent" is ignored) and the stack's retention rules, any of keep_last,
keep_hourly, keep_daily, keep_weekly, keep_monthly, keep_yearly, keep_within
("1y6m"), keep_days; without any, each name's policy stored in the
repository applies, and names without one keep every backup.
Returns: {"ok", "distrusted": [{"backup", "error"}...], "pruned": ["NAME@ID", ...], "collected": [...], "unreadable": [...]}.
An unreadable backup also emits an EventBridge "Verify Failed" event and counts in the VerifyFailures metric.
"""

from __future__ import annotations

from typing import Any

from braid import contract
from braid.adapters.aws.lambda_env import event_publisher, key_service, repository_store
from braid.format.repository import Repository
from braid.pipeline.maintenance import policy_from_event, run_maintenance
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    event = event or {}
    repository = Repository.open(repository_store(str(event.get("prefix", ""))))
    logger.append_keys(repository=repository.url)
    report = run_maintenance(
        repository,
        key_service(),
        event_publisher(),
        policy=policy_from_event(event),
    )
    distrusted = {d["backup"] for d in report.distrusted}
    announced = [u for u in report.unreadable if u["backup"] not in distrusted]  # the verify counted its own
    add_metrics(
        {
            "BackupsDistrusted": (MetricUnit.Count, len(report.distrusted)),
            contract.METRIC_VERIFY_FAILURES: (MetricUnit.Count, len(announced)),
            "BackupsPruned": (MetricUnit.Count, len(report.pruned)),
            "LeftoversCollected": (MetricUnit.Count, len(report.collected)),
        }
    )
    if report.unreadable:
        logger.error("unreadable backups kept", extra={"unreadable": [u["backup"] for u in report.unreadable]})
    return report.to_json()
