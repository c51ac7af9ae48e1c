"""VerifyPipeline: the verify state machine, one Standard execution per verify run.

    Identify ─► PlanVerify ─► Deep? ─map─► CheckChunks ─► RecordVerify ─► VerifySucceeded
                                 └─────────(quick, or nothing to read)─┘
    any failure (Catch) ─► VerifyFailed (error and cause of the step that failed)

PlanVerify picks the backups and their chunks (all, a random sample, or the
next part of a rotation) and runs a quick verify itself: no map, a LIST and
a HEAD per chunk (braid.pipeline.verify_plan). A deep run fans out as the
backup pipeline does (braid_infra.pipeline): a Distributed Map reading its
items from S3 (ItemReader), MaxConcurrency from the plan, EXPRESS children
running VerifyWorker with the backup worker's retry policy, so every
attempt fits the child's 5 minutes. The map tolerates every failed item
and exports all results (ResultWriter) so RecordVerify counts a failed item
as failed chunks with the worker's own error instead of the run dying with
them unrecorded. RecordVerify writes one record per backup beside it, emits
"Verify Failed" and the VerifyFailures metric. The execution's output is
the run's reports (what `braid verify` prints); it fails only when the run
itself could not be done (the alarm on failed executions), not because a
backup failed verification (that is the VerifyFailed alarm).

The daily schedule (03:47 UTC, before the 04:17 maintenance prunes with
the records it leaves) starts it for each name's latest backup, as the CDK
context `braid:verify` says (`verify_schedule`): deep over a 10 % sample
by default.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from braid.format import layout
from braid_infra.functions import PipelineFunctions
from braid_infra.steps import STEP_RETRY, WORKER_RETRY, RetryPolicy, ScopedJsonItemReader, ScopedResultWriter, lambda_step, logged_machine, worker_step
from braid_infra.storage import VERIFY_RUN_OBJECTS, Storage, key_prefix

VERIFY_CONTEXT = "braid:verify"
MAP_LABEL = "verifychunks"  # the Distributed Map's label: AWS names its children's metrics by it
VERIFY_TIMEOUT = Duration.hours(12)
DEFAULT_SCHEDULE = {"deep": True, "sample_percent": 10.0}
RESULTS = f"{layout.VERIFY_RUNS}map-results"


def verify_schedule(value: Any) -> dict[str, Any]:
    """The daily verify's settings from the CDK context `braid:verify` (an object, or its JSON text).

    {"deep": true|false, "sample_percent": PCT} or {"deep": ..., "rotate": N}
    (N daily runs check every chunk of each name's latest backup once), or
    {"enabled": false} for no daily verify. Default: deep, a 10 % sample.
    A bad value fails synth.
    """
    if value is None or value == "":
        return dict(DEFAULT_SCHEDULE)
    doc = json.loads(value) if isinstance(value, str) else value
    if not isinstance(doc, Mapping) or set(doc) - {"deep", "sample_percent", "rotate", "enabled"}:
        raise ValueError(f'{VERIFY_CONTEXT}: e.g. {{"deep": true, "rotate": 7}} or {{"deep": true, "sample_percent": 10}}, not {value!r}')
    if doc.get("enabled", True) is False:
        return {"enabled": False}
    deep = doc.get("deep", True)
    sample, rotate = doc.get("sample_percent"), doc.get("rotate")
    if not isinstance(deep, bool):
        raise ValueError(f"{VERIFY_CONTEXT}: deep is true or false, not {deep!r}")
    if sample is not None and rotate is not None:
        raise ValueError(f"{VERIFY_CONTEXT}: sample_percent and rotate exclude each other")
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, (int, float)) or not 0 < sample <= 100):
        raise ValueError(f"{VERIFY_CONTEXT}: sample_percent is a number in (0, 100], not {sample!r}")
    if rotate is not None and (isinstance(rotate, bool) or not isinstance(rotate, int) or rotate < 1):
        raise ValueError(f"{VERIFY_CONTEXT}: rotate is a whole number of runs, at least 1, not {rotate!r}")
    settings: dict[str, Any] = {"deep": deep}
    if sample is not None:
        settings["sample_percent"] = float(sample)
    if rotate is not None:
        settings["rotate"] = rotate
    return settings


class VerifyPipeline(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        storage: Storage,
        functions: PipelineFunctions,
        repository_prefix: str = "",
        worker_retry: RetryPolicy = WORKER_RETRY,
        step_retry: RetryPolicy = STEP_RETRY,
        schedule: Any = None,
    ) -> None:
        super().__init__(scope, construct_id)

        plan = lambda_step(self, "PlanVerify", functions.pinned("verifyplan"), "$.plan", step_retry)
        record = lambda_step(self, "RecordVerify", functions.pinned("verifyrecord"), "$.report", step_retry)
        worker = worker_step(self, "VerifyWorker", functions.pinned("verifyworker"), worker_retry)
        check = sfn.DistributedMap(
            self,
            "CheckChunks",
            state_name="CheckChunks",
            item_reader=ScopedJsonItemReader(bucket=storage.bucket, key=sfn.JsonPath.string_at("$.plan.items_object"), objects=[storage.arn(VERIFY_RUN_OBJECTS)]),
            max_concurrency_path="$.plan.max_concurrency",
            item_selector={"prefix.$": "$.prefix", "item.$": "$$.Map.Item.Value"},
            result_writer_v2=ScopedResultWriter(
                bucket=storage.bucket, prefix=f"{key_prefix(repository_prefix)}{RESULTS}", objects=[storage.arn(VERIFY_RUN_OBJECTS)]
            ),
            result_path="$.results",
            label=MAP_LABEL,
            map_execution_type=sfn.StateMachineType.EXPRESS,
            # Every failed item is a result RecordVerify folds in (failed chunks, the worker's error):
            # a failure threshold would fail the run and lose what every other item found.
            tolerated_failure_percentage=100,
        )
        check.item_processor(worker)

        failed = sfn.Fail(
            self, "VerifyFailed", state_name="VerifyFailed", error_path="$.error.Error", cause_path="$.error.Cause"
        )
        for state in (plan, check, record):
            state.add_catch(failed, errors=["States.ALL"], result_path="$.error")
        succeeded = sfn.Succeed(self, "VerifySucceeded", state_name="VerifySucceeded", output_path="$.report")
        choice = sfn.Choice(self, "Deep", state_name="Deep?")
        choice.when(sfn.Condition.boolean_equals("$.plan.map", True), check.next(record))
        choice.otherwise(record)
        record.next(succeeded)

        identify = sfn.Pass(self, "Identify", state_name="Identify", parameters={"name.$": "$$.Execution.Name"}, result_path="$.execution")
        definition = identify.next(plan).next(choice)
        self.state_machine = logged_machine(
            self, "Verify", definition,
            comment="Braid verify: chunks of published backups checked in the cloud, recorded beside them", timeout=VERIFY_TIMEOUT,
        )
        # The ItemReader reads the run's items and the ResultWriter exports the map's results beside them, under
        # verify-runs/ only (ScopedJsonItemReader, ScopedResultWriter: not CDK's grants on every object of the bucket).

        self.settings = verify_schedule(schedule if schedule is not None else self.node.try_get_context(VERIFY_CONTEXT))
        self.rule: events.Rule | None = None
        if self.settings.get("enabled", True):
            self.rule = events.Rule(
                self,
                "DailyVerify",
                description="Braid: verify each name's latest backup in the cloud (braid:verify)",
                schedule=events.Schedule.cron(minute="47", hour="3"),
            )
            self.rule.add_target(
                targets.SfnStateMachine(
                    self.state_machine,
                    input=events.RuleTargetInput.from_object({"backups": "latest", "prefix": repository_prefix.strip("/"), **self.settings}),
                    retry_attempts=2,
                )
            )
