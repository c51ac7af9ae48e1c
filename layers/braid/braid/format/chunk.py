"""The stored chunk: a self-describing, authenticated, compressed record.

Layout (big-endian), see docs/format.md:

    magic "BRDC" | version u8 | compression u8 | cipher u8 | flags u8
    | chunk index u32 | input index u16 | reserved u16 | plaintext length u64
    | nonce 12 bytes | backup id length u8 | backup id (UTF-8)
    | AES-256-GCM ciphertext of the (possibly zstd-compressed) payload | tag 16

The whole header is GCM associated data, so a chunk copied to another index,
input or backup fails to authenticate, and so does any flipped header byte.
A chunk whose zstd frame would not be smaller than its plaintext is stored
uncompressed (compression id 0): random or already-compressed data costs no
decompression on restore.

`ChunkCodec` is not thread-safe (zstd contexts and the reusable output buffer
are per instance); the engines keep one per worker thread.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from braid.errors import IntegrityError, LimitError
from braid.format.buffers import WritableBuffer, grown, new_buffer
from braid.format.checksum import stored_checksum
from braid.format.keys import MAX_CHUNKS_PER_KEY as MAX_CHUNKS_PER_KEY  # defined with the key; the codec's readers look here
from braid.format.keys import DataKey

MAGIC = b"BRDC"
FORMAT_VERSION = 1
COMPRESSION_NONE = 0
COMPRESSION_ZSTD = 1
CIPHER_AES_256_GCM = 1
NONCE_BYTES = 12
TAG_BYTES = 16
_FIXED = struct.Struct(">4sBBBBIHHQ12sB")

Buffer = bytes | bytearray | memoryview


def compression_name(compression_id: int) -> str:
    """The manifest's name for a chunk header's compression id."""
    return "zstd" if compression_id == COMPRESSION_ZSTD else "none"


@dataclass(frozen=True)
class ChunkHeader:
    backup: str
    index: int
    input_index: int
    plaintext_length: int
    compression: int
    nonce: bytes
    cipher: int = CIPHER_AES_256_GCM
    version: int = FORMAT_VERSION

    def pack(self) -> bytes:
        name = self.backup.encode()
        if len(name) > 255:
            raise ValueError("backup id too long for a chunk header")
        return (
            _FIXED.pack(
                MAGIC,
                self.version,
                self.compression,
                self.cipher,
                0,
                self.index,
                self.input_index,
                0,
                self.plaintext_length,
                self.nonce,
                len(name),
            )
            + name
        )

    @classmethod
    def unpack(cls, stored: Buffer, where: str) -> tuple[ChunkHeader, int]:
        """The header and where the ciphertext starts; every field checked to be one this Braid writes."""
        header, start = cls.frame(stored, where)
        header.check_fields(where)
        return header, start

    @classmethod
    def frame(cls, stored: Buffer, where: str) -> tuple[ChunkHeader, int]:
        """The header as stored, checked only as far as needed to find the ciphertext.

        Nothing here is authenticated yet: decode reads the fields through this,
        authenticates, and only then believes them (a flipped index bit must be
        reported as corruption, not as a chunk that belongs elsewhere).
        """
        if len(stored) < _FIXED.size + TAG_BYTES:
            raise IntegrityError(f"{where}: stored chunk is truncated ({len(stored)} bytes)")
        magic, version, compression, cipher, _flags, index, input_index, _r, length, nonce, name_len = _FIXED.unpack_from(
            stored
        )
        if magic != MAGIC:
            raise IntegrityError(f"{where}: not a Braid chunk (bad magic)")
        if version != FORMAT_VERSION:
            raise IntegrityError(f"{where}: chunk format version {version} is not supported by this Braid")
        end = _FIXED.size + name_len
        if len(stored) < end + TAG_BYTES:
            raise IntegrityError(f"{where}: stored chunk is truncated ({len(stored)} bytes)")
        # surrogateescape: an undecodable id survives to check_fields, after authentication.
        backup = bytes(stored[_FIXED.size : end]).decode(errors="surrogateescape")
        return cls(backup, index, input_index, length, compression, bytes(nonce), cipher, version), end

    def check_fields(self, where: str) -> None:
        """Refuse algorithm ids and a backup id this Braid never writes."""
        if self.cipher != CIPHER_AES_256_GCM or self.compression not in (COMPRESSION_NONE, COMPRESSION_ZSTD):
            raise IntegrityError(f"{where}: unknown algorithm ids (cipher {self.cipher}, compression {self.compression})")
        try:
            self.backup.encode()
        except UnicodeEncodeError:
            raise IntegrityError(f"{where}: header backup id is not UTF-8") from None


@dataclass(frozen=True)
class EncodedChunk:
    """What a worker reports about a chunk it stored."""

    stored: memoryview  # valid until the codec's next encode or decode (or the reuse of encode's `spent`)
    plaintext_mac: bytes
    compression: int

    @property
    def stored_length(self) -> int:
        return len(self.stored)

    @property
    def checksum(self) -> str:
        return stored_checksum(self.stored)


class ChunkCodec:
    """Encodes and decodes stored chunks under one backup's data key.

    Every large buffer is reused from chunk to chunk: a fresh 64 MiB buffer
    per chunk costs more in page faults than AES-GCM itself (measured), so
    zstd streams into and out of codec-owned buffers rather than returning
    new bytes. They are mapped, not zero-filled (braid.format.buffers).
    """

    def __init__(self, key: DataKey, level: int = 3) -> None:
        self._key = key
        self._aead = AESGCM(key.encryption_key)
        self._level = level
        self._compressor = zstandard.ZstdCompressor(level=level)
        self._decompressor = zstandard.ZstdDecompressor()
        self._stored: WritableBuffer = bytearray()  # encode's output: header + ciphertext + tag
        self._payload: WritableBuffer = bytearray()  # the zstd frame, on either side of AES-GCM

    @property
    def level(self) -> int:
        return self._level

    def _payload_buffer(self, size: int, bound: int) -> memoryview:
        if len(self._payload) < size:
            self._payload = grown(self._payload, size, bound)
        return memoryview(self._payload)[:size]

    def _compress(self, plaintext: Buffer) -> memoryview | None:
        """The zstd frame, or None when it would not be smaller than the plaintext."""
        limit = len(plaintext)
        target = self._payload_buffer(limit, limit)
        filled = 0
        with self._compressor.stream_reader(plaintext, size=limit) as reader:
            while filled < limit:
                n = reader.readinto(target[filled:])
                if not n:
                    return target[:filled]
                filled += n
            return target[:filled] if not reader.read(1) and filled < limit else None

    def encode(
        self, backup: str, index: int, input_index: int, plaintext: Buffer, *, spent: WritableBuffer | None = None
    ) -> EncodedChunk:
        """Compress, encrypt and frame one chunk; `stored` is valid until the next encode or decode.

        `spent`: a buffer the caller no longer needs once the plaintext was
        compressed, usually the one the plaintext is in. The stored chunk is
        written there when it fits (the plaintext is then overwritten): a
        buffer of the codec's own is the first chunk's worth of fresh pages
        per worker that a backup need not pay for (measured). The stored
        chunk is then valid as long as `spent` is not reused.
        """
        if index >= MAX_CHUNKS_PER_KEY:
            raise LimitError(f"backup {backup} would exceed 2^32 chunks under one data key; use a larger --chunk-size")
        mac = self._key.chunk_mac(index, plaintext)
        compressed = self._compress(plaintext) if len(plaintext) else None
        payload: Buffer = compressed if compressed is not None else plaintext
        compression = COMPRESSION_ZSTD if compressed is not None else COMPRESSION_NONE
        nonce = os.urandom(NONCE_BYTES)
        header = ChunkHeader(backup, index, input_index, len(plaintext), compression, nonce).pack()
        total = len(header) + len(payload) + TAG_BYTES
        if compressed is not None and spent is not None and len(spent) >= total:
            out = memoryview(spent)[:total]  # the plaintext was read for the last time by zstd
        else:
            if len(self._stored) < total:
                self._stored = grown(self._stored, total, len(header) + len(plaintext) + TAG_BYTES)
            out = memoryview(self._stored)[:total]
        out[: len(header)] = header
        self._aead.encrypt_into(nonce, payload, header, out[len(header) :])
        return EncodedChunk(out, mac, compression)

    def decode(
        self,
        stored: Buffer,
        *,
        backup: str,
        index: int,
        input_index: int,
        plaintext_length: int,
        plaintext_mac: bytes,
        out: WritableBuffer | None = None,
        scratch: WritableBuffer | None = None,
    ) -> memoryview:
        """Authenticate, decrypt, decompress and check one chunk, or raise.

        The header is believed only once it authenticated (it is the GCM
        associated data, as stored): a flipped bit anywhere past the magic and
        version is "failed authentication", and "moved or swapped" is said
        only of an intact chunk that names another index, input or backup.

        The plaintext lands in `out` (a new buffer if None or too small)
        and a view of it is returned only when every check passed, so callers
        may write it straight to the restore target. `scratch`, if large
        enough, holds the decrypted zstd frame instead of a buffer of the
        codec's own (a caller may have made it ahead, off its critical path).
        """
        where = f"chunk {index} of backup {backup}"
        header, start = ChunkHeader.frame(stored, where)
        if out is None or len(out) < plaintext_length:
            out = new_buffer(plaintext_length)  # never resize the caller's: its old views may be alive
        plaintext = memoryview(out)[:plaintext_length]
        payload_length = len(stored) - start - TAG_BYTES
        # Decrypt straight into the output when the header says the payload is the plaintext.
        direct = header.compression == COMPRESSION_NONE and payload_length == plaintext_length
        if direct:
            payload = plaintext
        elif scratch is not None and len(scratch) >= payload_length:
            payload = memoryview(scratch)[:payload_length]
        else:
            payload = self._payload_buffer(payload_length, plaintext_length)
        try:
            self._aead.decrypt_into(header.nonce, memoryview(stored)[start:], memoryview(stored)[:start], payload)
        except InvalidTag:
            raise IntegrityError(
                f"{where}: failed authentication (corrupt, tampered, or a different key); check the backup with"
                f" 'braid verify --deep {backup}', and restore an older one (braid list --name {backup.partition('@')[0]})"
            ) from None
        # The header authenticated: from here on its fields are what the writer meant.
        header.check_fields(where)
        if header.backup != backup or header.index != index or header.input_index != input_index:
            raise IntegrityError(
                f"{where}: stored chunk belongs to {header.backup} chunk {header.index} (input {header.input_index});"
                " chunks were moved or swapped"
            )
        if header.plaintext_length != plaintext_length:
            raise IntegrityError(f"{where}: header length {header.plaintext_length} does not match the manifest ({plaintext_length})")
        if header.compression == COMPRESSION_ZSTD:
            self._decompress(payload, plaintext, where)
        elif not direct:
            raise IntegrityError(f"{where}: stored payload is {payload_length} bytes, manifest says {plaintext_length}")
        if not self._key.chunk_mac_matches(index, plaintext, plaintext_mac):
            raise IntegrityError(f"{where}: plaintext checksum mismatch")
        return plaintext

    def _decompress(self, payload: memoryview, target: memoryview, where: str) -> None:
        filled = 0
        try:
            with self._decompressor.stream_reader(payload) as reader:
                while filled < len(target):
                    n = reader.readinto(target[filled:])
                    if not n:
                        break
                    filled += n
                extra = reader.read(1)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"{where}: zstd frame does not decode ({exc})") from None
        if filled != len(target) or extra:
            raise IntegrityError(f"{where}: decodes to {'more' if extra else filled} bytes, manifest says {len(target)}")

    def peek_header(self, stored: Buffer, where: str) -> ChunkHeader:
        return ChunkHeader.unpack(stored, where)[0]


def header_size(backup: str) -> int:
    return _FIXED.size + len(backup.encode())


def stored_size(backup: str, payload_length: int) -> int:
    return header_size(backup) + payload_length + TAG_BYTES
