"""Which objects hold a published backup's data, and the size of each: one view for every reader.

Each chunk is its own object today (`data/NAME/ID/NNNNNNNNNN`,
braid.format.layout.chunk_key) of the chunk's `stored_length`. Whoever checks
presence by LIST (1,000 keys a request, never a HEAD per chunk: Finalize, the
cloud agent's check after publishing, a quick or fanned-out verify) compares
the listing with this view, so a format that puts several chunks into one
object (a pack) changes this one function, not each reader.
"""

from __future__ import annotations

from dataclasses import dataclass

from braid.format.ids import BackupRef
from braid.format.layout import chunk_key
from braid.format.manifest import Manifest


@dataclass(frozen=True)
class StoredObject:
    """One object of a backup's data: its repository key, its size, and the chunks (by index) it holds."""

    key: str
    size: int
    chunks: tuple[int, ...]


def stored_objects(manifest: Manifest) -> list[StoredObject]:
    """Every object the manifest's chunks live in, in chunk order, each with the size it must have."""
    ref = BackupRef.parse(manifest.backup)
    ordered = sorted(manifest.chunks(), key=lambda chunk: chunk.index)
    return [StoredObject(chunk_key(ref, chunk.index), chunk.stored_length, (chunk.index,)) for chunk in ordered]
