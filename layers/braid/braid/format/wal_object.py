"""An archived WAL file as stored: its own wrapped data key, a keyed checksum, and one chunk frame.

Layout (big-endian), docs/format.md "WAL archive":

    magic "BRDW" | version u8 (1) | flags u8 (0) | reserved u16 (0) | wrapped key length u32
    | wrapped key (canonical JSON: key_id, ciphertext, encryption_context)
    | plaintext MAC 16 bytes (the chunk's keyed Poly1305 checksum, index 0)
    | one stored chunk (braid.format.chunk: zstd, AES-256-GCM), index 0, input 0,
      whose header's backup id is `NAME@wal/FILE`

Every WAL file has a fresh data key, bound by its encryption context to the
repository and to `NAME@wal/FILE`, so a file moved to another name does not
unwrap, and chunk index 0 carries one plaintext per key as the chunk MAC
requires. The frame authenticates its header (file name, length) with GCM;
the plaintext MAC is checked after decompression. Nothing outside the key
and the frame is believed: a damaged envelope fails one of those checks.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from braid.errors import IntegrityError
from braid.format.canonical import canonical_json
from braid.format.keys import DataKey, WrappedKey, encryption_context

MAGIC = b"BRDW"
VERSION = 1
MAC_BYTES = 16
_HEAD = struct.Struct(">4sBBHI")


def read_head(view: memoryview, magic: bytes, version: int, kind: str, where: str) -> int:
    """The key length of a WAL object or pack head (magic, version, flags, reserved, key length), its kind checked."""
    found, found_version, _flags, _reserved, key_length = _HEAD.unpack_from(view)
    if found != magic:
        raise IntegrityError(f"{where}: not a Braid {kind} (bad magic)")
    if found_version != version:
        raise IntegrityError(f"{where}: {kind} version {found_version} is not supported by this Braid")
    return int(key_length)


def head_key(raw: bytes | memoryview, magic: bytes, version: int, kind: str, where: str) -> WrappedKey:
    """The wrapped data key in the head of a WAL object or pack (nothing authenticated: the key service's unwrap is the check)."""
    view = memoryview(raw)
    if len(view) < _HEAD.size:
        raise IntegrityError(f"{where}: {kind} is truncated ({len(view)} bytes)")
    key_length = read_head(view, magic, version, kind, where)
    if len(view) < _HEAD.size + key_length:
        raise IntegrityError(f"{where}: {kind} is truncated ({len(view)} bytes)")
    try:
        return WrappedKey.from_json(json.loads(bytes(view[_HEAD.size : _HEAD.size + key_length])))
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"{where}: the wrapped key is damaged ({exc})") from None


def with_head_key(raw: bytes | memoryview, magic: bytes, version: int, kind: str, wrapped: WrappedKey, where: str) -> bytes:
    """The same WAL object or pack with `wrapped` in place of its wrapped key, every other byte as it was (`braid rekey`).

    The frames' GCM authenticates their own headers, not the object's head, so a key that unwraps to the same
    data key leaves the object opening exactly as before.
    """
    view = memoryview(raw)
    head_key(view, magic, version, kind, where)  # checks the head
    _magic, _version, flags, reserved, key_length = _HEAD.unpack_from(view)
    key_doc = canonical_json(wrapped.to_json())
    return b"".join((_HEAD.pack(magic, version, flags, reserved, len(key_doc)), key_doc, view[_HEAD.size + key_length :]))


WAL_INDEX = 0
WAL_INPUT = 0


@dataclass(frozen=True)
class StoredWal:
    """A stored WAL object's parts, as read (nothing authenticated yet)."""

    wrapped: WrappedKey
    plaintext_mac: bytes
    frame: memoryview

    @classmethod
    def parse(cls, raw: bytes | memoryview, where: str) -> StoredWal:
        view = memoryview(raw)
        if len(view) < _HEAD.size:
            raise IntegrityError(f"{where}: stored WAL file is truncated ({len(view)} bytes)")
        key_length = read_head(view, MAGIC, VERSION, "WAL object", where)
        mac_at = _HEAD.size + key_length
        if len(view) < mac_at + MAC_BYTES:
            raise IntegrityError(f"{where}: stored WAL file is truncated ({len(view)} bytes)")
        try:
            wrapped = WrappedKey.from_json(json.loads(bytes(view[_HEAD.size : mac_at])))
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"{where}: the wrapped key is damaged ({exc})") from None
        return cls(wrapped, bytes(view[mac_at : mac_at + MAC_BYTES]), view[mac_at + MAC_BYTES :])

    def check_binding(self, repository_id: str, bound: str, where: str) -> None:
        """Refuse a key bound to another repository or file before asking the key service to unwrap it."""
        expected = encryption_context(repository_id, bound)
        if self.wrapped.context != expected:
            raise IntegrityError(f"{where}: its key is bound to {self.wrapped.context}, not {expected}; it was moved or copied")

    def plaintext_length(self, where: str) -> int:
        """The frame header's plaintext length (authenticated only once `decode` succeeded)."""
        from braid.format.chunk import ChunkHeader  # the codec (zstandard, cryptography): not for a push that stages raw bytes

        return ChunkHeader.frame(self.frame, where)[0].plaintext_length

    def matches(self, key: DataKey, plaintext: bytes | memoryview, where: str) -> bool:
        """Whether `plaintext` is what this object holds, by length and keyed checksum (nothing is decrypted)."""
        return self.plaintext_length(where) == len(plaintext) and key.chunk_mac_matches(WAL_INDEX, plaintext, self.plaintext_mac)

    def decode(self, key: DataKey, bound: str, where: str, level: int = 3) -> memoryview:
        """Authenticate, decrypt, decompress and check: the WAL file's bytes, or IntegrityError."""
        from braid.format.chunk import ChunkCodec

        length = self.plaintext_length(where)
        codec = ChunkCodec(key, level)
        try:
            return codec.decode(
                self.frame, backup=bound, index=WAL_INDEX, input_index=WAL_INPUT, plaintext_length=length, plaintext_mac=self.plaintext_mac
            )
        except IntegrityError as exc:
            raise IntegrityError(f"{where}: {exc}") from None


def encode_wal(key: DataKey, wrapped: WrappedKey, bound: str, plaintext: bytes | memoryview, level: int = 3) -> bytes:
    """The stored form of one WAL file under its own fresh data key."""
    from braid.format.chunk import ChunkCodec

    encoded = ChunkCodec(key, level).encode(bound, WAL_INDEX, WAL_INPUT, plaintext)
    key_doc = canonical_json(wrapped.to_json())
    return b"".join((_HEAD.pack(MAGIC, VERSION, 0, 0, len(key_doc)), key_doc, encoded.plaintext_mac, encoded.stored))
