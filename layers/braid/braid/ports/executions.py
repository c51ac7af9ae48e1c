"""Port: the pipeline executions the agent starts and follows (Step Functions on AWS).

One execution per backup, named by it, so starting twice finds the same one
and the agent, `braid status` and a resumed backup all follow the same run.
The agent needs only these two calls, which is all its IAM policy grants.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from braid.format.ids import BackupRef

TERMINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")


@dataclass(frozen=True)
class ExecutionStatus:
    arn: str
    status: str  # RUNNING | SUCCEEDED | FAILED | TIMED_OUT | ABORTED | PENDING_REDRIVE
    error: str | None
    cause: str | None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def failure_message(self, ref: BackupRef) -> str:
        """One line for a user: the pipeline's own words when it left any (Cleanup does)."""
        detail = self.cause or self.error or "no cause recorded"
        try:  # Lambda errors arrive as JSON with an errorMessage
            parsed = json.loads(detail)
            if isinstance(parsed, dict) and parsed.get("errorMessage"):
                detail = f"{parsed.get('errorType', self.error)}: {parsed['errorMessage']}"
        except (TypeError, ValueError):
            pass
        if detail.startswith(f"backup {ref} "):  # the pipeline's Cleanup already says it all
            return detail
        return f"backup {ref} {self.status.lower().replace('_', ' ')} in Step Functions ({self.error or 'error'}): {detail}"


class Executions(Protocol):
    def start(self, ref: BackupRef, document: dict[str, Any]) -> str:
        """Start the backup's execution with `document` as input; returns its id (ARN).
        An execution already started for the backup is found, not duplicated."""
        ...

    def describe(self, ref: BackupRef) -> ExecutionStatus:
        """The backup's execution as it stands; NotFoundError if none was started."""
        ...

    def wake(self, token: str) -> bool:
        """Send a sleeping execution's task token back (braid.format.staging.wake); False if it is no longer waiting for it."""
        ...
