"""The cloud path's staging area: the contract between agent and pipeline.

Everything a backup in flight needs lives under `staging/NAME/ID/` (the
layout, object by object: docs/format.md, "Cloud staging"), so the agent can
resume from another process (or host) and the pipeline needs nothing from the
host but these objects. No plaintext outlives the backup: the planner deletes
each segment once its chunks are all stored, Finalize and Cleanup delete the
rest, and the bucket's lifecycle aborts stray multipart uploads and expires
leftover staging.

keys: every key and the parsers listings need; protocol: the version and
the strict codec; records: the agent's flat records; holds: a hold, a resume
request, a worker's failure; chain: captured members and an incremental's parent values;
rounds: the plan and the workers' results; wake: the wake record; area:
StagingArea (on results' StagingResults), the one reader and writer of all.

The plan's types (rounds) and the records of a backup that stopped (holds)
load on first use: an agent that only stages (`--no-wait`) reads neither
(docs/design/agent-startup.md).
"""

from typing import TYPE_CHECKING

from braid.format.staging.area import StagingArea
from braid.format.staging.keys import parse_segment_key, segment_key, segment_record_key, session_key, stream_end_key, wake_key
from braid.format.staging.records import SegmentRecord, SessionRecord, StreamEnd
from braid.format.staging.wake import WakeRecord

if TYPE_CHECKING:
    from braid.format.staging.holds import HoldRecord, ItemFailure, ResumeRequest
    from braid.format.staging.rounds import ChunkSlice, ItemResult, MapItem, Round, RoundFold

_LAZY = {
    **dict.fromkeys(("ChunkSlice", "ItemResult", "MapItem", "Round", "RoundFold"), "braid.format.staging.rounds"),
    **dict.fromkeys(("HoldRecord", "ItemFailure", "ResumeRequest"), "braid.format.staging.holds"),
}


def __getattr__(name: str) -> object:
    """The plan's types and the stopped backup's records, imported from their module when first asked for."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ChunkSlice",
    "ItemFailure",
    "ItemResult",
    "MapItem",
    "Round",
    "RoundFold",
    "SegmentRecord",
    "SessionRecord",
    "StagingArea",
    "StreamEnd",
    "WakeRecord",
    "HoldRecord",
    "ResumeRequest",
    "parse_segment_key",
    "segment_key",
    "segment_record_key",
    "session_key",
    "stream_end_key",
    "wake_key",
]
