"""The cloud path's staging area: the contract between agent and pipeline.

Everything a backup in flight needs lives under `staging/NAME/ID/` (the
layout, object by object: docs/format.md, "Cloud staging"), so the agent can
resume from another process (or host) and the pipeline needs nothing from the
host but these objects. No plaintext outlives the backup: the planner deletes
each segment once its chunks are all stored, Finalize and Cleanup delete the
rest, and the bucket's lifecycle aborts stray multipart uploads and expires
leftover staging.

keys: every key and the parsers listings need; records: what the agent
writes; chain: captured members and an incremental's parent values; rounds:
what the pipeline writes; failures: what a failed worker writes; area:
StagingArea, the one reader and writer of all of them.
"""

from braid.format.staging.area import StagingArea
from braid.format.staging.failures import ItemFailure
from braid.format.staging.hold import HoldRecord, ResumeRequest
from braid.format.staging.keys import parse_segment_key, segment_key, segment_record_key, session_key, stream_end_key, wake_key
from braid.format.staging.records import SegmentRecord, SessionRecord, StreamEnd
from braid.format.staging.rounds import ChunkSlice, ItemResult, MapItem, Round, RoundFold
from braid.format.staging.wake import WakeRecord

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
