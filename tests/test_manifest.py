"""Manifest sealing: round trips, self-checksum, MAC, and structural checks."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from braid.errors import IntegrityError
from braid.format.keys import DataKey, WrappedKey
from braid.format.manifest import ChunkEntry, InputEntry, Manifest, open_manifest

KEY = DataKey(bytes(range(32)))


def make_manifest(lengths: list[list[int]], chunk_size: int = 1000) -> Manifest:
    inputs = []
    index = 0
    for input_index, chunk_lengths in enumerate(lengths):
        chunks = []
        offset = 0
        for length in chunk_lengths:
            chunks.append(
                ChunkEntry(index, input_index, offset, length, length + 60, f"crc64nvme:{index}", KEY.chunk_mac(index, b"%d" % index), "zstd")
            )
            index += 1
            offset += length
        inputs.append(InputEntry(input_index, f"/pipe{input_index}", offset, KEY.input_mac(input_index, offset, [c.mac for c in chunks]), tuple(chunks)))
    return Manifest(
        repository="repo-1",
        backup="db@20261123T010203.000Z-0a1b2c3d",
        created="2026-11-23T01:02:03.000000Z",
        completed="2026-11-23T01:02:04.000000Z",
        chunk_size=chunk_size,
        key=WrappedKey("local:abc", b"wrapped", {"braid:backup": "db@20261123T010203.000Z-0a1b2c3d"}),
        inputs=tuple(inputs),
        algorithms={"compression": "zstd", "level": 3},
        timings={"total_seconds": 1.5},
        engine="local",
    )


lengths_strategy = st.lists(st.lists(st.integers(1, 1000), max_size=6).map(lambda xs: [1000] * (len(xs) - 1) + xs[-1:] if xs else []), min_size=1, max_size=4)


@settings(max_examples=50, deadline=None)
@given(lengths=lengths_strategy)
def test_seal_open_authenticate_round_trip(lengths: list[list[int]]) -> None:
    manifest = make_manifest(lengths)
    sealed = open_manifest(manifest.seal(KEY), "test")
    assert sealed.authenticate(KEY) == manifest
    assert manifest.plaintext_bytes == sum(sum(x) for x in lengths)


def test_every_flipped_byte_is_detected() -> None:
    raw = make_manifest([[1000, 1000, 17], [5]]).seal(KEY)
    for position in range(len(raw)):
        tampered = bytearray(raw)
        tampered[position] ^= 0x01
        with pytest.raises(IntegrityError):
            open_manifest(bytes(tampered), "test").authenticate(KEY)


def test_recomputed_checksum_without_key_fails_authentication() -> None:
    import hashlib
    import json

    from braid.format.manifest import canonical_json

    doc = json.loads(make_manifest([[1000, 3]]).seal(KEY))
    doc["manifest"]["inputs"][0]["chunks"][1]["stored_length"] += 1
    doc["sha256"] = hashlib.sha256(canonical_json(doc["manifest"]) + doc["mac"].encode()).hexdigest()
    sealed = open_manifest(canonical_json(doc), "test")
    with pytest.raises(IntegrityError, match="failed authentication"):
        sealed.authenticate(KEY)


def test_wrong_key_fails_authentication() -> None:
    sealed = open_manifest(make_manifest([[10]]).seal(KEY), "test")
    with pytest.raises(IntegrityError, match="failed authentication"):
        sealed.authenticate(DataKey(os.urandom(32)))


def test_structure_gaps_and_duplicates_are_refused() -> None:
    manifest = make_manifest([[1000, 1000, 5]])
    chunks = manifest.inputs[0].chunks
    gap = replace(manifest, inputs=(replace(manifest.inputs[0], chunks=(chunks[0], chunks[2])),))
    with pytest.raises(IntegrityError):
        gap.check_structure()
    swapped = replace(manifest, inputs=(replace(manifest.inputs[0], chunks=(chunks[1], chunks[0], chunks[2])),))
    with pytest.raises(IntegrityError, match="starts at"):
        swapped.check_structure()


def test_not_json_is_a_clear_error() -> None:
    with pytest.raises(IntegrityError, match="not valid Braid manifest JSON"):
        open_manifest(b"\x00garbage", "backup x")
