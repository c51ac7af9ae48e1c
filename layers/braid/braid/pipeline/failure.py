"""A failed step's error as Step Functions hands it to the next state, unwrapped for a person.

A Catch puts `{"Error", "Cause"}` in the state; for a Lambda error the
cause is the function's JSON error payload. Cleanup (which reports a
failure) and the Hold step (which keeps the backup for `--resume`) both
name the error from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


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
