"""Step Functions as AWS runs it, where moto's interpreter (moto 5.2.5) differs and Braid depends on it.

moto executes Distributed Map states but (1) counts a failed child and
carries on: the map run ends SUCCEEDED with `itemCounts.failed` > 0 and the
failed items as nulls in the output; (2) knows only STANDARD child workflows
(support.moto_stack.compat_definition turns EXPRESS into STANDARD), so no
child is ever held to Express's 5 minutes; (3) waits out Retry intervals and
Wait states in real time, so a test of a 6-attempt retry policy or a
5-minute limit waits minutes. `AwsStepFunctions` patches the interpreter in
this process (the emulated cloud's, or a test's in-process moto) so that:

Tolerated failure threshold (AWS: "Tolerated failure threshold for
Distributed Map states", docs.aws.amazon.com/step-functions/latest/dg/
maprun-fail-threshold.html):
  - a Map Run fails when its failed items exceed ToleratedFailureCount or
    ToleratedFailurePercentage (either, when both are given); the
    percentage is failed or timed-out items over all items; with neither
    field the threshold is 0, so one failed item fails the Map Run;
  - the Map state then fails with `States.ExceedToleratedFailureThreshold`
    (the error name the docs and the ASL grammar spell; the cause is the
    text AWS returns, as recorded by LocalStack's snapshot tests: "The
    specified tolerated failure threshold was exceeded"), which the state's
    Retry and Catch see like any other error; the Map Run is FAILED;
  - once the threshold is exceeded no further child starts (AWS may finish
    children already running, then aborts the rest: "Step Functions can
    continue to run child workflows in a Map Run even after the tolerated
    failure threshold is exceeded, but before the Map Run fails");
  - within the threshold the map succeeds, and each failed item's place in
    the map's output holds the child's execution result unchanged (the
    ResultWriter page: "If a child workflow execution fails, Step Functions
    returns its execution result unchanged", i.e. as Transformation NONE:
    ExecutionArn, Input, Name, Status FAILED or TIMED_OUT, Error, Cause,
    StartDate, StopDate, ...), where a successful child contributes its output;
  - with a ResultWriter, the results are exported as AWS exports them
    ("exports executions with the same status to their respective files"):
    PREFIX/<map run id>/SUCCEEDED_0.json and FAILED_0.json (failed and
    timed-out children), each a JSON array of the children's execution
    results (Transformation NONE: Input and Output as JSON strings), and
    manifest.json listing them ({"DestinationBucket", "MapRunArn",
    "ResultFiles": {"FAILED": [{"Key", "Size"}], "PENDING": [],
    "SUCCEEDED": [...]}}); the state's output is {"MapRunArn",
    "ResultWriterDetails": {"Bucket", "Key"}}. (moto writes only an empty
    manifest.) Not modelled: splitting files past 5 GB, JSONL output.

The state size quota (AWS: Step Functions quotas, "Maximum input or output
size for a task, state, or execution: 262,144 bytes of data as a UTF-8
encoded string. This quota affects ... state or execution output",
limits-overview):
  - moto checks each state's output after OutputPath and a Task's result,
    not a Map state's result before its ResultPath: here a Map whose
    results (the array of every item's output, a failed child's execution
    result in its place) exceed `STATE_LIMIT_BYTES` fails with
    `States.DataLimitExceeded`, which its Retry and Catch see, whatever its
    ResultPath says (the ResultWriter page: export the results when they
    may exceed the quota). With a ResultWriter the result is the small
    pointer to the export, so it never fails this way.

Express children (AWS: Step Functions quotas, "Maximum execution time ...
Express: 5 minutes. If an execution runs for more than the 5-minute maximum,
it will fail with a States.Timeout error", limits-overview):
  - a child of a map whose ProcessorConfig said EXPRESS (marked by
    compat_definition in its item processor's Comment) that runs longer than
    `EXPRESS_LIMIT_SECONDS` ends TIMED_OUT with error `States.Timeout`; it
    counts as a timed-out item towards the threshold. As on AWS, a Lambda
    invocation already running is not stopped by its execution timing out:
    its requests still land (Braid's worker is written for late writes).

Time scale: `time_scale` S > 1 runs the service's clock S times faster than
real time, everywhere it waits: Retry intervals (IntervalSeconds,
BackoffRate, MaxDelaySeconds, jitter, as the definition says), Wait states,
the Express 5-minute limit and, through support.inprocess_lambda, each
function's timeout and its context's remaining time. Ratios between them
stay as on AWS, so "six retries do not fit in one Express child" holds at
any scale. What is not scaled: the product's own clocks (an agent's poll, a
stall limit measured by the pipeline from S3 timestamps), a Task's
TimeoutSeconds or TimeoutSecondsPath (SleepUntilWoken's: moto waits it out
in real time, so a test that lets a sleep time out waits the planner's
wait_seconds unscaled) and moto's event timestamps.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

EXCEED_THRESHOLD = "States.ExceedToleratedFailureThreshold"
EXCEED_THRESHOLD_CAUSE = "The specified tolerated failure threshold was exceeded"
TIMEOUT_ERROR = "States.Timeout"
DATA_LIMIT_ERROR = "States.DataLimitExceeded"
STATE_LIMIT_BYTES = 262_144
EXPRESS_LIMIT_SECONDS = 300.0

# In the Comment of an item processor whose children the definition wanted
# EXPRESS (support.moto_stack.compat_definition rewrites them to STANDARD,
# the only kind moto's parser knows, and leaves this mark).
EXPRESS_MARK = "[emulated: ExecutionType EXPRESS]"


@dataclass
class MapSettings:
    """What the definition said about one Distributed Map state (moto keeps only the values)."""

    name: str
    count_declared: bool
    percentage_declared: bool
    express: bool
    writer: bool = False


@dataclass
class Tolerance:
    """The failure threshold of one Map Run, and the failures counted so far."""

    total: int
    count: int | None
    percentage: float | None
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_failure(self) -> None:
        with self.lock:
            self.failed += 1

    def exceeded(self) -> bool:
        with self.lock:
            failed = self.failed
        if failed == 0:
            return False
        if self.count is None and self.percentage is None:
            return True  # neither field: a threshold of 0
        if self.count is not None and failed > self.count:
            return True
        return self.percentage is not None and self.total > 0 and failed * 100.0 / self.total > self.percentage


class _ScaledTime:
    """Stands in for the `time` module where the interpreter sleeps."""

    def __init__(self, scale: Callable[[], float]) -> None:
        self._scale = scale

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds) / self._scale())

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _export_results(env: Any, resource_runtime_part: Any, state_credentials: Any) -> None:
    """ResultWriter's s3:putObject as AWS does it: one file per status, and a manifest naming them."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.result_writer.resource_eval.resource_eval_s3 import ResourceEvalS3

    parameters = env.stack.pop()
    env.stack.pop()  # the children's outputs: exported below instead
    s3 = ResourceEvalS3._get_s3_client(resource_runtime_part=resource_runtime_part, state_credentials=state_credentials)
    record = env.map_run_record_pool_manager.get_all()[-1]
    run_id = record.map_run_arn.split(":")[-1]
    prefix = parameters.get("Prefix", "")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    results: dict[int, dict[str, Any]] = getattr(record, "_braid_results", {})
    files: dict[str, list[dict[str, Any]]] = {"FAILED": [], "PENDING": [], "SUCCEEDED": []}
    for status in ("SUCCEEDED", "FAILED"):
        rows = [row for _, row in sorted(results.items()) if (row["Status"] == "SUCCEEDED") == (status == "SUCCEEDED")]
        if rows:
            key = f"{prefix}{run_id}/{status}_0.json"
            body = json.dumps(rows).encode()
            s3.put_object(Bucket=parameters["Bucket"], Key=key, Body=body)
            files[status].append({"Key": key, "Size": len(body)})
    manifest = f"{prefix}{run_id}/manifest.json"
    body = {"DestinationBucket": parameters["Bucket"], "MapRunArn": record.map_run_arn, "ResultFiles": files}
    s3.put_object(Bucket=parameters["Bucket"], Key=manifest, Body=json.dumps(body, indent=2).encode())
    env.stack.append({"MapRunArn": record.map_run_arn, "ResultWriterDetails": {"Bucket": parameters["Bucket"], "Key": manifest}})


