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

As the Hold state (the event is the Hold entry, braid.pipeline.failure.hold_entry:
{"hold": {"step", "error"}, "state": the state}): a step after Prepare failed; the
backup is held for `braid backup --resume` (braid.pipeline.plan.hold_step_failure)
and the "held" status returned, which the planner's next calls watch.
"""

from __future__ import annotations

from typing import Any

from braid.adapters.aws.lambda_env import S3StagingJanitor, repository_store, worker_concurrency
from braid.contract import STATE_PLAN, PlanKey, PlanState
from braid.format.staging import wake_key
from braid.pipeline.execution_input import ExecutionInput
from braid.pipeline.failure import hold_entry
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, memory_mb, pipeline_handler
from braid.pipeline.pacing import MIN_ROUND_SECONDS, watch_seconds
from braid.pipeline.plan import carried_cursor, hold_step_failure, idle_since_progress, plan_next_round
from braid.pipeline.usage import carried_usage, plan_call_usage
from braid.ports.usage import metering


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    hold = hold_entry(event)
    state = dict(hold.state) if hold is not None else event
    previous = state.get(STATE_PLAN)
    with metering("plan", memory_mb(context)) as meter:
        request = ExecutionInput.from_event(state)
        store = repository_store(request.prefix)
        janitor = S3StagingJanitor(store)
        # --fan-out never exceeds the worker's reserved concurrency: beyond it Lambda throttles.
        max_concurrency = min(request.max_concurrency, worker_concurrency())
        if hold is not None:
            status = hold_step_failure(store, request.ref, hold.step, hold.error, previous)
        else:
            status = plan_next_round(
                store,
                request.ref,
                max_concurrency=max_concurrency,
                max_chunks_per_item=request.max_chunks_per_item,
                poll_seconds=request.poll_seconds,
                stall_seconds=request.stall_seconds,
                idle_seconds=idle_since_progress(previous),
                cursor=carried_cursor(previous),
                watch_seconds=watch_seconds(context.get_remaining_time_in_millis() / 1000 if context is not None else None),
                min_round_seconds=MIN_ROUND_SECONDS,
                may_sleep=True,  # SleepUntilWoken waits for the agent's wake (braid.format.staging.wake)
                # Finished segments go by version id: a versioned bucket keeps no raw bytes of them.
                purge=lambda key: janitor.purge_versions(key, exact=True),
                policies=request.policies,
            )
    carried = carried_usage(previous, f"$.{STATE_PLAN}")
    usage = plan_call_usage(carried, meter.usage(), status.status, status.items)
    if hold is not None:
        logger.warning("backup held", extra=status.to_json())
    elif status.status == PlanState.READY:
        add_metrics({"ChunksPlanned": (MetricUnit.Count, status.chunks), "MapItemsPlanned": (MetricUnit.Count, status.items)})
    if hold is None:
        logger.info("plan", extra=status.to_json())
    return {
        **status.to_json(),
        # The ItemReader reads the round file by its full S3 key (the repository may sit under a prefix).
        PlanKey.ITEMS_OBJECT: store.object_key(status.items_key) if status.items_key else "",
        # Where SleepUntilWoken writes the task token for the agent, by its full S3 key.
        PlanKey.WAKE_OBJECT: store.object_key(wake_key(request.ref)),
        PlanKey.MAX_CONCURRENCY: max_concurrency,  # what the map runs at once
        PlanKey.USAGE: usage.to_json(),
    }
