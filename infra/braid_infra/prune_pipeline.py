"""PrunePipeline: the scheduled prune as its own fan-out, one Standard execution per run.

    Identify ─► PlanPrune ─► AnythingToSweep? ─yes─► Sweep (Distributed Map, EXPRESS children) ─┐
                                   │ no                                                          │
                                   └──────────────────────────────────────────────► TallyPrune ◄─┘
                                                                                        │
                                                                                   PruneDone
    PlanPrune or TallyPrune failing (after retries) ─► PruneFailed

PlanPrune judges retention from the catalog and removes the manifests of
the backups the policy lets go before any chunk is touched; Sweep's items
each delete a slice of one removed backup's chunks (by key range, so a
10 TiB backup is a handful of items, none near an EXPRESS child's limits)
or collect one leftover after judging it again (braid.pipeline.sweep).
The map tolerates failed items: the data they leave has no manifest and is
collected by the next run; TallyPrune counts them from the items' result
records, reports them and emits "Prune Failed" (braid.pipeline.prune_tally).
The scheduled maintenance starts it (braid.pipeline.maintenance); so can
anyone with states:StartExecution, with the same input
(functions/prune/app.py).
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from braid import contract
from braid_infra.functions import PipelineFunctions
from braid_infra.steps import STEP_RETRY, RetryPolicy, ScopedJsonItemReader, item_failed, lambda_step, logged_machine, retried
from braid_infra.storage import PRUNE_OBJECTS, Storage

MAP_LABEL = "sweep"  # the map's label: AWS files its children's metrics under it (braid_infra.monitoring)
SWEEP_TRANSIENT = list(contract.WORKER_TRANSIENT_ERRORS)
# Sweep items: every attempt (SWEEP_TIMEOUT_SECONDS) and the backoffs between them fit an
# EXPRESS child's 5 minutes (tests/infra checks the sum), as the backup worker's do.
SWEEP_RETRY = RetryPolicy(max_attempts=contract.SWEEP_RETRIES)
# A run deletes at most a few thousand items' worth of prefixes; a day is far beyond any.
RUN_TIMEOUT = Duration.hours(23)


class PrunePipeline(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        storage: Storage,
        functions: PipelineFunctions,
        sweep_retry: RetryPolicy = SWEEP_RETRY,
        step_retry: RetryPolicy = STEP_RETRY,
    ) -> None:
        super().__init__(scope, construct_id)
        plan = lambda_step(self, "PlanPrune", functions.pinned("prune"), "$.plan", step_retry)
        tally = lambda_step(self, "TallyPrune", functions.pinned("tally"), "$.report", step_retry)

        sweep = retried(
            tasks.LambdaInvoke(
                self, "SweepItem", state_name="SweepItem", lambda_function=functions.pinned("sweep"), payload_response_only=True, retry_on_service_exceptions=False
            ),
            SWEEP_TRANSIENT,
            sweep_retry,
        )
        sweep_map = sfn.DistributedMap(
            self,
            "Sweep",
            state_name="Sweep",
            item_reader=ScopedJsonItemReader(bucket=storage.bucket, key=sfn.JsonPath.string_at("$.plan.items_object"), objects=[storage.arn(PRUNE_OBJECTS)]),
            max_concurrency_path="$.plan.max_concurrency",
            item_selector={
                "run.$": "$.plan.run",
                "prefix.$": "$.plan.prefix",
                "now.$": "$.plan.now",
                "grace_hours.$": "$.plan.grace_hours",
                "item.$": "$$.Map.Item.Value",
            },
            result_path=sfn.JsonPath.DISCARD,
            label=MAP_LABEL,
            map_execution_type=sfn.StateMachineType.EXPRESS,
            # Every item may fail without failing the map: TallyPrune counts them from the
            # result records, and their data (no manifest) waits for the next run.
            tolerated_failure_percentage=100,
        )
        # A failed item ends its child in SweepItemFailed ({}), so the map's output stays small whatever fails
        # (a failed child's result would carry its input and cause; the map's output is capped at 262,144 bytes).
        sweep.add_catch(item_failed(self, "SweepItemFailed"), errors=["States.ALL"], result_path=sfn.JsonPath.DISCARD)
        sweep_map.item_processor(sweep)

        done = sfn.Succeed(self, "PruneDone", state_name="PruneDone")
        failed = sfn.Fail(
            self,
            "PruneFailed",
            state_name="PruneFailed",
            error="PruneFailed",
            cause=(
                "The prune run failed; backups whose manifest it already removed keep their data until the next run"
                " collects it as leftovers. The error of the failed step is in the execution's history."
            ),
        )
        for state in (plan, sweep_map, tally):
            state.add_catch(failed, errors=["States.ALL"], result_path="$.error")

        anything = sfn.Choice(self, "AnythingToSweep", state_name="AnythingToSweep?")
        anything.when(sfn.Condition.number_greater_than("$.plan.items", 0), sweep_map.next(tally))
        anything.otherwise(tally)
        tally.next(done)

        identify = sfn.Pass(self, "Identify", state_name="Identify", parameters={"name.$": "$$.Execution.Name"}, result_path="$.execution")
        definition = identify.next(plan).next(anything)
        self.state_machine = logged_machine(
            self, "Prune", definition, comment="Braid prune: retention from the catalog, manifests first, then chunks fanned out", timeout=RUN_TIMEOUT
        )
        self.map_children = f"{self.state_machine.state_machine_arn}/{MAP_LABEL}"