def _now() -> str:
    return datetime.now(tz=UTC).isoformat()


class AwsStepFunctions:
    """Install in a process whose moto runs Step Functions executions; `uninstall` restores moto."""

    def __init__(self, *, time_scale: float = 1.0, express_limit: float = EXPRESS_LIMIT_SECONDS) -> None:
        if time_scale <= 0:
            raise ValueError("the time scale must be positive")
        self.time_scale = time_scale
        self.express_limit = express_limit
        self._saved: list[tuple[Any, str, Any]] = []

    def real_seconds(self, emulated: float) -> float:
        """How long `emulated` seconds of the service's clock take in real time."""
        return emulated / self.time_scale

    # -- install ----------------------------------------------------------------
    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, value)

    def install(self) -> AwsStepFunctions:
        from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
        from moto.stepfunctions.parser.asl.component.state.exec.state_map import state_map
        from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration import distributed_iteration_component as dic
        from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration import inline_iteration_component as iic
        from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.itemprocessor import (
            distributed_item_processor_worker as dipw,
        )
        from moto.stepfunctions.parser.asl.component.state.wait.wait_function import wait_function

        semantics = self
        StateMap = state_map.StateMap
        Component = dic.DistributedIterationComponent
        Inline = iic.InlineIterationComponent
        Worker = dipw.DistributedItemProcessorWorker
        original_props = StateMap.from_state_props
        original_map_run = Component._map_run

        def from_state_props(self: Any, state_props: Any) -> None:
            from moto.stepfunctions.parser.asl.component.state.exec.state_map.tolerated_failure import (
                ToleratedFailureCountDecl,
                ToleratedFailurePercentageDecl,
            )

            original_props(self, state_props)
            self.iteration_component._braid_map = MapSettings(
                name=self.name,
                count_declared=state_props.get(ToleratedFailureCountDecl) is not None,
                percentage_declared=state_props.get(ToleratedFailurePercentageDecl) is not None,
                express=EXPRESS_MARK in str(getattr(getattr(self.iteration_component, "_comment", None), "comment", "") or ""),
                writer=getattr(self, "result_writer", None) is not None,
            )

        def _map_run(self: Any, env: Any, eval_input: Any) -> None:
            settings: MapSettings | None = getattr(self, "_braid_map", None)
            record = eval_input.map_run_record
            items = env.stack[-1]
            declared = settings or MapSettings("", False, False, False)
            tolerance = Tolerance(
                total=len(items) if isinstance(items, list) else 0,
                count=int(record.tolerated_failure_count) if declared.count_declared else None,
                percentage=float(record.tolerated_failure_percentage) if declared.percentage_declared else None,
            )
            record._braid_tolerance = tolerance
            record._braid_express = declared.express
            original_map_run(self, env, eval_input)
            if tolerance.exceeded():
                env.stack.pop()  # the outputs: a failed Map state has none
                semantics._raise_threshold(env)
            if not declared.writer:
                semantics._check_result_size(env, eval_input.state_name)

        original_inline = Inline._eval_body

        def _inline_eval_body(self: Any, env: Any) -> None:
            state_name = getattr(env.stack[-1], "state_name", "")
            original_inline(self, env)
            semantics._check_result_size(env, state_name)

        self._patch(StateMap, "from_state_props", from_state_props)
        self._patch(Component, "_map_run", _map_run)
        self._patch(Inline, "_eval_body", _inline_eval_body)
        self._patch(Worker, "_eval_job", lambda worker, env, job: semantics._eval_job(worker, env, job))
        self._patch(Worker, "_eval_pool", lambda worker, job, worker_frame: semantics._eval_pool(worker, job, worker_frame))
        from moto.stepfunctions.parser.asl.component.state.exec.state_map.result_writer.resource_eval import resource_eval_s3

        self._patch(resource_eval_s3.ResourceEvalS3, "_handle_put_object", staticmethod(_export_results))
        self._patch(retrier_decl, "time", _ScaledTime(lambda: self.time_scale))
        self._patch(wait_function.WaitFunction, "_wait_interval", lambda function, env, wait_seconds: semantics._wait(env, wait_seconds))
        return self

    def uninstall(self) -> None:
        while self._saved:
            owner, name, value = self._saved.pop()
            setattr(owner, name, value)

    def __enter__(self) -> AwsStepFunctions:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # -- Wait states --------------------------------------------------------------
    def _wait(self, env: Any, seconds: float) -> None:
        deadline = time.monotonic() + self.real_seconds(float(seconds))
        while env.is_running():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            env.program_state_event.wait(left)

    # -- the Map Run ------------------------------------------------------------------
    @staticmethod
    def _raise_threshold(env: Any) -> None:
        from moto.stepfunctions.parser.api import HistoryEventType, MapRunFailedEventDetails
        from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEvent, FailureEventException
        from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
        from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import StatesErrorNameType
        from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails

        name = StatesErrorName(typ=StatesErrorNameType.StatesExceedToleratedFailureThreshold)
        assert name.error_name == EXCEED_THRESHOLD
        # A state-level failure (not ExecutionFailed): the Map state records
        # MapRunFailed and MapStateFailed, then its Retry and Catch apply.
        raise FailureEventException(
            failure_event=FailureEvent(
                env=env,
                error_name=name,
                event_type=HistoryEventType.MapRunFailed,
                event_details=EventDetails(mapRunFailedEventDetails=MapRunFailedEventDetails(error=EXCEED_THRESHOLD, cause=EXCEED_THRESHOLD_CAUSE)),
            )
        )

    @staticmethod
    def _check_result_size(env: Any, state_name: str) -> None:
        """States.DataLimitExceeded when the Map's results (on the stack) exceed the state size quota."""
        from moto.stepfunctions.parser.api import ExecutionFailedEventDetails, HistoryEventType
        from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEvent, FailureEventException
        from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
        from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import StatesErrorNameType
        from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails

        size = len(json.dumps(env.stack[-1], separators=(",", ":")).encode())
        if size <= STATE_LIMIT_BYTES:
            return
        env.stack.pop()  # a failed Map state has no result
        name = StatesErrorName(typ=StatesErrorNameType.StatesStatesDataLimitExceeded)
        assert name.error_name == DATA_LIMIT_ERROR
        cause = f"The state/task '{state_name}' returned a result with a size exceeding the maximum number of bytes service limit."
        # As moto reports a Task's oversized result: a state-level failure, which the Map's Retry and Catch see.
        raise FailureEventException(
            failure_event=FailureEvent(
                env=env,
                error_name=name,
                event_type=HistoryEventType.TaskFailed,
                event_details=EventDetails(executionFailedEventDetails=ExecutionFailedEventDetails(error=DATA_LIMIT_ERROR, cause=cause)),
            )
        )

    def _eval_pool(self, worker: Any, job: Any, worker_frame: Any) -> None:
        """moto's loop over jobs, which stops taking items once the Map Run has failed."""
        tolerance: Tolerance | None = getattr(worker._map_run_record, "_braid_tolerance", None)
        while job is not None:
            job_frame = worker_frame.open_inner_frame()
            self._eval_job(worker, job_frame, job)
            worker_frame.delete_frame(job_frame)
            if isinstance(job.job_output, Exception) or worker.stopped():
                break
            if tolerance is not None and tolerance.exceeded():
                self._abort_pending(worker)
            next_job = worker._job_pool.next_job()
            worker._job_pool.close_job(job)
            job = next_job
        else:
            worker._env.delete_frame(worker_frame)
            return
        worker._env.delete_frame(worker_frame)
        worker._job_pool.close_job(job)

    @staticmethod
    def _abort_pending(worker: Any) -> None:
        """Items not started when the threshold is exceeded never start (counted aborted)."""
        pool = worker._job_pool
        while True:
            pending = pool.next_job()
            if pending is None:
                return
            pending.job_output = None
            worker._map_run_record.item_counter.aborted.count()
            pool.close_job(pending)

    def _eval_job(self, worker: Any, env: Any, job: Any) -> None:
        from moto.stepfunctions.parser.asl.eval.program_state import ProgramError, ProgramStopped
        from moto.stepfunctions.parser.asl.eval.states import ItemData, MapData

        record = worker._map_run_record
        tolerance: Tolerance | None = getattr(record, "_braid_tolerance", None)
        express = bool(getattr(record, "_braid_express", False))
        record.item_counter.total.count()
        record.item_counter.running.count()
        record.execution_counter.total.count()
        record.execution_counter.running.count()
        started = _now()
        name = str(uuid.uuid4())
        failure: tuple[str, str, str] | None = None  # (status, error, cause)
        succeeded = False
        job_output: Any = None
        try:
            env.states.context_object.context_object_data["Map"] = MapData(Item=ItemData(Index=job.job_index, Value=job.job_input))
            env.states.reset(job.job_input)
            env.stack.append(env.states.get_input())
            worker._eval_input(env_frame=env)
            finished = self._run_child(job, env, limit=self.real_seconds(self.express_limit) if express else None)
            end_state = env.program_state()
            if not finished:
                env.set_timed_out()
                failure = ("TIMED_OUT", TIMEOUT_ERROR, f"The execution ran longer than the Express maximum of {self.express_limit:g} s")
            elif isinstance(end_state, ProgramError):
                details = end_state.error or {}
                failure = ("FAILED", str(details.get("error", "")), str(details.get("cause", "")))
            elif isinstance(end_state, ProgramStopped):
                record.execution_counter.aborted.count()
                record.item_counter.aborted.count()
            else:
                record.item_counter.succeeded.count()
                record.item_counter.results_written.count()
                record.execution_counter.succeeded.count()
                record.execution_counter.results_written.count()
                job_output = env.states.get_input()
                succeeded = True
        except Exception as exc:  # what moto's own worker counts as a failed item
            failure = ("FAILED", type(exc).__name__, str(exc))
        finally:
            record.item_counter.running.offset(-1)
            record.execution_counter.running.offset(-1)
        kind = "express" if express else "execution"
        arn_base = record.map_state_machine_arn.replace(":stateMachine:", f":{kind}:")
        execution = {
            "ExecutionArn": f"{arn_base}:{name}",
            "Input": json.dumps(job.job_input, separators=(",", ":")),
            "InputDetails": {"Included": True},
            "Name": name,
            "StateMachineArn": record.map_state_machine_arn,
            "StartDate": started,
            "StopDate": _now(),
        }
        results = record.__dict__.setdefault("_braid_results", {})
        if failure is None:
            if succeeded:
                results[job.job_index] = {**execution, "Status": "SUCCEEDED", "Output": json.dumps(job_output, separators=(",", ":")),
                                          "OutputDetails": {"Included": True}}
        else:
            status, error, cause = failure
            if status == "TIMED_OUT":
                record.item_counter.timed_out.count()
                record.execution_counter.timed_out.count()
            else:
                record.item_counter.failed.count()
                record.execution_counter.failed.count()
            if tolerance is not None:
                tolerance.add_failure()
            job_output = {**execution, "Status": status, "Error": error, "Cause": cause}
            results[job.job_index] = job_output
        job.job_output = job_output

    @staticmethod
    def _run_child(job: Any, env: Any, limit: float | None) -> bool:
        """Run the child program; False when it ran past `limit` real seconds (then it is left to finish alone)."""
        if limit is None:
            job.job_program.eval(env)
            return True
        done = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                job.job_program.eval(env)
            except BaseException as exc:  # re-raised in the map's thread
                errors.append(exc)
            finally:
                done.set()

        threading.Thread(target=run, name="express-child", daemon=True).start()
        finished = done.wait(limit)
        if errors:
            raise errors[0]
        return finished

