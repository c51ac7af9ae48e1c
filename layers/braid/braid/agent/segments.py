"""What the uploader knows of each input and segment, and the record a finished segment gets.

A segment is one multipart upload; its parts hold consecutive chunks as its
`PartLayout` says: `part_chunks` each (its last part may hold fewer), after
the session's `ramp_parts` single-chunk parts at the start of each input. Each chunk's CRC64NVME is
computed as its bytes are read for sending; a part's CRC, a segment's
full-object CRC are combined from them in order (CRCs combine without
re-reading the data), so the record (one checksum per chunk, which the
worker checks its ranged GET against), the checksums sent with UploadPart
and CompleteMultipartUpload, and the check of a segment completed before
an interruption all come from the chunks as they were read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from braid.errors import InputError, StorageError
from braid.format.checksum import combine_crc64nvme, encode_crc64nvme, tagged_checksum
from braid.format.staging import SegmentRecord
from braid.ports.multipart import MultipartStore, SentPart, StoredPart, UploadGoneError
from braid.ports.store import ObjectInfo, ObjectStore


@dataclass
class Part:
    """A part of the re-read stream: sent (etag), or found already stored; or one chunk of a part (no etag)."""

    etag: str | None
    crc: int
    size: int


Release = Callable[[], None]
Chunk = tuple[memoryview, Release]  # a chunk read and not yet sent: its bytes, and how to give its buffer back


@dataclass(frozen=True)
class PartLayout:
    """Which chunks of a segment go into which multipart part: `ramp` one-chunk parts, then `per_part` chunks each.

    Deterministic from the session record (part_chunks, ramp_parts), so a
    resumed upload regroups its re-read chunks into the same parts. The
    ramp applies to each input's first segment only: a short stream goes out
    as many parts at once (the pipe fills), a long one soon sends fewer,
    larger parts (fewer billed UploadParts) from the same buffers.
    """

    per_part: int
    ramp: int = 0

    def part_of(self, chunk: int) -> tuple[int, int]:
        """(part number, 1-based; chunks that part holds when full) of chunk `chunk` (0-based within the segment)."""
        if chunk < self.ramp:
            return chunk + 1, 1
        return self.ramp + (chunk - self.ramp) // self.per_part + 1, self.per_part

    def first_chunk(self, part: int) -> int:
        """The first chunk (0-based within the segment) of part `part` (1-based)."""
        if part <= self.ramp:
            return part - 1
        return self.ramp + (part - self.ramp - 1) * self.per_part

    def parts(self, chunks: int) -> int:
        """How many parts a segment of `chunks` chunks has."""
        ramped = min(chunks, self.ramp)
        return ramped + -(-(chunks - ramped) // self.per_part)


def combined_crc(pieces: list[Part]) -> int:
    """The CRC64NVME of the pieces laid end to end, from their own CRCs."""
    crc = pieces[0].crc
    for piece in pieces[1:]:
        crc = combine_crc64nvme(crc, piece.crc, piece.size)
    return crc


def _in_order(found: dict[int, Part], what: str, key: str) -> list[tuple[int, Part]]:
    numbers = sorted(found)
    if numbers != list(range(1, len(numbers) + 1)):
        raise AssertionError(f"segment {key} has {what} {numbers}")  # pragma: no cover
    return [(n, found[n]) for n in numbers]


@dataclass
class Segment:
    input_index: int
    number: int
    key: str  # repository-relative
    record: SegmentRecord | None = None  # completed and recorded before an interruption
    stored: ObjectInfo | None = None  # completed but not recorded (interrupted in between)
    upload_id: str | None = None
    existing: dict[int, StoredPart] = field(default_factory=dict)  # parts of its open upload
    parts: dict[int, Part] = field(default_factory=dict)  # by S3 part number (1-based)
    chunks: dict[int, Part] = field(default_factory=dict)  # by chunk number within the segment (1-based)
    pending: dict[int, list[Chunk]] = field(default_factory=dict)  # part number -> chunks read, not yet sent
    submitted: int = 0  # chunks
    expected: int | None = None  # chunks; known once the segment is full or its input ended
    completing: bool = False
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ordered_parts(self) -> list[tuple[int, Part]]:
        return _in_order(self.parts, "parts", self.key)

    def full_crc(self) -> int:
        return combined_crc([chunk for _, chunk in _in_order(self.chunks, "chunks", self.key)])

    def sent_parts(self) -> list[SentPart]:
        return [SentPart(n, part.etag or "", encode_crc64nvme(part.crc)) for n, part in self.ordered_parts()]

    def record_of(self, chunk_size: int, segment_chunks: int) -> SegmentRecord:
        """The record of this segment as read now (per chunk): what the pipeline and a later resume trust."""
        chunks = [chunk for _, chunk in _in_order(self.chunks, "chunks", self.key)]
        return SegmentRecord(
            input_index=self.input_index,
            segment=self.number,
            key=self.key,
            offset=self.number * segment_chunks * chunk_size,
            length=sum(c.size for c in chunks),
            chunks=len(chunks),
            checksum=tagged_checksum(combined_crc(chunks)),
            chunk_checksums=[encode_crc64nvme(c.crc) for c in chunks],
        )

    def check_same_stream(self, built: SegmentRecord, input_label: str) -> None:
        """A segment completed before an interruption must hold exactly the re-read bytes."""
        if self.record is not None:
            before = self.record
            same = (before.length, before.chunks, before.checksum, before.offset, before.chunk_checksums) == (
                built.length, built.chunks, built.checksum, built.offset, built.chunk_checksums
            )
        elif self.stored is not None:
            same = (self.stored.size, self.stored.checksum or built.checksum) == (built.length, built.checksum)
        else:
            return
        if not same:
            raise InputError(
                f"input {input_label} is not the stream that was uploaded before the interruption "
                f"(segment {self.number} differs); --resume needs the same bytes: start a new backup instead"
            )


@dataclass
class InputState:
    next_number: int = 0
    length: int = 0
    short_seen: bool = False
    ended: bool = False
    segments: dict[int, Segment] = field(default_factory=dict)

    def check_next(self, input_index: int, number: int, size: int, chunk_size: int) -> None:
        """The reader's contract: chunks in order, all full but the last, none after the end."""
        if self.ended or self.short_seen:
            raise ValueError(f"chunk {number} of input {input_index} after its end")
        if number != self.next_number:
            raise ValueError(f"chunk {number} of input {input_index} out of order, expected {self.next_number}")
        if not 0 < size <= chunk_size:
            raise ValueError(f"chunk {number} of input {input_index} is {size} bytes; chunks are 1..{chunk_size}")


