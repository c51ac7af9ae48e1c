"""Run moto's Lambda invocations in this process instead of in Docker.

moto executes Lambda code in Docker containers, which these machines lack.
`LambdaFunction._invoke_lambda` is the narrowest seam: it receives the event
and returns (payload, errored, logs). `InProcessLambdas` replaces it with a
call of the function's own handler, loaded from the code moto holds for the
function (the zip created from the CDK asset), with the function's
environment, and answers as Lambda does: the return value as JSON, or on an
exception `{"errorType": <class name>, "errorMessage": ...}` with the error
flag, which Step Functions turns into the error name its Retry and Catch
match.

The handler's imports (the `braid` package the layer ships) resolve to this
process's editable install: the same source the layer is built from.

Faults can be injected per function (`fail(...)`), e.g. a worker that fails
once, always, or on its first K invocations, to exercise Retry, Catch and
Cleanup.

Each invocation is held to the function's Timeout, as Lambda holds it: past
it the invocation answers `Sandbox.Timedout` ("Task timed out after N
seconds"), the error Step Functions' Retry and Catch see, and the context's
`get_remaining_time_in_millis` counts down to it. Lambda would then stop the
runtime; in-process the handler's thread cannot be killed and runs on, as a
late worker would. `time_scale` S runs that clock S times faster than real
time (support.sfn_semantics: the same scale as the emulated Step Functions).

Usage (any process that runs moto in-process, tests or the emulated cloud):

    lambdas = InProcessLambdas()
    with lambdas:            # install / uninstall the hook
        ...                  # Step Functions executions invoke handlers here
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import tempfile
import threading
import time
import traceback
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from moto.awslambda.models import LambdaFunction

# Settings every in-process invocation gets; X-Ray has no daemon here.
PROCESS_ENVIRONMENT = {"POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_DISABLED": "false"}


@dataclass
class LambdaContext:
    """The attributes Powertools and handlers read from Lambda's context object."""

    function_name: str
    memory_limit_in_mb: int
    invoked_function_arn: str
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    function_version: str = "$LATEST"
    log_group_name: str = ""
    log_stream_name: str = ""

    deadline: float = float("inf")  # time.monotonic() at which the invocation times out
    time_scale: float = 1.0

    def get_remaining_time_in_millis(self) -> int:
        left = (self.deadline - time.monotonic()) * self.time_scale
        return max(0, int(left * 1000)) if left != float("inf") else 900_000


class SandboxTimedout(Exception):
    """What Lambda reports for an invocation that ran past its timeout (errorType Sandbox.Timedout)."""


@dataclass
class Fault:
    """Raise `error` on the next `times` invocations (None: always) whose event passes `when`."""

    error: Callable[[], BaseException]
    times: int | None = 1
    when: Callable[[dict[str, Any]], bool] = lambda event: True
    raised: int = 0


