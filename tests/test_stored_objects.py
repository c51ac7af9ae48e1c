"""braid.format.stored: the one view of which objects hold a backup's data, used by every presence check by LIST."""

from __future__ import annotations

from pathlib import Path

import pytest

from braid.adapters.local.store import LocalStore
from braid.engine.finalize import check_chunks_listed
from braid.errors import IntegrityError
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
    assert found == [StoredObject(chunk_key(ref, i), size, (i,)) for i, size in enumerate([30, 10, 20])]


def test_finalize_checks_the_listing_against_the_view(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    ref = BackupRef.new("db")
    manifest = manifest_of(ref, [3, 4])
    store.put(chunk_key(ref, 0), b"abc")
    with pytest.raises(IntegrityError, match=r"chunk 1 of backup .* is missing from the repository \(data/db/.*/0000000001\) before publishing"):
        check_chunks_listed(store, ref, manifest, when="before publishing")
    store.put(chunk_key(ref, 1), b"abc")
    with pytest.raises(IntegrityError, match="chunk 1 of backup .* is 3 bytes, manifest says 4"):
        check_chunks_listed(store, ref, manifest, when="before publishing")
    store.put(chunk_key(ref, 1), b"abcd")
    check_chunks_listed(store, ref, manifest, when="before publishing")
