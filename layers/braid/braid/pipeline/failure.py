"""A failed step's error as Step Functions hands it to the next state, unwrapped for a person.

A Catch puts `{"Error", "Cause"}` in the state; for a Lambda error the
cause is the function's JSON error payload. Cleanup (which reports a
failure) and the Hold step (which keeps the backup for `--resume`) both
name the error from it.

The Hold state calls the Plan function with an explicit entry
(`hold_entry`): the state machine says the call is a hold. `invalid_input`
turns what reading an event or a document raised into one UsageError.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from braid.contract import HOLD_ENTRY, HOLD_STATE
from braid.errors import UsageError


@contextmanager
def invalid_input(what: str, *errors: type[Exception]) -> Iterator[None]:
    """Any of `errors` (default KeyError, TypeError, ValueError) raised inside, as UsageError("WHAT: the error")."""
    caught = errors or (KeyError, TypeError, ValueError)
    try:
        yield
    except caught as exc:
        raise UsageError(f"{what}: {exc}") from None


def describe_error(error: Mapping[str, Any] | None) -> tuple[str, str]:
    """The error name and its message, unwrapped from a Lambda error payload when it is one."""
    if not error:
        return "BackupFailed", "the pipeline failed without an error record"
    name = str(error.get("Error") or "BackupFailed")
    cause = str(error.get("Cause") or "")
    try:
        payload = json.loads(cause)
        if isinstance(payload, dict) and "errorMessage" in payload:
            name = str(payload.get("errorType") or name)
            cause = str(payload["errorMessage"])
    except ValueError:
        pass
    return name, cause or "no cause given"


@dataclass(frozen=True)
class HoldEntry:
    """The Hold state's call: which step failed (a state's name), its caught error, and the execution's state."""

    step: str
    error: Mapping[str, Any] | None
    state: Mapping[str, Any]


def hold_entry(event: Mapping[str, Any]) -> HoldEntry | None:
    """The Hold state's entry in a Plan function's event (`{"hold": {"step", "error"}, "state": {...}}`), or None for a
    PlanSegments call (the execution's state itself). A malformed entry is a UsageError: it is the stack's, never guessed."""
    if HOLD_ENTRY not in event:
        return None
    hold, state = event[HOLD_ENTRY], event.get(HOLD_STATE)
    if not isinstance(hold, Mapping) or not isinstance(hold.get("step"), str) or not hold["step"] or not isinstance(state, Mapping):
        raise UsageError(f"the Hold state's event must be {{{HOLD_ENTRY!r}: {{'step', 'error'}}, {HOLD_STATE!r}: the state}}, not {dict(event)!r}"[:500])
    error = hold.get("error")
    if error is not None and not isinstance(error, Mapping):
        raise UsageError(f"the Hold state's error must be the caught {{'Error', 'Cause'}}, not {error!r}"[:500])
    return HoldEntry(hold["step"], error, state)
