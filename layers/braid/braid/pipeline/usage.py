"""The backup execution's usage: each step's own, carried to Finalize, plus what the state machine bills.

Who counts what is docs/format.md's (Usage): every Lambda invocation meters
itself (braid.ports.usage.InvocationMeter) and passes its usage on in the
execution's state or its item's result record; the agent's requests come in
the stream-end record; Step Functions is not asked: its bill follows from
the states the definition runs (infra/braid_infra/pipeline.py), counted
here. Retries are seen by no step, so the figures are then lower bounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from braid.contract import PlanState
from braid.errors import IntegrityError
from braid.format.usage import Usage, express_gb_seconds

START_TRANSITIONS = 2  # Identify, Prepare
PLAN_TRANSITIONS = 2  # PlanSegments, SegmentsReady?
FINISH_TRANSITIONS = 2  # Finalize, BackupSucceeded
WORKER = "worker"
ITEM_READER = {"s3:GetObject": 1}  # the Distributed Map reads the round file once
WAKE_WRITER = {"s3:PutObject": 1}  # SleepUntilWoken writes the wake record once


def carried_usage(state: Mapping[str, Any] | None, where: str) -> Usage | None:
    """The usage a previous step left in the execution's state (`$.prepared`, `$.plan`); None if it left none."""
    if not isinstance(state, Mapping) or "usage" not in state:
        return None
    try:
        return Usage.from_json(state["usage"], f"{where}.usage")
    except ValueError as exc:
        raise IntegrityError(f"the execution's state holds a malformed usage: {exc}") from None


def plan_call_usage(previous: Usage | None, own: Usage, status: str, items: int) -> Usage:
    """One PlanSegments call's usage added to the calls before it: its states, and the map it starts."""
    usage = (previous or Usage()) + own + Usage(transitions=PLAN_TRANSITIONS)
    if status == PlanState.READY:
        usage = usage + Usage(requests=dict(ITEM_READER), transitions=1, express_requests=items)
    elif status == PlanState.SLEEPING:  # SleepUntilWoken
        usage = usage + Usage(requests=dict(WAKE_WRITER), transitions=1)
    elif status != PlanState.DONE:  # waiting, or held: WaitForSegments
        usage = usage + Usage(transitions=1)
    return usage


def workers_usage(items: Iterable[Usage]) -> Usage:
    """The workers' usage records added up, with each one's Express child duration."""
    total = Usage()
    for item in items:
        worker = item.functions.get(WORKER)
        child = express_gb_seconds(worker.seconds) if worker is not None else 0.0
        total = total + item + Usage(express_gb_seconds=child)
    return total


def execution_usage(carried: Iterable[Usage | None], items: Iterable[Usage], finalize: Usage, *, staged_bytes: int, stored_bytes: int) -> Usage:
    """The whole backup's usage, as Finalize seals it into the manifest."""
    parts = [u for u in carried if u is not None]
    return Usage.total(
        [*parts, workers_usage(items), finalize, Usage(transitions=START_TRANSITIONS + FINISH_TRANSITIONS, staged_bytes=staged_bytes, stored_bytes=stored_bytes)]
    )
