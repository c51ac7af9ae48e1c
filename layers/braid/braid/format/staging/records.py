"""The agent's flat staging records: its session, segment records and stream end (the planner's hold, a resume
request and a worker's failure are braid.format.staging.holds').

Each has one `to_bytes`, one `from_bytes` that checks every field's type
and range (braid.format.staging.protocol.Record: a damaged or hand-edited
object fails here, with the key in the message), and the agent's a `check`
against what they must agree with (the backup, the session). StagingArea
calls both, so the agent and the pipeline refuse the same objects with the
same IntegrityError.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from braid.errors import IntegrityError
from braid.format.canonical import canonical_json
from braid.format.chain import Lineage
from braid.format.fields import Fields
from braid.format.ids import BackupRef
from braid.format.staging.keys import segment_key
from braid.format.staging.protocol import PROTOCOL, Record, check_protocol, document
from braid.format.usage import Usage

# What an incremental's producer command may ask of its parent (braid.ops.chain_placeholders), in its session record.
PARENT_VALUES = ("parent_manifest", "parent_lsn")


@dataclass(frozen=True)
class SessionRecord:
    """Written first by the agent: what every later reader needs to know about the backup."""

    backup: str
    repository: str
    chunk_size: int
    segment_chunks: int  # chunks per segment
    level: int
    inputs: list[str]  # sources as the user named them
    created: str
    # Chunks per multipart part (the last may hold fewer). Agent-only, to send a resumed upload's parts as before:
    # the pipeline reads chunks by byte offset, so every chunk count is in chunks whatever this is.
    part_chunks: int = 1
    # One-chunk parts that start each input's first segment (braid.agent.segments.PartLayout); agent-only, 0 if absent.
    ramp_parts: int = 0
    # An incremental's place in its chain (braid.format.chain), sealed by Finalize; absent: a full backup.
    lineage: Lineage = field(default_factory=Lineage)
    # What the agent needs from the parent before it starts the producer (braid.format.staging.chain.PARENT_VALUES):
    # Prepare writes them to parent.json. Only an incremental asks.
    parent_values: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        doc = {**asdict(self), "protocol": PROTOCOL, "lineage": self.lineage.to_json()}
        if not self.lineage.is_incremental:
            del doc["lineage"], doc["parent_values"]
        return canonical_json(doc)

    @classmethod
    def from_bytes(cls, raw: bytes, where: str = "session.json") -> SessionRecord:
        what = f"staged session {where}"
        names = ("backup", "repository", "chunk_size", "segment_chunks", "level", "inputs", "created")
        doc = document(raw, what)
        chain = ("lineage", "parent_values")
        Fields(doc, what, names, optional=("part_chunks", "ramp_parts", "protocol", *chain))
        check_protocol(doc, what)
        f = Fields(doc, what, (*names, "part_chunks", "protocol"), optional=("ramp_parts", *chain))
        ramp_parts = f.count("ramp_parts") if "ramp_parts" in f.doc else 0
        lineage = Lineage()
        if "lineage" in f.doc:
            try:
                lineage = Lineage.from_json(f.doc["lineage"] if isinstance(f.doc["lineage"], dict) else {}, f.text("backup"))
            except ValueError as exc:
                raise IntegrityError(f"{what} is malformed: lineage: {exc}") from None
        values = f.texts("parent_values", [])
        if any(v not in PARENT_VALUES for v in values) or (values and not lineage.is_incremental):
            raise IntegrityError(f"{what} is malformed: parent_values {values!r} (only an incremental asks for {', '.join(PARENT_VALUES)})")
        return cls(
            f.text("backup"), f.text("repository"), f.count("chunk_size"), f.count("segment_chunks"), f.count("level"), f.texts("inputs"),
            f.text("created"), f.count("part_chunks"), ramp_parts, lineage, values,
        )

    def check(self, ref: BackupRef, where: str) -> None:
        """The session is this backup's and its settings can describe a stream."""
        if self.backup != str(ref):
            raise IntegrityError(f"staged session at {where} names {self.backup}, not {ref}")
        if self.chunk_size < 1 or self.segment_chunks < 1 or self.part_chunks < 1 or self.ramp_parts < 0 or not self.inputs:
            raise IntegrityError(
                f"staged session of {ref} has impossible settings"
                f" (chunk size {self.chunk_size}, {self.segment_chunks} chunks per segment, {self.part_chunks} per part,"
                f" {len(self.inputs)} inputs)"
            )


