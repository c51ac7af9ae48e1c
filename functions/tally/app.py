"""TallyPrune Lambda: fold the prune run's item outcomes into its report (braid.pipeline.prune_tally).

Event: the execution's state ({"plan": {"run", "prefix", ...}}). Returns the
report's counts and its first entries (the whole report is written to
`prune/RUN/report.json`); a run with failed items emits "Prune Failed".
"""

from __future__ import annotations

from typing import Any

from braid import contract
from braid.adapters.aws.lambda_env import event_publisher, repository_store
from braid.format.repository import Repository
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler
from braid.pipeline.prune_tally import tally_run

SHOWN = 20  # entries of each list in the returned state; the report object has them all


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    run = str(event["plan"]["run"])
    repository = Repository.open(repository_store(str(event["plan"].get("prefix", ""))))
    logger.append_keys(repository=repository.url, run=run)
    report = tally_run(repository, event_publisher(), run=run)
    add_metrics(
        {
            contract.METRIC_LEFTOVERS_COLLECTED: (MetricUnit.Count, len(report.collected)),
            contract.METRIC_PRUNE_FAILURES: (MetricUnit.Count, report.failed_items + len(report.refused) + len(report.wal_failed())),
        }
    )
    if not report.ok:
        logger.error("prune incomplete", extra={"failures": report.failures()[:SHOWN]})
    full = report.to_json()
    return {k: _shown(v) for k, v in full.items()}


def _shown(value: Any) -> Any:
    """The first SHOWN entries of a list, also inside a section (the plan's `storage`, each archive's `wal` files):
    the state stays small."""
    if isinstance(value, list):
        return [_shown(v) for v in value[:SHOWN]]
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}
    return value
