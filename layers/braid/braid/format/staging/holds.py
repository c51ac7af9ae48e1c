"""The flat staging records of a backup that stopped or failed: the planner's hold, a resume request, a worker's failure.

Each is a braid.format.staging.protocol.Record (one `to_bytes`, one strict
`from_bytes`), as braid.format.staging.records' are; they live apart so that an
agent that only stages loads them only when it resumes or reads a hold
(~1 ms of CPU per dataclass at start-up: docs/design/agent-startup.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from braid.errors import IntegrityError
from braid.format.staging.protocol import Record

MAX_FAILURE_CAUSE = 2000


@dataclass(frozen=True)
class HoldRecord(Record):
    """Written by the planner when items failed past every re-plan (or a coordinating step failed): the execution
    waits until `until`, keeping finished work and the unfinished items' segments, for `braid backup --resume`."""

    KIND = "hold record"

    cause: str  # the first failed worker's error, or "STEP failed: ERROR: MESSAGE", for a person
    since: str  # Braid timestamp
    until: str  # Braid timestamp: after it the pipeline fails and removes the backup
    released_by: str  # the nonce of the resume request the hold predates ("" for none): a request with another nonce releases it
    items: int  # map items without a result (0: a coordinating step failed)


@dataclass(frozen=True)
class ResumeRequest(Record):
    """Written by `braid backup --resume NAME@ID`: a new nonce releases a hold, and the planner plans the
    unfinished items again (only them)."""

    KIND = "resume request"

    nonce: str

    @classmethod
    def from_bytes(cls, raw: bytes, where: str = "") -> ResumeRequest:
        request = super().from_bytes(raw, where)
        if not request.nonce:
            raise IntegrityError(f"{cls.KIND} {where} is malformed: empty nonce")
        return request


@dataclass(frozen=True)
class ItemFailure(Record):
    """A worker's `failures/<first index>.json`: the error it raised for one map item (its last attempt's), written
    before it re-raises so Cleanup can name it (Step Functions reports only the map's). For a person: the cause is
    cut to MAX_FAILURE_CAUSE characters."""

    KIND = "failure record"

    first_index: int
    count: int
    error: str
    cause: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "cause", self.cause[:MAX_FAILURE_CAUSE])

    def describe(self) -> str:
        return f"chunks {self.first_index}..{self.first_index + self.count - 1}: {self.error}: {self.cause}"
