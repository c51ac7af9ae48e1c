"""The stored chunk format: round trips, every way of corrupting it fails
loudly, and the stored checksum's two spellings (docs/format.md, Checksums)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from braid.errors import IntegrityError, LimitError
from braid.format.checksum import (
    checksum_from_header,
    combine_crc64nvme,
    crc64nvme,
    decode_crc64nvme,
    encode_crc64nvme,
    is_tagged_checksum,
    s3_checksum_value,
    stored_checksum,
    tagged_checksum,
)
from braid.format.chunk import COMPRESSION_NONE, COMPRESSION_ZSTD, MAX_CHUNKS_PER_KEY, ChunkCodec, ChunkHeader
from braid.format.keys import DataKey

BACKUP = "db1@20261123T010203.000Z-0a1b2c3d"
KEY = DataKey(bytes(range(32)))


def decode(codec: ChunkCodec, stored: bytes, plaintext: bytes, index: int = 7, input_index: int = 1, backup: str = BACKUP) -> bytes:
    mac = KEY.chunk_mac(index, plaintext)
    return codec.decode(stored, backup=backup, index=index, input_index=input_index, plaintext_length=len(plaintext), plaintext_mac=mac)


@settings(max_examples=60, deadline=None)
@given(plaintext=st.binary(min_size=1, max_size=4096), index=st.integers(0, 2**32 - 1), input_index=st.integers(0, 65535))
def test_round_trip(plaintext: bytes, index: int, input_index: int) -> None:
    codec = ChunkCodec(KEY)
    encoded = codec.encode(BACKUP, index, input_index, plaintext)
    stored = bytes(encoded.stored)
    assert codec.decode(
        stored, backup=BACKUP, index=index, input_index=input_index, plaintext_length=len(plaintext), plaintext_mac=encoded.plaintext_mac
    ) == plaintext


def test_compressible_data_is_compressed_and_random_is_stored_raw() -> None:
    codec = ChunkCodec(KEY)
    text = b"page row " * 10000
    encoded = codec.encode(BACKUP, 0, 0, text)
    assert encoded.compression == COMPRESSION_ZSTD and encoded.stored_length < len(text) // 10
    noise = os.urandom(100000)
    encoded = codec.encode(BACKUP, 1, 0, noise)
    assert encoded.compression == COMPRESSION_NONE
    assert decode(codec, bytes(encoded.stored), noise, index=1, input_index=0) == noise


def test_nonce_is_fresh_per_encoding() -> None:
    codec = ChunkCodec(KEY)
    first = ChunkHeader.unpack(bytes(codec.encode(BACKUP, 0, 0, b"x" * 100).stored), "t")[0].nonce
    second = ChunkHeader.unpack(bytes(codec.encode(BACKUP, 0, 0, b"x" * 100).stored), "t")[0].nonce
    assert first != second and len(first) == 12


@pytest.fixture(scope="module")
def sample() -> tuple[bytes, bytes]:
    plaintext = b"some table data 12345 " * 50 + os.urandom(64)
    return plaintext, bytes(ChunkCodec(KEY).encode(BACKUP, 7, 1, plaintext).stored)


def test_every_flipped_byte_fails_and_names_the_chunk(sample: tuple[bytes, bytes]) -> None:
    plaintext, stored = sample
    codec = ChunkCodec(KEY)
    for position in range(len(stored)):
        tampered = bytearray(stored)
        tampered[position] ^= 0x01
        with pytest.raises(IntegrityError, match=f"chunk 7 of backup {BACKUP}"):
            decode(codec, bytes(tampered), plaintext)


def test_a_flipped_bit_past_magic_and_version_is_failed_authentication(sample: tuple[bytes, bytes]) -> None:
    """The header is believed only once authenticated: a damaged index is corruption, not a moved chunk."""
    plaintext, stored = sample
    codec = ChunkCodec(KEY)
    for position in range(5, len(stored)):  # past magic (0-3) and version (4)
        tampered = bytearray(stored)
        tampered[position] ^= 0x01
        with pytest.raises(IntegrityError, match=f"chunk 7 of backup {BACKUP}: failed authentication"):
            decode(codec, bytes(tampered), plaintext)


def test_every_bit_of_the_header_index_fails_authentication(sample: tuple[bytes, bytes]) -> None:
    plaintext, stored = sample
    for bit in range(32):  # chunk index: u32 at offset 8
        tampered = bytearray(stored)
        tampered[8 + bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(IntegrityError, match="failed authentication") as caught:
            decode(ChunkCodec(KEY), bytes(tampered), plaintext)
        assert "moved or swapped" not in str(caught.value)


def test_truncated_chunk_fails(sample: tuple[bytes, bytes]) -> None:
    plaintext, stored = sample
    for cut in (0, 10, 40, len(stored) - 1):
        with pytest.raises(IntegrityError, match="chunk 7"):
            decode(ChunkCodec(KEY), stored[:cut], plaintext)


def test_chunk_moved_to_another_index_or_backup_fails(sample: tuple[bytes, bytes]) -> None:
    plaintext, stored = sample
    with pytest.raises(IntegrityError, match="moved or swapped"):
        decode(ChunkCodec(KEY), stored, plaintext, index=8)
    with pytest.raises(IntegrityError, match="moved or swapped"):
        decode(ChunkCodec(KEY), stored, plaintext, backup="db1@20261123T010203.000Z-ffffffff")
    with pytest.raises(IntegrityError, match="moved or swapped"):
        decode(ChunkCodec(KEY), stored, plaintext, input_index=0)


def test_header_rewritten_to_claim_another_index_fails_authentication(sample: tuple[bytes, bytes]) -> None:
    plaintext, stored = sample
    header, start = ChunkHeader.unpack(stored, "t")
    forged = ChunkHeader(header.backup, 8, header.input_index, header.plaintext_length, header.compression, header.nonce).pack()
    with pytest.raises(IntegrityError, match="failed authentication"):
        decode(ChunkCodec(KEY), forged + stored[start:], plaintext, index=8)


def test_wrong_key_fails(sample: tuple[bytes, bytes]) -> None:
    plaintext, stored = sample
    other = DataKey(os.urandom(32))
    with pytest.raises(IntegrityError, match="failed authentication"):
        ChunkCodec(other).decode(stored, backup=BACKUP, index=7, input_index=1, plaintext_length=len(plaintext), plaintext_mac=b"\0" * 16)


def test_wrong_plaintext_checksum_fails(sample: tuple[bytes, bytes]) -> None:
    plaintext, stored = sample
    with pytest.raises(IntegrityError, match="plaintext checksum mismatch"):
        ChunkCodec(KEY).decode(stored, backup=BACKUP, index=7, input_index=1, plaintext_length=len(plaintext), plaintext_mac=b"\0" * 16)


def test_refuses_more_than_2_to_the_32_chunks_under_one_key() -> None:
    with pytest.raises(LimitError, match="2\\^32"):
        ChunkCodec(KEY).encode(BACKUP, MAX_CHUNKS_PER_KEY, 0, b"x")


def test_plaintext_mac_is_keyed_and_index_bound() -> None:
    data = b"same bytes"
    assert KEY.chunk_mac(1, data) != KEY.chunk_mac(2, data)
    assert KEY.chunk_mac(1, data) != DataKey(os.urandom(32)).chunk_mac(1, data)
    assert "fingerprint" in repr(KEY) and bytes(range(32)).hex() not in repr(KEY)


def test_stored_checksum_is_s3s_crc64nvme_in_both_spellings() -> None:
    # The CRC-64/NVME check value (the CRC of "123456789"), as S3 documents it.
    assert crc64nvme(b"123456789") == 0xAE8B14860A799888
    header = encode_crc64nvme(0xAE8B14860A799888)
    assert header == "rosUhgp5mIg=" and decode_crc64nvme(header) == 0xAE8B14860A799888
    assert stored_checksum(b"123456789") == tagged_checksum(0xAE8B14860A799888) == "crc64nvme:rosUhgp5mIg="
    assert s3_checksum_value("crc64nvme:rosUhgp5mIg=") == header and checksum_from_header(header) == "crc64nvme:rosUhgp5mIg="


def test_a_checksum_of_parts_combines_to_the_whole() -> None:
    first, second = os.urandom(1000), os.urandom(333)
    assert combine_crc64nvme(crc64nvme(first), crc64nvme(second), len(second)) == crc64nvme(first + second)
    assert crc64nvme(second, crc64nvme(first)) == crc64nvme(first + second)


def test_the_small_input_crc_in_python_is_awscrts() -> None:
    """Before awscrt loads, small inputs are done in Python (braid.format.checksum): the same values, chained or not."""
    from awscrt.checksums import crc64nvme as crt

    from braid.format.checksum import _small_crc64nvme

    assert _small_crc64nvme(b"123456789", 0) == 0xAE8B14860A799888
    for size in (0, 1, 7, 8, 255, 1000, 16 * 1024):
        data, previous = os.urandom(size), int.from_bytes(os.urandom(8), "big")
        assert _small_crc64nvme(data, 0) == crt(data, 0)
        assert _small_crc64nvme(memoryview(data), previous) == crt(data, previous)


def test_a_small_crc_loads_no_awscrt_a_large_one_does() -> None:
    """An empty cloud backup's few small objects (config, records) are checksummed without loading awscrt (~80 ms)."""
    code = (
        "import os, sys\n"
        "from braid.format.checksum import crc64nvme, _small_crc64nvme\n"
        "small = os.urandom(4096)\n"
        "assert crc64nvme(small) == _small_crc64nvme(small, 0)\n"
        "assert 'awscrt' not in sys.modules\n"
        "large = os.urandom(1 << 20)\n"
        "value = crc64nvme(large)\n"
        "assert 'awscrt.checksums' in sys.modules\n"
        "from awscrt.checksums import crc64nvme as crt\n"
        "assert value == crt(large) and crc64nvme(small) == crt(small)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("text", ["md5:rosUhgp5mIg=", "rosUhgp5mIg=", "crc64nvme:", "crc64nvme:rosUhgp5", "crc64nvme:rosUhgp5mIg=AA=="])
def test_only_a_tagged_crc64nvme_goes_to_s3(text: str) -> None:
    with pytest.raises(ValueError):
        s3_checksum_value(text)


def spelled_as_encoded(header: str) -> bool:
    """The header form's definition: base64 of 8 bytes that encodes back to exactly `header`."""
    try:
        raw = base64.b64decode(header, validate=True)
    except ValueError:
        return False
    return len(raw) == 8 and encode_crc64nvme(int.from_bytes(raw, "big")) == header


def test_a_header_form_checksum_is_accepted_exactly_when_it_is_the_spelling_encode_writes() -> None:
    """decode_crc64nvme and is_tagged_checksum match a pattern instead of decoding and encoding again: every
    one-character change of valid headers (each position, every character up to U+00FF, deleted or inserted
    too) is judged the same."""
    values = [0, 1, 0xFF, 2**64 - 1, 0xAE8B14860A799888, *(int.from_bytes(os.urandom(8), "big") for _ in range(20))]
    for value in values:
        header = encode_crc64nvme(value)
        assert decode_crc64nvme(header) == value
        variants = {header[:i] + header[i + 1 :] for i in range(len(header))} | {header + "\n", " " + header, header + "=", header[:-1]}
        for i in range(len(header) + 1):
            for c in map(chr, range(256)):
                variants |= {header[:i] + c + header[i + 1 :], header[:i] + c + header[i:]}
        for text in variants:
            assert is_tagged_checksum(f"crc64nvme:{text}") is spelled_as_encoded(text) and not is_tagged_checksum(f"md5:{text}")
            if spelled_as_encoded(text):
                assert encode_crc64nvme(decode_crc64nvme(text)) == text
            else:
                with pytest.raises(ValueError, match="is not a base64 CRC64NVME value"):
                    decode_crc64nvme(text)


def test_an_encoded_chunk_reports_the_checksum_of_its_stored_bytes() -> None:
    encoded = ChunkCodec(KEY).encode(BACKUP, 0, 0, b"rows" * 100)
    assert encoded.checksum == stored_checksum(bytes(encoded.stored))
