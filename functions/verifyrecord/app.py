"""RecordVerify Lambda: one verify record per backup, the "Verify Failed" events, the VerifyFailures metric.

Event: the state ($.plan from PlanVerify, $.results from the map's
ResultWriter when a map ran). Returns the run's reports
(braid.pipeline.verify_record.RunReport JSON), which `braid verify` prints.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from braid import contract
from braid.adapters.aws.lambda_env import event_publisher, repository_store
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler
from braid.pipeline.verify_record import record_run
from braid.pipeline.verify_request import VerifyRequest


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = VerifyRequest.from_event(event)
    store = repository_store(request.prefix)
    report = record_run(store, str(event["plan"]["run"]), event.get("results"), event_publisher(), datetime.now(UTC))
    add_metrics(
        {
            "BackupsVerified": (MetricUnit.Count, len(report.records)),
            contract.METRIC_VERIFY_FAILURES: (MetricUnit.Count, len(report.failed)),
        }
    )
    if report.failed:
        logger.error("verify failed", extra={"failed": [r.backup for r in report.failed]})
    return report.to_json()
