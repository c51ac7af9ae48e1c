"""Which objects hold a published backup's data, and where each chunk's frame is: one view for every reader.

Chunks are stored in *packs* (docs/format.md, Packs): one object holding the
encoded frames of consecutive chunks back to back, keyed by its first chunk's
key (braid.format.layout.chunk_key), so the data prefix, prune's key-range
slices and leftovers see the same keys as before. A pack of one chunk is
exactly that chunk's frame; the local engine writes only those.

Whoever checks presence by LIST (1,000 keys a request, never a HEAD per
chunk: Finalize, the cloud agent's check after publishing, a quick or
fanned-out verify) compares the listing with `stored_objects`; whoever reads
a chunk reads its frame at `frame_location` (a ranged read of the pack).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter

from braid.format.checksum import combine_crc64nvme, parse_tagged_checksum, tagged_checksum
from braid.format.ids import BackupRef
from braid.format.layout import chunk_key
from braid.format.manifest import ChunkEntry, Manifest


@dataclass(frozen=True)
class StoredObject:
    """One object of a backup's data: its repository key, its size, and the chunks (by index) it holds."""

    key: str
    size: int
    chunks: tuple[int, ...]
    frames: tuple[tuple[str, int], ...]  # each frame's (tagged checksum, length), in order

    @property
    def checksum(self) -> str:
        """The whole object's CRC64NVME, tagged form: what S3 returns from HEAD.

        Combined only when asked for, and only for a pack of several frames:
        combining loads awscrt (~50 ms), which restore never needs
        (tests/test_startup.py), and a lone frame's checksum is the object's.
        """
        if len(self.frames) == 1:
            return self.frames[0][0]
        return pack_checksum(self.frames)

    @property
    def label(self) -> str:
        """How a message names it: the chunk, or the pack and its chunks."""
        if len(self.chunks) == 1:
            return f"chunk {self.chunks[0]}"
        return f"pack of chunks {self.chunks[0]}-{self.chunks[-1]}"


def pack_checksum(frame_checksums: Iterable[tuple[str, int]]) -> str:
    """The CRC64NVME of frames laid end to end, from each frame's (tagged checksum, length)."""
    value = 0
    for checksum, length in frame_checksums:
        value = combine_crc64nvme(value, parse_tagged_checksum(checksum), length)
    return tagged_checksum(value)


def group_packs(entries: Iterable[ChunkEntry]) -> list[list[ChunkEntry]]:
    """The given chunks grouped by pack, each group in frame order, groups in chunk order."""
    packs: dict[int, list[ChunkEntry]] = {}
    for entry in sorted(entries, key=attrgetter("index")):
        packs.setdefault(entry.pack, []).append(entry)
    return list(packs.values())


def stored_object(ref: BackupRef, frames: list[ChunkEntry]) -> StoredObject:
    """The object holding exactly these frames (one whole pack, in frame order)."""
    return StoredObject(
        chunk_key(ref, frames[0].pack),
        sum([f.stored_length for f in frames]),
        tuple([f.index for f in frames]),
        tuple([(f.checksum, f.stored_length) for f in frames]),
    )


def stored_objects(manifest: Manifest) -> list[StoredObject]:
    """Every object the manifest's chunks live in, in chunk order, each with the size and checksum it must have."""
    ref = BackupRef.parse(manifest.backup)
    return [stored_object(ref, frames) for frames in group_packs(manifest.chunks())]


def frame_location(ref: BackupRef, entry: ChunkEntry) -> tuple[str, int]:
    """The key of the object holding the chunk's frame and the frame's first byte in it."""
    return chunk_key(ref, entry.pack), entry.pack_offset


def whole_objects(manifest: Manifest) -> frozenset[int]:
    """Indexes of chunks that are alone in their object: readable whole (reused buffers, prefetch) rather than by range."""
    return frozenset(s.chunks[0] for s in stored_objects(manifest) if len(s.chunks) == 1)
