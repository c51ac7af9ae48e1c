"""The records the agent writes to staging: session, segment records, stream end.

Each record has one `to_bytes`, one `from_bytes` that checks every field's
type and range (a damaged or hand-edited object fails here, with the key in
the message, instead of as a TypeError three calls later), and one `check`
against what it must agree with (the backup, the session). StagingArea calls
both, so the agent and the pipeline refuse the same objects with the same
IntegrityError.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from braid.errors import IntegrityError
from braid.format.canonical import canonical_json
from braid.format.ids import BackupRef
from braid.format.staging.keys import segment_key
from braid.format.usage import Usage


def document(raw: bytes, what: str) -> Any:
    """The JSON in `raw`, or an IntegrityError naming `what` (a record and its key)."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise IntegrityError(f"{what} is malformed: not JSON") from None


class Fields:
    """Typed reads of one JSON object's fields, each failure an IntegrityError naming the record.

    `bool` is refused where an int is wanted (JSON `true` is not a count).
    """

    def __init__(self, doc: Any, what: str, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        if not isinstance(doc, dict):
            raise IntegrityError(f"{what} is malformed: not a JSON object")
        missing = [n for n in names if n not in doc]
        unknown = sorted(set(doc) - set(names) - set(optional))
        if missing or unknown:
            detail = "; ".join(s for s in (f"missing {', '.join(missing)}" if missing else "", f"unknown {', '.join(unknown)}" if unknown else "") if s)
            raise IntegrityError(f"{what} is malformed: {detail}")
        self.doc: dict[str, Any] = doc
        self.what = what

    def _fail(self, name: str, wanted: str) -> IntegrityError:
        return IntegrityError(f"{self.what} is malformed: {name} must be {wanted}, not {self.doc.get(name)!r}")

    def count(self, name: str) -> int:
        """A non-negative integer."""
        value = self.doc[name]
        if type(value) is not int or value < 0:
            raise self._fail(name, "a non-negative integer")
        return value

    def text(self, name: str) -> str:
        value = self.doc[name]
        if not isinstance(value, str):
            raise self._fail(name, "a string")
        return value

    def texts(self, name: str, default: list[str] | None = None) -> list[str]:
        value = self.doc.get(name, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail(name, "a list of strings")
        return list(value)

    def counts(self, name: str) -> list[int]:
        value = self.doc[name]
        if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
            raise self._fail(name, "a list of non-negative integers")
        return list(value)


def _encode(record: Any) -> bytes:
    return canonical_json(asdict(record))


@dataclass(frozen=True)
class SessionRecord:
    """Written first by the agent: what every later reader needs to know about the backup."""

    backup: str
    repository: str
    chunk_size: int
    segment_parts: int  # chunks per segment (the name is from when each chunk was one part)
    level: int
    inputs: list[str]  # sources as the user named them
    created: str
    # Chunks per multipart part of a segment (its last part may hold fewer).
    # Only the agent reads it, to send a resumed upload's parts as before: the
    # pipeline reads chunks by byte offset, so `segment_parts` and a segment
    # record's `parts` and `part_checksums` count chunks whatever this is.
    # Absent (1) in sessions of agents that sent one chunk per part.
    part_chunks: int = 1
    # One-chunk parts that start each input's first segment, before parts of
    # `part_chunks` (braid.agent.segments.PartLayout): a short stream still
    # has many parts in flight. Agent-only, like part_chunks; absent (0) in
    # sessions of agents without the ramp.
    ramp_parts: int = 0

    def to_bytes(self) -> bytes:
        doc = asdict(self)
        if self.part_chunks == 1:
            del doc["part_chunks"]  # as written before parts held several chunks
        if self.ramp_parts == 0:
            del doc["ramp_parts"]  # as written before the ramp
        return canonical_json(doc)

    @classmethod
    def from_bytes(cls, raw: bytes, where: str = "session.json") -> SessionRecord:
        what = f"staged session {where}"
        names = ("backup", "repository", "chunk_size", "segment_parts", "level", "inputs", "created")
        f = Fields(document(raw, what), what, names, optional=("part_chunks", "ramp_parts"))
        part_chunks = f.count("part_chunks") if "part_chunks" in f.doc else 1
        ramp_parts = f.count("ramp_parts") if "ramp_parts" in f.doc else 0
        return cls(
            f.text("backup"), f.text("repository"), f.count("chunk_size"), f.count("segment_parts"), f.count("level"), f.texts("inputs"),
            f.text("created"), part_chunks, ramp_parts,
        )

    def check(self, ref: BackupRef, where: str) -> None:
        """The session is this backup's and its settings can describe a stream."""
        if self.backup != str(ref):
            raise IntegrityError(f"staged session at {where} names {self.backup}, not {ref}")
        if self.chunk_size < 1 or self.segment_parts < 1 or self.part_chunks < 1 or self.ramp_parts < 0 or not self.inputs:
            raise IntegrityError(
                f"staged session of {ref} has impossible settings"
                f" (chunk size {self.chunk_size}, {self.segment_parts} chunks per segment, {self.part_chunks} per part,"
                f" {len(self.inputs)} inputs)"
            )


@dataclass(frozen=True)
class SegmentRecord:
    """Written by the agent once a segment's multipart upload completed."""

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
        return _encode(self)

    @classmethod
    def from_bytes(cls, raw: bytes, where: str = "segment record") -> SegmentRecord:
        what = f"segment record {where}"
        names = ("input_index", "segment", "key", "offset", "length", "parts", "checksum")
        f = Fields(document(raw, what), what, names, optional=("part_checksums",))
        return cls(
            f.count("input_index"),
            f.count("segment"),
            f.text("key"),
            f.count("offset"),
            f.count("length"),
            f.count("parts"),
            f.text("checksum"),
            f.texts("part_checksums", []),
        )

    def check(self, ref: BackupRef, session: SessionRecord) -> None:
        """Refuse a record that points outside its own staging object or has impossible sizes."""
        where = f"segment record in{self.input_index}/seg{self.segment} of {ref}"
        if not 0 <= self.input_index < len(session.inputs):
            raise IntegrityError(f"{where} names input {self.input_index}; the session has {len(session.inputs)}")
        if self.key != segment_key(ref, self.input_index, self.segment):
            raise IntegrityError(f"{where} points at {self.key}, not its own staging object")
        if self.parts > session.segment_parts or self.length < 0 or self.offset < 0:
            raise IntegrityError(f"{where} has impossible sizes ({self.parts} parts, {self.length} bytes)")
        expected_parts = -(-self.length // session.chunk_size)
        if self.parts != expected_parts:
            raise IntegrityError(f"{where}: {self.length} bytes make {expected_parts} parts of {session.chunk_size}, record says {self.parts}")
        if len(self.part_checksums) != self.parts:
            raise IntegrityError(f"segment record {self.key} lists {len(self.part_checksums)} part checksums for {self.parts} parts")


@dataclass(frozen=True)
class StreamEnd:
    """Written by the agent when every input ended: how long each was, in how many segments.

    Or written instead of that, with `abandoned` set, when the agent gives
    the stream up for good (its producer failed, the stream was empty, it
    cannot be resumed): the pipeline then fails at its next poll, with the
    reason as the cause, rather than waiting to time out, and removes the
    staging. Lengths and segments are then what the agent had sent so far.
    The field is absent from an ordinary record, which is unchanged.
    """

    lengths: list[int]  # per input, in input order
    segments: list[int]  # segment count per input
    abandoned: str | None = None  # why the agent gave the stream up; None: the stream is complete
    # What the agent's run used up to this record (its requests, this record's PUT included);
    # optional: absent from older agents' records, and not part of what makes two ends equal.
    usage: Usage | None = field(default=None, compare=False)

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {"lengths": self.lengths, "segments": self.segments}
        if self.abandoned is not None:
            doc["abandoned"] = self.abandoned
        if self.usage is not None:
            doc["usage"] = self.usage.to_json()
        return canonical_json(doc)

    @classmethod
    def from_bytes(cls, raw: bytes, where: str = "stream-end.json") -> StreamEnd:
        what = f"stream-end record {where}"
        f = Fields(document(raw, what), what, ("lengths", "segments"), optional=("abandoned", "usage"))
        abandoned = f.text("abandoned") if "abandoned" in f.doc else None
        if abandoned is not None and not abandoned.strip():
            raise IntegrityError(f"{what} is malformed: abandoned must give a reason")
        try:
            usage = Usage.from_json(f.doc["usage"], "usage") if "usage" in f.doc else None
        except ValueError as exc:
            raise IntegrityError(f"{what} is malformed: {exc}") from None
        end = cls(f.counts("lengths"), f.counts("segments"), abandoned, usage)
        if len(end.lengths) != len(end.segments):
            raise IntegrityError(f"{what} is malformed: {len(end.lengths)} lengths for {len(end.segments)} segment counts")
        return end

    def check(self, ref: BackupRef, session: SessionRecord) -> None:
        """The record describes the session's inputs, no more, no fewer."""
        if len(self.lengths) != len(session.inputs):
            raise IntegrityError(f"stream-end record of {ref} describes {len(self.lengths)} inputs; the session has {len(session.inputs)}")
