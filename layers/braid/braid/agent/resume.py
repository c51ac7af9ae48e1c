"""--resume: what the staging area already holds of an interrupted upload.

Everything needed lives in the store: the session record, the records of
completed segments, segment objects completed just before an interruption
(no record yet), and the parts of open multipart uploads. A resumed agent
re-reads its inputs from the start (the database tool restarts its stream),
checks each re-read part (the session's `part_chunks` chunks) against what
is stored (size and CRC64NVME), and uploads only the parts that are missing
or differ.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

from braid.agent.segments import Segment
from braid.errors import IntegrityError, NotFoundError, StorageError
from braid.format.checksum import encode_crc64nvme
from braid.format.staging import SessionRecord, StagingArea, StreamEnd, parse_segment_key
from braid.ports.multipart import MultipartStore, StoredPart
from braid.ports.store import ObjectInfo

_MD5 = re.compile(r"[0-9a-f]{32}")


def part_matches(part: StoredPart, data: memoryview | list[memoryview], crc: int) -> bool:
    """Is this stored part exactly the re-read chunk, or chunks (a list, in order; `crc` is of them all)?

    S3 reports each part's CRC64NVME when the upload was created with it.
    Without it (older S3-compatible stores, emulators) a plain-MD5 ETag
    still identifies the bytes; an ETag that is not an MD5 (SSE-KMS) and
    no checksum means we cannot tell, so the part is sent again.
    """
    pieces = data if isinstance(data, list) else [data]
    if part.size != sum(len(piece) for piece in pieces):
        return False
    if part.checksum is not None:
        return part.checksum == encode_crc64nvme(crc)
    etag = part.etag.strip('"')
    if _MD5.fullmatch(etag):
        md5 = hashlib.md5(usedforsecurity=False)
        for piece in pieces:
            md5.update(piece)
        return md5.hexdigest() == etag
    return False


def session_to_resume(area: StagingArea) -> SessionRecord:
    """The staged session, or why there is nothing to resume (in the agent's words)."""
    try:
        return area.read_session()
    except NotFoundError:
        raise NotFoundError(f"no staging session for {area.ref} in {area.store.url}: nothing to resume; start a new backup") from None
    except IntegrityError as exc:
        raise IntegrityError(f"staging session of {area.ref} in {area.store.url} is damaged ({exc}); start a new backup") from None


def load_staged(area: StagingArea, uploads: MultipartStore, session: SessionRecord, segment_of: Callable[[int, int], Segment]) -> StreamEnd | None:
    """Mark every segment with what the store holds of it; returns the stream end if the upload had finished.

    Raises NotFoundError if the pipeline began removing the staging while this read it.

    Of several open uploads of one segment the one with the most parts is
    continued; the others, and any upload of a segment already completed,
    are aborted: they are ours, under our staging prefix, and only cost.
    """
    inputs = len(session.inputs)
    for record in area.read_segment_records(session):
        segment_of(record.input_index, record.segment).record = record
    # A segment completed just before the interruption may lack its record.
    for input_index, number, info in area.segment_objects():
        if input_index < inputs:
            segment = segment_of(input_index, number)
            if segment.record is None:
                segment.stored = _stored_with_checksum(area, info)
    end = area.read_stream_end()

    found: dict[tuple[int, int], list[str]] = {}
    for upload in uploads.list_uploads(area.prefix):
        parsed = parse_segment_key(area.ref, upload.key)
        if parsed is not None and parsed[0] < inputs:
            found.setdefault(parsed, []).append(upload.upload_id)
    for (input_index, number), upload_ids in sorted(found.items()):
        segment = segment_of(input_index, number)
        candidates = [(upload_id, {p.number: p for p in uploads.list_parts(segment.key, upload_id)}) for upload_id in upload_ids]
        keep: str | None = None
        if segment.record is None and segment.stored is None:
            keep, segment.existing = max(candidates, key=lambda c: len(c[1]))
            segment.upload_id = keep
        for upload_id, _parts in candidates:
            if upload_id != keep:
                uploads.abort_upload(segment.key, upload_id)
    # Finalize or Cleanup removes the session first (StagingArea.remove): still there now, every
    # read above saw staging before its removal began; gone, the pipeline is past the upload.
    area.read_session()
    return end


def _stored_with_checksum(area: StagingArea, info: ObjectInfo) -> ObjectInfo | None:
    """An unrecorded segment object, if the store tells its checksum; else it is uploaded again.

    Without the checksum we could not tell whether it holds the re-read
    bytes; no record points at it, so replacing it is safe. (HEAD's
    checksum needs kms:Decrypt on SSE-KMS objects, which the agent may lack.)
    """
    try:
        stored = area.store.head(info.key)
    except StorageError:
        return None
    return stored if stored is not None and stored.checksum is not None else None
