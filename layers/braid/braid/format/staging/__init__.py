"""The cloud path's staging area: the contract between agent and pipeline.

Everything a backup in flight needs lives under `staging/NAME/ID/` (the
layout, object by object: docs/format.md, "Cloud staging"), so the agent can
resume from another process (or host) and the pipeline needs nothing from the
host but these objects. No plaintext outlives the backup: the planner deletes
each segment once its chunks are all stored, Finalize and Cleanup delete the
rest, and the bucket's lifecycle aborts stray multipart uploads and expires
leftover staging.

keys: every key and the parsers listings need; protocol: the version and
the strict codec; records: the flat records (the agent's, a hold, a worker's
failure); chain: captured members and an incremental's parent values;
rounds: the plan and the workers' results; wake: the wake record; area:
StagingArea (on results' StagingResults), the one reader and writer of all.

The plan's types (rounds) load on first use: an agent that only stages
(`--no-wait`, `wal-push`) reads no plan (docs/design/agent-startup.md).
"""

from typing import TYPE_CHECKING

from braid.format.staging.area import StagingArea
from braid.format.staging.keys import parse_segment_key, segment_key, segment_record_key, session_key, stream_end_key, wake_key
from braid.format.staging.records import HoldRecord, ItemFailure, ResumeRequest, SegmentRecord, SessionRecord, StreamEnd
from braid.format.staging.wake import WakeRecord

if TYPE_CHECKING:
    from braid.format.staging.rounds import ChunkSlice, ItemResult, MapItem, Round, RoundFold

_ROUNDS = frozenset({"ChunkSlice", "ItemResult", "MapItem", "Round", "RoundFold"})


def __getattr__(name: str) -> object:
    """The plan's types, imported from braid.format.staging.rounds when first asked for."""
    if name in _ROUNDS:
        from braid.format.staging import rounds

        return getattr(rounds, name)
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