def complete_segment_upload(uploads: MultipartStore, store: ObjectStore, segment: Segment, built: SegmentRecord) -> None:
    """Complete a segment's multipart upload and check the store kept exactly the bytes read.

    The full-object CRC64NVME sent with the completion is combined from the
    parts as they were read; the store's own value must equal it, whether it
    comes back with the completion or (a retried completion that finds the
    upload already gone) from a HEAD of the object.
    """
    where = f"segment {segment.key} in {store.url}"
    assert segment.upload_id is not None
    try:
        stored = uploads.complete_upload(segment.key, segment.upload_id, segment.sent_parts(), encode_crc64nvme(segment.full_crc()), built.length)
    except UploadGoneError:
        # A retried Complete whose first attempt succeeded finds no upload:
        # the object is there, and HEAD below tells whether it is ours.
        stored = None
    if stored is None:
        info = store.head(segment.key)
        if info is None:
            # Neither the upload nor the object: something removed the backup's staging under the agent (the
            # pipeline gave the backup up, and Cleanup aborted and deleted it), which the caller reports with
            # the pipeline's own cause (braid.agent.cloud_engine).
            raise UploadGoneError(f"{where} is gone: its upload or object was removed while the agent completed it")
        if info.size != built.length:
            raise StorageError(f"{where} holds {info.size} bytes, {built.length} were uploaded; run --resume")
        stored = info.checksum or built.checksum  # a store that keeps no checksum: nothing more to compare
    if stored != built.checksum:
        raise StorageError(
            f"{where} was stored with checksum {stored}, the uploaded bytes have {built.checksum}; the data changed on the way: start a new backup"
        )
