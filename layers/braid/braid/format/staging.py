"""The cloud path's staging area: the contract between agent and pipeline.

Everything a backup in flight needs lives in S3 under `staging/NAME/ID/`, so
that the agent can resume from another process (or host) and the pipeline
needs nothing from the host but these objects:

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
    plans/in<I>-seg<S>.json      map items of one segment, written by the pipeline
    results/NNNNNNNNNN.json      one ChunkEntry per chunk, written by the worker

No plaintext outlives the backup: Finalize and Cleanup delete the segments,
and the bucket's lifecycle aborts stray multipart uploads and expires
leftover staging.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from braid.format.ids import BackupRef
from braid.format.layout import staging_prefix


def session_key(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}session.json"


def segment_key(ref: BackupRef, input_index: int, segment: int) -> str:
    return f"{staging_prefix(ref)}in{input_index}/seg{segment:05d}"


def segment_record_key(ref: BackupRef, input_index: int, segment: int) -> str:
    return f"{staging_prefix(ref)}segments/in{input_index}-seg{segment:05d}.json"


def segment_records_prefix(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}segments/"


def stream_end_key(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}stream-end.json"


def wrapped_key_key(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}key.json"


def plan_key(ref: BackupRef, input_index: int, segment: int) -> str:
    return f"{staging_prefix(ref)}plans/in{input_index}-seg{segment:05d}.json"


def result_key(ref: BackupRef, index: int) -> str:
    return f"{staging_prefix(ref)}results/{index:010d}.json"


def results_prefix(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}results/"


@dataclass(frozen=True)
class SessionRecord:
    backup: str
    repository: str
    chunk_size: int
    segment_parts: int
    level: int
    inputs: list[str]  # sources as the user named them
    created: str

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> SessionRecord:
        doc: dict[str, Any] = json.loads(raw)
        return cls(**doc)


@dataclass(frozen=True)
class SegmentRecord:
    input_index: int
    segment: int
    key: str
    offset: int  # of the segment's first byte within its input
    length: int
    parts: int
    checksum: str  # crc64nvme full-object checksum S3 verified on completion
    # CRC64NVME (base64) of each part as the agent read it, in part order: the
    # worker checks the bytes it fetched against them before encoding, so
    # what gets encrypted is exactly what left the database host.
    part_checksums: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> SegmentRecord:
        doc: dict[str, Any] = json.loads(raw)
        return cls(**doc)


@dataclass(frozen=True)
class StreamEnd:
    lengths: list[int]  # per input, in input order
    segments: list[int]  # segment count per input

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> StreamEnd:
        doc: dict[str, Any] = json.loads(raw)
        return cls(**doc)
