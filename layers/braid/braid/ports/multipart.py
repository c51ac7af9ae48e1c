"""Port: the multipart uploads (and old versions) of the store a cloud repository lives in.

ObjectStore writes whole objects; staging a stream needs more of S3: an
object built from up to 10,000 parts sent in parallel and checked part by
part (the agent's segments), the uploads still open after an interruption
(what --resume continues), and removing what a backup leaves behind: open
uploads, whose parts S3 keeps and bills until aborted, and the old versions
a versioned bucket keeps of deleted objects. Staging is raw database bytes,
so all of it must be removable for "no plaintext stays in staging" to hold.

Kept this small so the agent and the janitor run against an in-memory fake
(tests/support/memory_multipart.py), moto or S3 alike, and one conformance
suite (tests/test_multipart_conformance.py) pins down what they share.
Keys are repository-relative, as in ObjectStore.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from braid.errors import StorageError
from braid.ports.store import Buffer


@dataclass(frozen=True)
class OpenUpload:
    """A multipart upload that was created and neither completed nor aborted."""

    key: str
    upload_id: str


@dataclass(frozen=True)
class StoredPart:
    """A part the store holds for an open upload (what an interrupted agent had sent)."""

    number: int  # 1-based
    size: int
    etag: str
    checksum: str | None  # CRC64NVME in header form (base64), when the store reports it


@dataclass(frozen=True)
class SentPart:
    """A part as CompleteMultipartUpload names it."""

    number: int
    etag: str
    checksum: str  # CRC64NVME, header form


class UploadGoneError(StorageError):
    """The store no longer knows the upload: aborted (cleanup, lifecycle) or already completed."""


def part_pieces(data: Buffer | Sequence[Buffer]) -> list[Buffer]:
    """The buffers `upload_part` was given, in order (one, or the list or tuple of several)."""
    if isinstance(data, (list, tuple)):
        return list(data)
    return [data]  # type: ignore[list-item]


class MultipartStore(Protocol):
    def create_upload(self, key: str) -> str:
        """Open an upload whose parts and whole carry CRC64NVME (full object); returns its id."""
        ...

    def upload_part(self, key: str, upload_id: str, number: int, data: Buffer | Sequence[Buffer], checksum: str) -> str:
        """Store part `number` (1-based) with its CRC64NVME (header form), which the store
        verifies; returns the part's ETag. `data` is the part's bytes: one buffer, or
        (a part of several chunks) a list or tuple of buffers that follow each other,
        sent without being joined. UploadGoneError if the upload is gone;
        StorageError if the store says it kept other bytes."""
        ...

    def complete_upload(self, key: str, upload_id: str, parts: Sequence[SentPart], checksum: str, size: int) -> str | None:
        """Join the parts into the object at `key`, checked against its full-object
        CRC64NVME (header form) and size. Returns the checksum the store computed, tagged
        ("crc64nvme:..."), or None when it did not say (read it with HEAD).
        UploadGoneError if the store no longer knows the upload, which is also how a
        retried call whose first attempt completed it ends."""
        ...

    def list_uploads(self, prefix: str) -> Iterator[OpenUpload]:
        """Open uploads whose key starts with `prefix`."""
        ...

    def list_parts(self, key: str, upload_id: str) -> Iterator[StoredPart]:
        """The parts of an open upload, by number; UploadGoneError if it is gone."""
        ...

    def abort_upload(self, key: str, upload_id: str) -> None:
        """Drop an open upload and its parts; one already gone is not an error."""
        ...

    def path_sample(self) -> tuple[float, int] | None:
        """(RTT in seconds, the most bytes one TCP connection's send buffer may hold) on the way to the store, from a
        connection already made; None when either is not known (a store not reached over TCP, or no TCP_INFO)."""
        ...

    def purge_versions(self, prefix: str, exact: bool = False) -> int:
        """Delete every version and delete marker under `prefix` (`exact`: of the object
        named `prefix` only), current objects included; returns how many. A store that
        keeps no versions deletes the objects."""
        ...