@dataclass(frozen=True)
class SegmentRecord(Record):
    """Written by the agent once a segment's multipart upload completed."""

    KIND = "segment record"

    input_index: int
    segment: int
    key: str
    offset: int  # of the segment's first byte within its input
    length: int
    chunks: int
    checksum: str  # crc64nvme full-object checksum S3 verified on completion
    # CRC64NVME (base64) of each chunk as the agent read it, in chunk order: the
    # worker checks the bytes it fetched against them before encoding, so
    # what gets encrypted is exactly what left the database host.
    chunk_checksums: list[str] = field(default_factory=list)

    def check(self, ref: BackupRef, session: SessionRecord) -> None:
        """Refuse a record that points outside its own staging object or has impossible sizes."""
        where = f"segment record in{self.input_index}/seg{self.segment} of {ref}"
        if not 0 <= self.input_index < len(session.inputs):
            raise IntegrityError(f"{where} names input {self.input_index}; the session has {len(session.inputs)}")
        if self.key != segment_key(ref, self.input_index, self.segment):
            raise IntegrityError(f"{where} points at {self.key}, not its own staging object")
        if self.chunks > session.segment_chunks or self.length < 0 or self.offset < 0:
            raise IntegrityError(f"{where} has impossible sizes ({self.chunks} chunks, {self.length} bytes)")
        expected = -(-self.length // session.chunk_size)
        if self.chunks != expected:
            raise IntegrityError(f"{where}: {self.length} bytes make {expected} chunks of {session.chunk_size}, record says {self.chunks}")
        if len(self.chunk_checksums) != self.chunks:
            raise IntegrityError(f"segment record {self.key} lists {len(self.chunk_checksums)} chunk checksums for {self.chunks} chunks")


@dataclass(frozen=True)
class StreamEnd(Record):
    """Written by the agent when every input ended: how long each was, in how many segments.

    Or, with `abandoned` (absent from an ordinary record) set, when the agent gives the stream up for good: the
    pipeline fails at its next poll with the reason as the cause and removes the staging; lengths and segments are
    then what the agent had sent so far.
    """

    KIND = "stream-end record"

    lengths: list[int]  # per input, in input order
    segments: list[int]  # segment count per input
    abandoned: str | None = None  # why the agent gave the stream up; None: the stream is complete
    # What the agent's run used up to this record (its requests, this record's PUT included);
    # optional: absent from older agents' records, and not part of what makes two ends equal.
    usage: Usage | None = field(default=None, compare=False)

    @classmethod
    def from_bytes(cls, raw: bytes, where: str = "stream-end.json") -> StreamEnd:
        end = super().from_bytes(raw, where)
        if end.abandoned is not None and not end.abandoned.strip():
            raise IntegrityError(f"{cls.KIND} {where} is malformed: abandoned must give a reason")
        if len(end.lengths) != len(end.segments):
            raise IntegrityError(f"{cls.KIND} {where} is malformed: {len(end.lengths)} lengths for {len(end.segments)} segment counts")
        return end

    def check(self, ref: BackupRef, session: SessionRecord) -> None:
        """The record describes the session's inputs, no more, no fewer."""
        if len(self.lengths) != len(session.inputs):
            raise IntegrityError(f"stream-end record of {ref} describes {len(self.lengths)} inputs; the session has {len(session.inputs)}")
