"""PlanPrune Lambda: judge from the catalog, remove the manifests the policy lets go, write the map's items.

Event (the prune execution's input, with $.execution.name added by the
state machine): {"prefix": "", "orphan_grace_hours": 48, "distrusted":
{"NAME@ID": reason}, "slice_chunks": N} and any of the keep rules
(braid.pipeline.prune_plan.policy_from_event); no rule: the policies stored
in the repository. Returns: {"run", "items_object", "items",
"max_concurrency", "now", "grace_hours", "pruned", "unreadable", "moves", "prefix", "wal"} ("wal": per archive,
the WAL files removed, braid.pipeline.prune_plan.wal_summary).
The stack's storage class policy (`braid:storageClass`) comes from BRAID_STORAGE_CLASS.
"""

from __future__ import annotations

from typing import Any

from braid import contract
from braid.adapters.aws.lambda_env import event_publisher, key_service, repository_store, storage_default
from braid.format.repository import Repository
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler
from braid.pipeline.prune_plan import distrusted_from_event, plan_run, policy_from_event, slice_chunks_from_event


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    run = str(event["execution"]["name"])
    prefix = str(event.get("prefix", ""))
    repository = Repository.open(repository_store(prefix))
    logger.append_keys(repository=repository.url, run=run)
    state = plan_run(
        repository,
        key_service(),
        event_publisher(),
        run=run,
        prefix=prefix,
        policy=policy_from_event(event),
        distrusted=distrusted_from_event(event),
        slice_chunks=slice_chunks_from_event(event),
        storage_default=storage_default(),
    )
    add_metrics({contract.METRIC_BACKUPS_PRUNED: (MetricUnit.Count, state["pruned"])})
    logger.info("prune planned", extra={k: state[k] for k in ("items", "pruned", "unreadable", "moves")})
    for archive in state["wal"]:  # what WAL went, per archive (the plan record, then the run's report, lists every file)
        if archive["error"]:
            logger.error("WAL prune failed", extra={"wal": archive})  # nested: a LogRecord's own `name` must not be overwritten
        else:
            logger.info("WAL pruned" if archive["files"] else "no WAL pruned", extra={"wal": archive})
    return state
