"""A held backup: items failed past every re-plan (or a coordinating step failed), finished work kept, waiting for `--resume`.

The planner writes a HoldRecord and the execution waits (until `until`)
instead of failing, keeping stored chunks, result records and the unfinished
items' staged segments. `braid backup --resume NAME@ID` writes a
ResumeRequest with a new nonce: the planner plans the unfinished items again
(only them). An abandoned stream-end or the hold's end fails the execution,
and Cleanup removes everything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from braid.errors import IntegrityError
from braid.format.canonical import canonical_json
from braid.format.fields import Fields
from braid.format.staging.protocol import document


@dataclass(frozen=True)
class HoldRecord:
    cause: str  # the first failed worker's error, or "STEP failed: ERROR: MESSAGE", for a person
    since: str  # Braid timestamp
    until: str  # Braid timestamp: after it the pipeline fails and removes the backup
    released_by: str  # the nonce of the resume request the hold predates ("" for none): a request with another nonce releases it
    items: int  # map items without a result (0: a coordinating step failed)

    def to_bytes(self) -> bytes:
        return canonical_json(asdict(self))

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> HoldRecord:
        what = f"hold record {where}"
        f = Fields(document(raw, what), what, ("cause", "since", "until", "released_by", "items"))
        return cls(f.text("cause"), f.text("since"), f.text("until"), f.text("released_by"), f.count("items"))


@dataclass(frozen=True)
class ResumeRequest:
    nonce: str

    def to_bytes(self) -> bytes:
        return canonical_json({"nonce": self.nonce})

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> ResumeRequest:
        what = f"resume request {where}"
        f = Fields(document(raw, what), what, ("nonce",))
        nonce = f.text("nonce")
        if not nonce:
            raise IntegrityError(f"{what} is malformed: empty nonce")
        return cls(nonce)
