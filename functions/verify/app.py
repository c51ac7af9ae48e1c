"""Scheduled maintenance Lambda: deep-verify the latest backups, then apply retention.

Event (from the EventBridge schedule): {"prefix": "", "sample_percent": 10,
"keep_last": 7, "keep_days": 35, "orphan_grace_hours": 48}; a retention rule
(keep_last and/or keep_days) is required, the rest optional.
Returns: {"ok", "verified": [VerifyReport JSON...], "pruned": ["NAME@ID", ...], "collected": [...]}.
A failed verify also emits an EventBridge "Verify Failed" event and an error metric.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from braid.adapters.aws.lambda_env import event_publisher, key_service, repository_store
from braid.format.repository import Repository
from braid.pipeline.maintenance import policy_from_event, run_maintenance

logger = Logger()
tracer = Tracer()
metrics = Metrics()


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    event = event or {}
    sample = event.get("sample_percent")
    repository = Repository.open(repository_store(str(event.get("prefix", ""))))
    logger.append_keys(repository=repository.url)
    report = run_maintenance(
        repository,
        key_service(),
        event_publisher(),
        sample_percent=float(sample) if sample is not None else None,
        policy=policy_from_event(event),
    )
    failed = [r for r in report.verified if not r.get("ok")]
    metrics.add_metric(name="BackupsVerified", unit=MetricUnit.Count, value=len(report.verified))
    metrics.add_metric(name="VerifyFailures", unit=MetricUnit.Count, value=len(failed))
    metrics.add_metric(name="BackupsPruned", unit=MetricUnit.Count, value=len(report.pruned))
    metrics.add_metric(name="LeftoversCollected", unit=MetricUnit.Count, value=len(report.collected))
    if failed:
        logger.error("verify failed", extra={"failed": [r["backup"] for r in failed]})
    return report.to_json()
