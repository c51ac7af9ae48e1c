"""The cloud path's staging area: the contract between agent and pipeline.

Everything a backup in flight needs lives under `staging/NAME/ID/`, so that
the agent can resume from another process (or host) and the pipeline needs
nothing from the host but these objects:

    session.json                 written first by the agent: inputs, chunk size,
                                 segment size, level; what --resume reads
    in<I>/seg<S>                 multipart upload; part p (1-based) is chunk
                                 p-1 of the segment, every part exactly
                                 chunk_size bytes but the input's last
    segments/in<I>-seg<S>.json   written by the agent after it completed the
                                 segment (SegmentRecord)
    stream-end.json              written by the agent when every input ended
                                 (StreamEnd): input lengths and segment counts
    key.json                     wrapped data key, written by Prepare
    parent.json                  an incremental's parent values (or refusal), written by
                                 Prepare; parent/backup_manifest beside it (ParentRecord)
    captured.json                the small members the stream carried, staged by the
                                 agent before stream-end; captured/N each (CapturedIndex)
    plans/round-NNNNN.json       map items of one planner round (Round)
    results/NNNNNNNNNN.json      a ChunkEntry per chunk of one map item (ItemResult)
    folds/round-RRRRR-AA.json    the results index: one map's finished items' results,
                                 merged by the planner after that map (RoundFold):
                                 what Finalize reads instead of one record per item
    failures/NNNNNNNNNN.json     the error a worker raised for one map item
                                 (ItemFailure); Cleanup reports the first
    plans/retry-RRRRR-AA.json    items of round R without a result after its
                                 map, planned again (attempt A)
    held.json                    items failed past every re-plan: the backup
                                 waits for --resume (HoldRecord)
    resume.json                  written by --resume (ResumeRequest): releases
                                 a hold
    wake                         written by the sleeping state machine: its task
                                 token, which the agent sends back once what the
                                 planner waits for has arrived (WakeRecord)

No plaintext outlives the backup: the planner deletes each segment once its
chunks are all stored, Finalize and Cleanup delete the rest,
and the bucket's lifecycle aborts stray multipart uploads and expires
leftover staging.

keys: every key and the parsers listings need; records: what the agent
writes; chain: captured members and an incremental's parent values; rounds: what the pipeline writes; failures: what a failed worker
writes; area: StagingArea, the one reader and writer of all of them.
"""

from braid.format.staging.area import StagingArea
from braid.format.staging.failures import ItemFailure
from braid.format.staging.hold import HoldRecord, ResumeRequest
from braid.format.staging.keys import (
    failure_key,
    failures_prefix,
    parse_round_key,
    parse_segment_key,
    result_key,
    results_prefix,
    round_key,
    rounds_prefix,
    segment_key,
    segment_record_key,
    segment_records_prefix,
    segments_prefix,
    session_key,
    stream_end_key,
    wake_key,
    wrapped_key_key,
)
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
    "failure_key",
    "failures_prefix",
    "parse_round_key",
    "parse_segment_key",
    "result_key",
    "results_prefix",
    "round_key",
    "rounds_prefix",
    "segment_key",
    "segment_record_key",
    "segment_records_prefix",
    "segments_prefix",
    "session_key",
    "stream_end_key",
    "wake_key",
    "wrapped_key_key",
]