class InProcessLambdas:
    def __init__(
        self, workdir: Path | None = None, *, time_scale: float = 1.0, credentials: Callable[[str], str | None] | None = None
    ) -> None:
        self.time_scale = time_scale
        # The access key a function's requests sign with (support.emulated_iam: its own role's);
        # None: the process's own credentials.
        self.credentials = credentials
        self._workdir = Path(workdir or tempfile.mkdtemp(prefix="braid-lambdas-"))
        self._modules: dict[str, ModuleType] = {}
        self._faults: dict[str, list[Fault]] = {}
        self._lock = threading.Lock()
        self._original: Any = None
        self._environ_before: dict[str, str | None] = {}
        self._environ_set: dict[str, str] = {}
        self.invocations: dict[str, int] = {}

    # -- hook ------------------------------------------------------------------
    def install(self) -> None:
        if self._original is not None:
            return
        self._original = LambdaFunction._invoke_lambda
        lambdas = self

        def _invoke_lambda(function: LambdaFunction, event: Any = None) -> tuple[str, bool, str]:
            return lambdas.invoke(function, event)

        LambdaFunction._invoke_lambda = _invoke_lambda  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self._original is not None:
            LambdaFunction._invoke_lambda = self._original  # type: ignore[method-assign]
            self._original = None
        with self._lock:
            for name, value in self._environ_before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            self._environ_before.clear()
            self._environ_set.clear()

    def __enter__(self) -> InProcessLambdas:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # -- faults ----------------------------------------------------------------
    def fail(self, function_name: str, error: Callable[[], BaseException], *, times: int | None = 1, when: Callable[[dict[str, Any]], bool] | None = None) -> Fault:
        fault = Fault(error, times, when or (lambda event: True))
        with self._lock:
            self._faults.setdefault(function_name, []).append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _fault_for(self, function_name: str, event: dict[str, Any]) -> BaseException | None:
        with self._lock:
            for fault in self._faults.get(function_name, []):
                if (fault.times is None or fault.raised < fault.times) and fault.when(event):
                    fault.raised += 1
                    return fault.error()
        return None

    # -- invocation ------------------------------------------------------------
    def _module(self, function: LambdaFunction) -> ModuleType:
        """The handler module, loaded once per code version from the function's own zip."""
        code = function.code_bytes
        digest = hashlib.sha256(code).hexdigest()[:16]
        module_file, _, _ = str(function.handler).rpartition(".")
        cache_key = f"{digest}:{module_file}"
        with self._lock:
            if cache_key in self._modules:
                return self._modules[cache_key]
            target = self._workdir / digest
            if not target.is_dir():
                with zipfile.ZipFile(io.BytesIO(code)) as archive:
                    archive.extractall(target)
            path = target / (module_file.replace(".", "/") + ".py")
            spec = importlib.util.spec_from_file_location(f"braid_lambda_{digest}_{module_file.replace('.', '_')}", path)
            if spec is None or spec.loader is None:
                raise RuntimeError(f"cannot load handler {function.handler} of {function.function_name}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self._modules[cache_key] = module
            return module

    def _environment(self, function: LambdaFunction) -> None:
        """Functions share one process: their environments must agree (the stack gives all the same)."""
        with self._lock:
            for name, value in {**PROCESS_ENVIRONMENT, **function.environment_vars, "AWS_DEFAULT_REGION": function.region}.items():
                value = str(value)
                if self._environ_set.get(name, value) != value:
                    raise RuntimeError(f"in-process functions disagree on {name}: {self._environ_set[name]!r} vs {value!r}")
                if name not in self._environ_before:
                    self._environ_before[name] = os.environ.get(name)
                self._environ_set[name] = value
                os.environ[name] = value

    def invoke(self, function: LambdaFunction, event: Any) -> tuple[str, bool, str]:
        if isinstance(event, (str, bytes)):
            event = json.loads(event or "{}")
        name = function.function_name
        with self._lock:
            self.invocations[name] = self.invocations.get(name, 0) + 1
        try:
            self._environment(function)
            module = self._module(function)
            handler = getattr(module, str(function.handler).rpartition(".")[2])
            fault = self._fault_for(name, event)
            if fault is not None:
                raise fault
            context = LambdaContext(name, int(function.memory_size or 128), function.function_arn)
            timeout = float(function.timeout or 3)
            context.time_scale = self.time_scale
            context.deadline = time.monotonic() + timeout / self.time_scale
            access_key = self.credentials(name) if self.credentials else None
            result = self._call(handler, event, context, timeout, access_key)
            return json.dumps(result), False, ""
        except Exception as exc:  # the Lambda runtime reports every handler exception this way
            payload = {
                "errorType": "Sandbox.Timedout" if isinstance(exc, SandboxTimedout) else type(exc).__name__,
                "errorMessage": str(exc),
                "stackTrace": traceback.format_exception(exc)[-5:],
            }
            return json.dumps(payload), True, "".join(traceback.format_exception(exc))

    def _call(self, handler: Callable[[Any, Any], Any], event: Any, context: LambdaContext, timeout: float, access_key: str | None) -> Any:
        """The handler's result, or Sandbox.Timedout once the function's timeout has passed."""
        from support.emulated_iam import signing_as

        outcome: list[Any] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                with signing_as(access_key):
                    outcome.append(handler(event, context))
            except BaseException as exc:  # re-raised in the invoking thread
                failure.append(exc)

        thread = threading.Thread(target=run, name=f"lambda-{context.function_name}", daemon=True)
        thread.start()
        thread.join(max(0.0, context.deadline - time.monotonic()))
        if thread.is_alive():
            raise SandboxTimedout(f"RequestId: {context.aws_request_id} Error: Task timed out after {timeout:.2f} seconds")
        if failure:
            raise failure[0]
        return outcome[0]

    def invocation_count(self, function_name: str) -> int:
        with self._lock:
            return self.invocations.get(function_name, 0)
