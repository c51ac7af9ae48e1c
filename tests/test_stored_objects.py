"""braid.format.stored: the one view of which objects hold a backup's data, used by every presence check by LIST."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from braid.adapters.local.store import LocalStore
from braid.engine.finalize import check_chunks_listed
from braid.errors import IntegrityError
from braid.format.checksum import stored_checksum
from braid.format.ids import BackupRef
from braid.format.keys import WrappedKey
from braid.format.layout import chunk_key
from braid.format.manifest import ChunkEntry, InputEntry, Manifest
from braid.format.stored import StoredObject, stored_objects


def manifest_of(ref: BackupRef, sizes: list[int]) -> Manifest:
    """Two inputs, the second's chunks listed first: the view is in chunk order whatever the manifest's order."""
    chunks = [ChunkEntry(i, i % 2, i * 100, 100, size, "crc64nvme:AAAAAAAAAAA=", bytes(32), "zstd") for i, size in enumerate(sizes)]
    inputs = tuple(InputEntry(n, f"/p{n}", 0, bytes(32), tuple(c for c in chunks if c.input_index == n)) for n in (1, 0))
    key = WrappedKey("local:test", b"blob")
    return Manifest("repo", str(ref), "2026-11-23T00:00:00Z", "2026-11-23T00:00:01Z", 100, key, inputs, {}, {}, "local")


def test_one_object_per_chunk_in_chunk_order() -> None:
    ref = BackupRef.new("db")
    found = stored_objects(manifest_of(ref, [30, 10, 20]))
    assert found == [StoredObject(chunk_key(ref, i), size, (i,), (("crc64nvme:AAAAAAAAAAA=", size),)) for i, size in enumerate([30, 10, 20])]
    assert all(s.checksum == "crc64nvme:AAAAAAAAAAA=" for s in found)  # a lone frame's checksum is its object's


def packs_of(ref: BackupRef, frames: list[bytes], sizes: list[int]) -> Manifest:
    chunks: list[ChunkEntry] = []
    index = 0
    for size in sizes:
        first, offset = index, 0
        for frame in frames[index : index + size]:
            chunks.append(ChunkEntry(index, 0, index * 100, 100, len(frame), stored_checksum(frame), bytes(32), "zstd", first, offset))
            offset += len(frame)
            index += 1
    inputs = (InputEntry(0, "/p0", 100 * len(chunks), bytes(32), tuple(chunks)),)
    return Manifest("repo", str(ref), "2026-11-23T00:00:00Z", "2026-11-23T00:00:01Z", 100, WrappedKey("local:test", b"blob"), inputs, {}, {}, "cloud")


FRAMES = [b"first frame", b"second, longer frame", b"3rd", b"fourth frame!", b"five"]


def test_a_pack_is_one_object_of_its_frames_with_their_combined_checksum() -> None:
    """Size = sum of the frames; checksum = the CRC64NVME of the frames end to end (what S3 returns from HEAD)."""
    ref = BackupRef.new("db")
    found = stored_objects(packs_of(ref, FRAMES, [4, 1]))
    assert [(s.key, s.size, s.chunks) for s in found] == [
        (chunk_key(ref, 0), sum(len(f) for f in FRAMES[:4]), (0, 1, 2, 3)),
        (chunk_key(ref, 4), len(FRAMES[4]), (4,)),
    ]
    assert found[0].checksum == stored_checksum(b"".join(FRAMES[:4])) and found[1].checksum == stored_checksum(FRAMES[4])
    assert found[0].label == "pack of chunks 0-3" and found[1].label == "chunk 4"


def test_a_pack_whose_frames_do_not_follow_each_other_is_refused() -> None:
    ref = BackupRef.new("db")
    good = packs_of(ref, FRAMES, [2, 3])
    entries = list(good.inputs[0].chunks)
    entries[1] = replace(entries[1], pack_offset=entries[1].pack_offset + 1)
    with pytest.raises(IntegrityError, match=r"chunk 1 starts at byte 12 of pack 0, expected 11"):
        replace(good, inputs=(replace(good.inputs[0], chunks=tuple(entries)),)).check_structure()
    entries = list(good.inputs[0].chunks)
    entries[3] = replace(entries[3], pack=0, pack_offset=0)
    with pytest.raises(IntegrityError, match=r"chunk 3 names pack 0, which does not end just before it"):
        replace(good, inputs=(replace(good.inputs[0], chunks=tuple(entries)),)).check_structure()


def test_finalize_catches_a_truncated_pack_by_its_listed_size(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    ref = BackupRef.new("db")
    manifest = packs_of(ref, FRAMES, [4, 1])
    store.put(chunk_key(ref, 0), b"".join(FRAMES[:4])[:-1])
    store.put(chunk_key(ref, 4), FRAMES[4])
    with pytest.raises(IntegrityError, match=r"pack of chunks 0-3 of backup .* is 46 bytes, manifest says 47 \(before publishing\)"):
        check_chunks_listed(store, ref, stored_objects(manifest), when="before publishing")


def test_finalize_checks_the_listing_against_the_view(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    ref = BackupRef.new("db")
    manifest = manifest_of(ref, [3, 4])
    store.put(chunk_key(ref, 0), b"abc")
    with pytest.raises(IntegrityError, match=r"chunk 1 of backup .* is missing from the repository \(data/db/.*/0000000001\) before publishing"):
        check_chunks_listed(store, ref, stored_objects(manifest), when="before publishing")
    store.put(chunk_key(ref, 1), b"abc")
    with pytest.raises(IntegrityError, match="chunk 1 of backup .* is 3 bytes, manifest says 4"):
        check_chunks_listed(store, ref, stored_objects(manifest), when="before publishing")
    store.put(chunk_key(ref, 1), b"abcd")
    check_chunks_listed(store, ref, stored_objects(manifest), when="before publishing")
