"""Manifest sealing: round trips, self-checksum, MAC, structural checks, and
a verifier written from docs/format.md alone (no braid code), as a reader in
another language would write it."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from dataclasses import replace

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from hypothesis import given, settings
from hypothesis import strategies as st

from braid.errors import IntegrityError
from braid.format.checksum import stored_checksum
from braid.format.keys import DataKey, WrappedKey
from braid.format.manifest import ChunkEntry, InputEntry, Manifest, canonical_json, open_manifest, seal_body

MATERIAL = bytes(range(32))
KEY = DataKey(MATERIAL)


def make_manifest(lengths: list[list[int]], chunk_size: int = 1000) -> Manifest:
    inputs = []
    index = 0
    for input_index, chunk_lengths in enumerate(lengths):
        chunks = []
        offset = 0
        for length in chunk_lengths:
            chunks.append(
                ChunkEntry(index, input_index, offset, length, length + 60, stored_checksum(b"%d" % index), KEY.chunk_mac(index, b"%d" % index), "zstd")
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


def verify_from_the_spec(raw: bytes, data_key: bytes) -> dict[str, object]:
    """docs/format.md, "Verifying a manifest", step by step, with no braid code."""
    match = re.fullmatch(rb'\{"mac":"([0-9a-f]{64})","manifest":(.*),"sha256":"([0-9a-f]{64})"\}', raw, re.DOTALL)
    assert match is not None
    mac_hex, body, digest = match.groups()
    assert hashlib.sha256(body + mac_hex).hexdigest().encode() == digest
    mac_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"braid/v1/manifest-mac").derive(data_key)
    assert hmac.compare_digest(hmac.digest(mac_key, body, "sha256").hex().encode(), mac_hex)
    doc: dict[str, object] = json.loads(body)
    return doc


def test_a_reader_in_another_language_verifies_from_the_spec_alone() -> None:
    manifest = make_manifest([[1000, 1000, 17], [5]])
    assert verify_from_the_spec(manifest.seal(KEY), MATERIAL) == json.loads(canonical_json(manifest.body()))


def test_the_mac_covers_the_body_bytes_as_stored_not_a_re_serialisation() -> None:
    # Another writer may lay BODY out differently (key order, whitespace,
    # escapes): what counts is the bytes it MACed, which Braid never rebuilds.
    body = json.dumps(make_manifest([[1000, 3]]).body(), indent=1, ensure_ascii=False).encode()
    raw = seal_body(body, KEY.manifest_mac(body))
    verify_from_the_spec(raw, MATERIAL)
    sealed = open_manifest(raw, "test")
    assert sealed.body == body
    assert sealed.authenticate(KEY) == make_manifest([[1000, 3]])
    respaced = raw.replace(b'"chunk_size": 1000', b'"chunk_size":1000')
    assert respaced != raw
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        open_manifest(respaced, "test")


def test_braid_seals_the_canonical_document() -> None:
    # Sorted keys put "mac" before "manifest" before "sha256": the sealed
    # layout is also the canonical JSON of the whole document.
    manifest = make_manifest([[1000, 1000, 17], [5]])
    raw = manifest.seal(KEY)
    doc = json.loads(raw)
    assert raw == canonical_json(doc) and doc["manifest"] == manifest.body()
    assert doc["mac"] == KEY.manifest_mac(canonical_json(manifest.body())).hex()


@pytest.mark.parametrize(
    "body",
    [b'{"a":1,"a":2}', b'{"a":NaN}', b'[1,2]', b'{"a":"\xff"}', b"{" * 100000 + b"}" * 100000],
    ids=["duplicate-key", "nan", "not-an-object", "not-utf8", "too-deep"],
)
def test_a_body_readers_could_disagree_on_is_refused(body: bytes) -> None:
    with pytest.raises(IntegrityError, match="not valid Braid manifest JSON"):
        open_manifest(seal_body(body, KEY.manifest_mac(body)), "test")


def test_only_braid_timestamps_and_checksums_are_sealed() -> None:
    manifest = make_manifest([[10]])
    with pytest.raises(IntegrityError, match="created '2026-11-23T01:02:03' is not a Braid timestamp"):
        replace(manifest, created="2026-11-23T01:02:03").seal(KEY)
    with pytest.raises(IntegrityError, match="completed '2026-11-23 01:02:04' is not a Braid timestamp"):
        replace(manifest, completed="2026-11-23 01:02:04").seal(KEY)
    bare = replace(manifest.inputs[0].chunks[0], checksum=manifest.inputs[0].chunks[0].checksum.partition(":")[2])
    with pytest.raises(IntegrityError, match="chunk 0 checksum .* is not crc64nvme:<base64>"):
        replace(manifest, inputs=(replace(manifest.inputs[0], chunks=(bare,)),)).seal(KEY)


def version_1_of(body: bytes) -> bytes:
    """A version-1 body: the version number, and chunk entries without the pack fields version 2 added."""
    doc = json.loads(body)
    doc["version"] = 1
    for entry in doc["inputs"]:
        for chunk in entry["chunks"]:
            del chunk["pack"], chunk["pack_offset"]
    return canonical_json(doc)


def test_a_version_1_manifest_is_refused_with_both_versions_named() -> None:
    """docs/format.md: no earlier repository is read; the refusal says which version this is and which Braid reads."""
    body = version_1_of(canonical_json(make_manifest([[10, 20]]).body()))
    raw = seal_body(body, KEY.manifest_mac(body))  # intact and authentic: refused for its version alone
    with pytest.raises(IntegrityError, match=r"^manifests/x: unsupported manifest format braid-manifest v1; this Braid reads braid-manifest v2 and v3 only"):
        open_manifest(raw, "manifests/x")


def test_a_version_2_chunk_entry_without_its_pack_is_malformed() -> None:
    doc = json.loads(canonical_json(make_manifest([[10]]).body()))
    del doc["inputs"][0]["chunks"][0]["pack_offset"]
    body = canonical_json(doc)
    with pytest.raises(IntegrityError, match=r"manifest is missing or has malformed fields \(manifest chunk entry is malformed: missing pack_offset\)"):
        open_manifest(seal_body(body, KEY.manifest_mac(body)), "manifests/x")


@pytest.mark.parametrize(
    "field,value",
    [("index", True), ("offset", "0"), ("length", 4.9), ("stored_length", -1), ("pack", None), ("mac", "zz"), ("checksum", 5)],
)
def test_a_chunk_entry_is_read_strictly_integers_are_json_integers(field: str, value: object) -> None:
    from braid.format.manifest import ChunkEntry

    good = {
        "index": 0, "offset": 0, "length": 4, "stored_length": 30, "checksum": "sha256:" + "0" * 64, "mac": "00" * 32,
        "compression": "zstd", "pack": 0, "pack_offset": 0,
    }  # fmt: skip
    assert ChunkEntry.from_json(good, 0).length == 4
    with pytest.raises(IntegrityError, match=f"manifest chunk entry is malformed: {field} must be"):
        ChunkEntry.from_json({**good, field: value}, 0)
