"""MultipartStore in memory, completing into any ObjectStore: the fake the conformance suite pins to S3.

It behaves as S3 does where the agent and the janitor depend on it (and
where moto does not: it checks every part's and the whole object's
CRC64NVME, and an upload it no longer knows is gone for every call), so
code tested against it holds on S3 too. tests/test_multipart_conformance.py
runs the same tests against it and against moto.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from braid.errors import StorageError
from braid.format.checksum import crc64nvme, encode_crc64nvme, tagged_checksum
from braid.ports.multipart import OpenUpload, SentPart, StoredPart, UploadGoneError, part_pieces
from braid.ports.store import Buffer, ObjectStore


@dataclass
class _Upload:
    key: str
    parts: dict[int, tuple[bytes, str]] = field(default_factory=dict)  # number -> (data, etag)


class MemoryMultipart:
    """Open uploads in a dict; a completed upload becomes an object in `store`."""

    def __init__(self, store: ObjectStore, *, min_part_size: int = 0) -> None:
        self.store = store
        self.min_part_size = min_part_size
        self._uploads: dict[str, _Upload] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.calls: list[str] = []  # operation names, in order (what a test counts)
        self.path: tuple[float, int] | None = None  # what path_sample answers: (RTT seconds, send buffer bytes)

    def _upload(self, upload_id: str, key: str) -> _Upload:
        upload = self._uploads.get(upload_id)
        if upload is None or upload.key != key:
            raise UploadGoneError(f"no upload {upload_id} of {key} (aborted or completed)")
        return upload

    def create_upload(self, key: str) -> str:
        with self._lock:
            self.calls.append("create")
            upload_id = f"upload-{next(self._ids):06d}"
            self._uploads[upload_id] = _Upload(key)
            return upload_id

    def upload_part(self, key: str, upload_id: str, number: int, data: Buffer | Sequence[Buffer], checksum: str) -> str:
        body = b"".join(bytes(piece) for piece in part_pieces(data))
        if not 1 <= number <= 10_000:
            raise StorageError(f"part number {number} of {key} is outside 1..10000")
        if encode_crc64nvme(crc64nvme(body)) != checksum:
            raise StorageError(f"checksum mismatch uploading part {number} of {key}: the bytes changed on the way; nothing was stored")
        etag = f'"{hashlib.md5(body, usedforsecurity=False).hexdigest()}"'
        with self._lock:
            self.calls.append("upload_part")
            self._upload(upload_id, key).parts[number] = (body, etag)
        return etag

    def complete_upload(self, key: str, upload_id: str, parts: Sequence[SentPart], checksum: str, size: int) -> str | None:
        with self._lock:
            self.calls.append("complete")
            upload = self._upload(upload_id, key)
            numbers = [p.number for p in parts]
            if numbers != sorted(set(numbers)):
                raise StorageError(f"parts of {key} must be listed once each, in ascending order")
            pieces = []
            for index, part in enumerate(parts):
                stored = upload.parts.get(part.number)
                if stored is None or stored[1] != part.etag or encode_crc64nvme(crc64nvme(stored[0])) != part.checksum:
                    raise StorageError(f"part {part.number} of {key} is not the part that was uploaded")
                if index < len(parts) - 1 and len(stored[0]) < self.min_part_size:
                    raise StorageError(f"part {part.number} of {key} is below the minimum part size")
                pieces.append(stored[0])
            whole = b"".join(pieces)
            if len(whole) != size or encode_crc64nvme(crc64nvme(whole)) != checksum:
                raise StorageError(f"checksum mismatch completing {key}: the parts do not make the object described")
            del self._uploads[upload_id]
        self.store.put(key, whole)
        return tagged_checksum(crc64nvme(whole))

    def list_uploads(self, prefix: str) -> Iterator[OpenUpload]:
        with self._lock:
            found = [OpenUpload(u.key, upload_id) for upload_id, u in self._uploads.items() if u.key.startswith(prefix)]
        yield from sorted(found, key=lambda u: u.key)  # by key, then by creation (stable)

    def list_parts(self, key: str, upload_id: str) -> Iterator[StoredPart]:
        with self._lock:
            upload = self._upload(upload_id, key)
            parts = [StoredPart(n, len(data), etag, encode_crc64nvme(crc64nvme(data))) for n, (data, etag) in sorted(upload.parts.items())]
        yield from parts

    def path_sample(self) -> tuple[float, int] | None:
        return self.path  # None unless a test gives the store a path (RTT seconds, send buffer bytes)

    def abort_upload(self, key: str, upload_id: str) -> None:
        with self._lock:
            self.calls.append("abort")
            upload = self._uploads.get(upload_id)
            if upload is not None and upload.key == key:
                del self._uploads[upload_id]

    def purge_versions(self, prefix: str, exact: bool = False) -> int:
        """No versions are kept: what is under `prefix` is its only version."""
        keys = [info.key for info in self.store.list(prefix) if not exact or info.key == prefix]
        self.store.delete(keys)
        return len(keys)
