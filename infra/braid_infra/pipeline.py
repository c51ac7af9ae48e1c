"""Pipeline: the backup state machine, one Standard execution per backup.

    Identify ─► Prepare ─► PlanSegments ─► SegmentsReady? ─ready─────────► ProcessChunks ─────┐
                              ▲   ▲           │ waiting (sleeping: SleepUntilWoken, the agent's wake)  │
                              │   └─ WaitForSegments                                         │
                              └──────────────────────────────────────────────────────────────┘
                                              │ done
                                              ▼
                                           Finalize ─► BackupSucceeded
    Prepare fails, or a FINAL error (Catch) ─► Cleanup ─► BackupFailed (error and cause from Cleanup)
    PlanSegments/ProcessChunks/Finalize fail otherwise ─► <Step>Failed ─► Hold ─► SegmentsReady? (held: the wait loop)

Identify adds the execution's own name to the state ($.execution.name, from
$$.Execution.Name, overwriting whatever the input put there); every step
refuses a backup other than the one the execution is named after, and
Cleanup then deletes nothing (braid.pipeline.execution_input.check_execution).

The wait loop lets the fan-out of finished segments start while later
segments still upload. When the next round is far off, PlanSegments says
"sleeping" and SleepUntilWoken waits for the agent to send back the task
token it writes to the backup's staging (braid.format.staging.wake), or for
its timeout, rather than a Plan function billed while it watches. ProcessChunks is a Distributed Map reading a plan
round from S3 (ItemReader), MaxConcurrency from the execution input, with
EXPRESS child workflows (billed per child, not per state transition; see
braid.pipeline.item_sizing) running the Worker with retries on Lambda
throttling and transient errors. The map tolerates failed items: the next
PlanSegments plans items without a result again, and after two re-plans
holds the backup (PlanSegments returns "held": the wait loop) until
`braid backup --resume` or the hold's end (braid.pipeline.replan), so one
bad minute never throws finished work away. Finalize re-checks every chunk.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from braid import contract
from braid.contract import HOLD_ENTRY, HOLD_STATE, STATE_PLAN, PlanKey, PlanState, plan_path
from braid.pipeline.item_sizing import MAX_ITEMS_PER_ROUND
from braid_infra.functions import PipelineFunctions
from braid_infra.steps import (
    LAMBDA_TRANSIENT,
    STEP_RETRY,
    TRANSIENT,
    WORKER_RETRY,
    RetryPolicy,
    ScopedJsonItemReader,
    item_failed,
    lambda_step,
    logged_machine,
    worker_step,
)
from braid_infra.storage import EXECUTION_TIMEOUT, PLAN_OBJECTS, STAGING_LIFETIME, WAKE_OBJECTS, Storage

__all__ = ["FINAL_ERRORS", "LAMBDA_TRANSIENT", "STEP_RETRY", "TRANSIENT", "WORKER_RETRY", "BackupPipeline", "RetryPolicy"]

# Errors after which the backup can never finish: Cleanup, not a hold.
FINAL_ERRORS = list(contract.FINAL_PIPELINE_ERRORS)
# What each map gives a Worker (braid.pipeline.worker.WorkerEvent): the backup, its repository and level, one item.
WORKER_EVENT = {
    "backup.$": "$.backup",
    "prefix.$": "$.prefix",
    "repository.$": "$.prepared.repository",
    "level.$": "$.prepared.level",
    "item.$": "$$.Map.Item.Value",
}


class BackupPipeline(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        storage: Storage,
        functions: PipelineFunctions,
        worker_retry: RetryPolicy = WORKER_RETRY,
        step_retry: RetryPolicy = STEP_RETRY,
    ) -> None:
        super().__init__(scope, construct_id)

        def step(name: str, function: str, result_path: str) -> tasks.LambdaInvoke:
            return lambda_step(self, name, functions.pinned(function), result_path, step_retry)

        prepare = step("Prepare", "prepare", "$.prepared")
        plan = step("PlanSegments", "plan", f"$.{STATE_PLAN}")
        finalize = step("Finalize", "finalize", "$.summary")
        cleanup = step("Cleanup", "cleanup", "$.failure")

        worker = worker_step(self, "Worker", functions.pinned("worker"), worker_retry)

        process = sfn.DistributedMap(
            self,
            "ProcessChunks",
            state_name="ProcessChunks",
            # Round files (and re-plans) under staging/NAME/ID/plans/: the only objects the machine reads.
            item_reader=ScopedJsonItemReader(
                bucket=storage.bucket, key=sfn.JsonPath.string_at(plan_path(PlanKey.ITEMS_OBJECT)), objects=[storage.arn(PLAN_OBJECTS)]
            ),
            # The input's --fan-out clamped by PlanSegments to the worker's reserved concurrency.
            max_concurrency_path=plan_path(PlanKey.MAX_CONCURRENCY),
            item_selector=WORKER_EVENT,
            result_path=sfn.JsonPath.DISCARD,
            label="chunks",
            map_execution_type=sfn.StateMachineType.EXPRESS,
            # A failed item must not fail the map (and the backup): the next PlanSegments
            # finds items without a result and plans them again, then holds the backup
            # for --resume (braid.pipeline.replan). Finalize re-checks every chunk. A count
            # of a round's largest item number tolerates them all (the same as 100 %).
            tolerated_failure_count=MAX_ITEMS_PER_ROUND,
        )
        # A child whose Worker failed after every retry ends in ItemFailed, a success whose output is {}: a failed
        # child's place in the map's output would hold its whole execution result (its input and the error's
        # cause, a few KB), and the map's output is capped at 262,144 bytes like any state's (States.DataLimitExceeded,
        # which would hold the backup at once instead of re-planning). The worker has recorded its error in staging,
        # and the next PlanSegments plans every item without a result again (review 3, M1).
        worker.add_catch(item_failed(self, "ItemFailed"), errors=["States.ALL"], result_path=sfn.JsonPath.DISCARD)
        process.item_processor(worker)

        wait = sfn.Wait(self, "WaitForSegments", state_name="WaitForSegments", time=sfn.WaitTime.seconds_path(plan_path(PlanKey.WAIT_SECONDS)))
        # PlanSegments says "sleeping" when the next round is far off (braid.pipeline.pacing.sleep_plan): rather than
        # a Plan function billed while it watches, this state writes its task token to the backup's staging (the wake
        # record, braid.format.staging.wake: "CHUNKS AFTER TOKEN") and waits for the agent to send it back
        # (SendTaskSuccess) once the round's chunks are recorded or the stream has ended; its timeout (the planner's
        # wait_seconds) wakes it in any case. Whatever the agent sends is discarded: a wake can only make the
        # planner look sooner. A failure to write the record waits in WaitForSegments instead.
        sleep = tasks.CallAwsService(
            self,
            "SleepUntilWoken",
            state_name="SleepUntilWoken",
            service="s3",
            action="putObject",
            iam_action="s3:PutObject",
            iam_resources=[storage.arn(WAKE_OBJECTS)],
            parameters={
                "Bucket": storage.bucket.bucket_name,
                "Key": sfn.JsonPath.string_at(plan_path(PlanKey.WAKE_OBJECT)),
                "Body": sfn.JsonPath.format(
                    "{} {} {}", sfn.JsonPath.string_at(plan_path(PlanKey.WAKE_CHUNKS)), sfn.JsonPath.string_at(plan_path(PlanKey.WAKE_AFTER_SECONDS)),
                    sfn.JsonPath.task_token,
                ),
            },
            integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
            task_timeout=sfn.Timeout.at(plan_path(PlanKey.WAIT_SECONDS)),
            result_path=sfn.JsonPath.DISCARD,
        )
        sleep.add_retry(errors=["States.TaskFailed"], interval=Duration.seconds(1), max_attempts=2, backoff_rate=2.0)
        sleep.add_catch(plan, errors=["States.Timeout"], result_path=sfn.JsonPath.DISCARD)
        sleep.add_catch(wait, errors=["States.ALL"], result_path=sfn.JsonPath.DISCARD)
        succeeded = sfn.Succeed(self, "BackupSucceeded", state_name="BackupSucceeded")
        failed = sfn.Fail(self, "BackupFailed", state_name="BackupFailed", error_path="$.failure.error", cause_path="$.failure.cause")
        cleanup_failed = sfn.Fail(
            self,
            "CleanupFailed",
            state_name="CleanupFailed",
            error="CleanupFailed",
            cause=(
                "The backup failed and so did its cleanup; nothing was published."
                f" Staging expires by the bucket lifecycle within {STAGING_LIFETIME.to_days()} days."
            ),
        )

        # A failure of Prepare leaves nothing worth keeping: Cleanup. After it, a failing step holds
        # the backup instead (the Hold state, run by the Plan function: held.json names the step and
        # its error, everything done is kept, the planner then waits for --resume; see
        # braid.pipeline.replan), unless its error says the backup can never finish (FINAL_ERRORS).
        prepare.add_catch(cleanup, errors=["States.ALL"], result_path="$.error")
        # The Hold state is the Plan function called with the Hold entry (braid.pipeline.failure.hold_entry): the failed
        # step its <Step>Failed state named, the caught error, and the state, whose $.plan the held status replaces.
        hold = lambda_step(
            self, "Hold", functions.pinned("plan"), f"$.{STATE_PLAN}", step_retry,
            payload=sfn.TaskInput.from_object({
                HOLD_ENTRY: {"step": sfn.JsonPath.string_at("$.failed.step"), "error": sfn.JsonPath.object_at("$.error")},
                HOLD_STATE: sfn.JsonPath.entire_payload,
            }),
        )
        hold_failed = sfn.Fail(
            self,
            "HoldFailed",
            state_name="HoldFailed",
            error="HoldFailed",
            cause=(
                "A pipeline step failed and so did holding the backup for --resume; nothing was published and nothing was"
                f" deleted. Staging expires by the bucket lifecycle within {STAGING_LIFETIME.to_days()} days."
            ),
        )
        steps: list[tuple[str, tasks.LambdaInvoke | sfn.DistributedMap]] = [("PlanSegments", plan), ("ProcessChunks", process), ("Finalize", finalize)]
        for state_name, state in steps:
            # Which step failed, for the Hold entry (and for a person reading the console).
            failed_step = sfn.Pass(
                self, f"{state_name}Failed", state_name=f"{state_name}Failed", parameters={"step": state_name}, result_path="$.failed",
            )
            state.add_catch(cleanup, errors=FINAL_ERRORS, result_path="$.error")
            state.add_catch(failed_step, errors=["States.ALL"], result_path="$.error")
            failed_step.next(hold)
        hold.add_catch(cleanup, errors=FINAL_ERRORS, result_path="$.error")
        hold.add_catch(hold_failed, errors=["States.ALL"], result_path="$.hold_error")
        cleanup.add_catch(cleanup_failed, errors=["States.ALL"], result_path="$.cleanup_error")
        cleanup.next(failed)

        choice = sfn.Choice(self, "SegmentsReady", state_name="SegmentsReady?")
        hold.next(choice)  # "held": the wait loop, where the planner watches for --resume
        choice.when(sfn.Condition.string_equals(plan_path(PlanKey.STATUS), PlanState.READY), process.next(plan))
        choice.when(sfn.Condition.string_equals(plan_path(PlanKey.STATUS), PlanState.DONE), finalize.next(succeeded))
        choice.when(sfn.Condition.string_equals(plan_path(PlanKey.STATUS), PlanState.SLEEPING), sleep.next(plan))
        choice.otherwise(wait.next(plan))

        identify = sfn.Pass(
            self, "Identify", state_name="Identify", parameters={"name.$": "$$.Execution.Name"}, result_path="$.execution"
        )
        definition = identify.next(prepare).next(plan).next(choice)
        self.state_machine = logged_machine(
            self, "Backup", definition, comment="Braid backup: staged stream -> chunks -> verified manifest", timeout=EXECUTION_TIMEOUT
        )
