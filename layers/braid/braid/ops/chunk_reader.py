"""Reading a published backup's chunks back: fetch, authenticate, decode.

Restore and deep verify both read thousands of chunks on a thread pool; a
`ChunkReader` per thread keeps its codec and its stored-chunk buffer for the
whole backup, so no chunk pays for fresh 64 MiB allocations.

A chunk alone in its object (every chunk the local engine writes) is read
whole into that buffer; a chunk in a pack of several (the cloud worker's) is
read by a ranged read of its frame (braid.format.stored.frame_location).
"""

from __future__ import annotations

from braid.errors import IntegrityError, NotFoundError
from braid.format.buffers import WritableBuffer, grown
from braid.format.chunk import ChunkCodec, stored_size
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.layout import manifest_key
from braid.format.manifest import ChunkEntry, Manifest
from braid.format.stored import frame_location, whole_objects
from braid.ports.store import Buffer, ObjectStore, read_object


class ChunkReader:
    def __init__(self, store: ObjectStore, manifest: Manifest, key: DataKey) -> None:
        self.store = store
        self.ref = BackupRef.parse(manifest.backup)
        self.codec = ChunkCodec(key)
        self._bound = stored_size(manifest.backup, manifest.chunk_size)
        self._stored: WritableBuffer = bytearray()  # made at the first fetch, as large as that chunk
        self._whole = whole_objects(manifest)

    def fetch(self, entry: ChunkEntry) -> Buffer:
        """The stored chunk, as the repository holds it (valid until the next fetch).

        A missing chunk is corruption only while the backup still exists:
        prune and forget remove the manifest before any chunk, so a chunk
        gone together with its manifest means the backup was removed while
        this read it. The user needs to hear that (exit 8), not that the
        repository is corrupt.
        """
        key, start = frame_location(self.ref, entry)
        if entry.index not in self._whole:
            try:
                return self.store.get_range(key, start, entry.stored_length)
            except NotFoundError:
                raise self._missing(entry) from None
        if len(self._stored) < entry.stored_length:  # sized by the manifest: a compressed chunk is often half a chunk
            # Not populated: its pages fault in as the read fills them, while
            # this thread waits on the disk anyway.
            self._stored = grown(self._stored, entry.stored_length, self._bound, populate=False)
        try:
            return read_object(self.store, key, self._stored)
        except NotFoundError:
            raise self._missing(entry) from None

    def _missing(self, entry: ChunkEntry) -> Exception:
        if self.store.head(manifest_key(self.ref)) is None:
            return NotFoundError(
                f"backup {self.ref} was removed (pruned or forgotten) while it was being read: chunk {entry.index} and the manifest are gone"
            )
        where = "" if entry.index in self._whole else f" (its pack {frame_location(self.ref, entry)[0]} is gone)"
        return IntegrityError(f"chunk {entry.index} of backup {self.ref} is missing from the repository{where}")

    def decode(self, stored: Buffer, entry: ChunkEntry, out: WritableBuffer, scratch: WritableBuffer | None = None) -> memoryview:
        """The chunk's plaintext in `out`, returned only once every check passed (`scratch`: see ChunkCodec.decode)."""
        return self.codec.decode(
            stored,
            backup=str(self.ref),
            index=entry.index,
            input_index=entry.input_index,
            plaintext_length=entry.length,
            plaintext_mac=entry.mac,
            out=out,
            scratch=scratch,
        )

    def read(self, entry: ChunkEntry, out: WritableBuffer) -> memoryview:
        return self.decode(self.fetch(entry), entry, out)
