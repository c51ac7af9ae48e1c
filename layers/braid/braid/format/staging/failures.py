"""A worker's failure record `failures/<first index>.json`: the error it raised for one map item.

Written by the worker before it re-raises, so Cleanup can name the worker's
real error (Step Functions reports only the map's). Meant for a person to
read: the cause is cut to MAX_FAILURE_CAUSE characters.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from braid.format.canonical import canonical_json
from braid.format.fields import Fields
from braid.format.staging.protocol import document

MAX_FAILURE_CAUSE = 2000


@dataclass(frozen=True)
class ItemFailure:
    """The error a worker raised for one map item (its last attempt's, since a retry overwrites it)."""

    first_index: int
    count: int
    error: str
    cause: str

    def to_bytes(self) -> bytes:
        return canonical_json({**asdict(self), "cause": self.cause[:MAX_FAILURE_CAUSE]})

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> ItemFailure:
        what = f"failure record {where}"
        f = Fields(document(raw, what), what, ("first_index", "count", "error", "cause"))
        return cls(f.count("first_index"), f.count("count"), f.text("error"), f.text("cause")[:MAX_FAILURE_CAUSE])

    def describe(self) -> str:
        return f"chunks {self.first_index}..{self.first_index + self.count - 1}: {self.error}: {self.cause}"
