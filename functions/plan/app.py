"""Plan Lambda: turn newly completed staging segments into the next map round.

Event: the state ({execution input..., "plan": previous result or absent}).
Returns (state $.plan): {"status": "ready"|"waiting"|"sleeping"|"done", "round", "items_key",
"items_object" (full S3 key for the ItemReader), "items", "chunks", "planned_chunks", "idle_seconds", "wait_seconds", "wake_chunks", "wake_after_seconds",
"wake_object" (full S3 key of the wake record: braid.format.staging.wake), "cursor", "max_concurrency"
(the input's, clamped to the worker's reserved concurrency), "usage" (every call's
so far, with the states they ran: braid.pipeline.usage)}. The cursor is
what the next call continues from (braid.pipeline.plan_cursor); each call
watches staging for up to braid.pipeline.pacing.WATCH_SECONDS, or says
"sleeping" at once when the next round is far off (SleepUntilWoken then
waits for the agent's wake: braid.format.staging.wake).

As the Hold state (the event has a new "failed" and the caught "error"): a step
after Prepare failed; the backup is held for `braid backup --resume`
(braid.pipeline.plan.hold_step_failure) and the "held" status returned, which
the planner's next calls watch.
"""

from __future__ import annotations

from typing import Any

from braid.adapters.aws.lambda_env import S3StagingJanitor, repository_store, worker_concurrency
from braid.format.staging import wake_key
from braid.pipeline.execution_input import ExecutionInput
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, memory_mb, pipeline_handler
from braid.pipeline.pacing import MIN_ROUND_SECONDS, watch_seconds
from braid.pipeline.plan import carried_cursor, hold_step_failure, idle_since_progress, plan_next_round
from braid.pipeline.usage import carried_usage, plan_call_usage
from braid.ports.usage import metering


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    with metering("plan", memory_mb(context)) as meter:
        request = ExecutionInput.from_event(event)
        store = repository_store(request.prefix)
        janitor = S3StagingJanitor(store)
        # --fan-out never exceeds the worker's reserved concurrency: beyond it Lambda throttles.
        max_concurrency = min(request.max_concurrency, worker_concurrency())
        failure = new_failure(event)
        if failure is not None:
            step, hold_id = failure
            held = hold_step_failure(store, request.ref, step, event.get("error"), event.get("plan"))
        else:
            status = plan_next_round(
                store,
                request.ref,
                max_concurrency=max_concurrency,
                max_chunks_per_item=request.max_chunks_per_item,
                poll_seconds=request.poll_seconds,
                stall_seconds=request.stall_seconds,
                idle_seconds=idle_since_progress(event.get("plan")),
                cursor=carried_cursor(event.get("plan")),
                watch_seconds=watch_seconds(context.get_remaining_time_in_millis() / 1000 if context is not None else None),
                min_round_seconds=MIN_ROUND_SECONDS,
                may_sleep=True,  # SleepUntilWoken waits for the agent's wake (braid.format.staging.wake)
                # Finished segments go by version id: a versioned bucket keeps no raw bytes of them.
                purge=lambda key: janitor.purge_versions(key, exact=True),
                policies=request.policies,
            )
    carried = carried_usage(event.get("plan"), "$.plan")
    if failure is not None:
        logger.warning("backup held", extra=held.to_json())
        usage = plan_call_usage(carried, meter.usage(), held.status, 0)
        return {**held.to_json(), "items_object": "", "max_concurrency": max_concurrency, "hold_id": hold_id, "usage": usage.to_json()}
    usage = plan_call_usage(carried, meter.usage(), status.status, status.items)
    if status.status == "ready":
        add_metrics({"ChunksPlanned": (MetricUnit.Count, status.chunks), "MapItemsPlanned": (MetricUnit.Count, status.items)})
    logger.info("plan", extra=status.to_json())
    # The ItemReader reads the round file by its full S3 key (the repository may sit under a prefix).
    return {
        **status.to_json(),
        "items_object": store.object_key(status.items_key) if status.items_key else "",
        # Where SleepUntilWoken writes the task token for the agent, by its full S3 key.
        "wake_object": store.object_key(wake_key(request.ref)),
        "max_concurrency": max_concurrency,  # what the map runs at once ($.plan.max_concurrency)
        "usage": usage.to_json(),
        "hold_id": str((event.get("plan") or {}).get("hold_id", "")),  # carried: $.failed stays in the state
    }


def new_failure(event: dict[str, Any]) -> tuple[str, str] | None:
    """(step, id) when this call is the Hold state for a failure not yet held, else None.

    The Pass state before Hold writes `$.failed` = {"step", "id": States.UUID()};
    it stays in the state afterwards, so the calls after the hold carry that id
    in `$.plan.hold_id` and are not mistaken for a new failure."""
    failed = event.get("failed")
    if not isinstance(failed, dict) or not failed.get("id"):
        return None
    if failed["id"] == (event.get("plan") or {}).get("hold_id"):
        return None
    return str(failed.get("step", "a pipeline step")), str(failed["id"])
