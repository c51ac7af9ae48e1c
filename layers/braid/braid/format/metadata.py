"""Backup metadata: small files a backup's stream carried, kept encrypted beside its chunks.

PostgreSQL's `backup_manifest` (captured from pg_basebackup's tar stream,
braid.engine.capture) is one: an incremental backup needs its parent's
(`{parent_manifest}`). Each is one object, `data/NAME/ID/metadata/KIND`
(braid.format.layout.metadata_key), so everything that removes or locks a
backup's data does the same to it:

    magic "BRMD" | version u8 | compression u8 (0 none, 1 zstd) | nonce 12 bytes
    | AES-256-GCM ciphertext of the (compressed) bytes | tag 16

under the data key's own `metadata-encryption` key (braid.format.keys), with
the header, the backup (NAME@ID) and the kind as associated data: an object
copied to another backup or kind fails to authenticate. The manifest
records each object's plaintext length and the SHA-256 of the stored bytes
(`metadata: {KIND: {"length", "stored_length", "sha256"}}`), so the sealed
manifest vouches for exactly that object.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from braid.errors import IntegrityError
from braid.format.digests import sha256

if TYPE_CHECKING:
    from braid.format.keys import DataKey

MAGIC = b"BRMD"
VERSION = 1
_HEADER = 4 + 1 + 1 + 12
KIND = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
BACKUP_MANIFEST = "backup_manifest"
CHECKPOINTS = "xtrabackup_checkpoints"  # a MariaDB xbstream's (braid.engine.xbstream)
# The members of a stream Braid keeps, and the most bytes of each (a prefix for pg_control: only its first fields are
# read). The engine captures them (braid.engine.capture, braid.engine.xbstream); staging's captured index accepts these.
MEMBER_LIMITS: dict[str, int] = {
    "backup_label": 1 << 16, BACKUP_MANIFEST: 64 << 20, "PG_VERSION": 64, "global/pg_control": 64, CHECKPOINTS: 1 << 16,
}
MAX_METADATA = 256 << 20  # decompressed size a reader accepts


@dataclass(frozen=True)
class MetadataEntry:
    """The manifest's record of one metadata object."""

    length: int
    stored_length: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"length": self.length, "stored_length": self.stored_length, "sha256": self.sha256}

    @classmethod
    def from_json(cls, doc: Any) -> MetadataEntry:
        if not isinstance(doc, dict) or set(doc) != {"length", "stored_length", "sha256"}:
            raise ValueError("a metadata entry is {length, stored_length, sha256}")
        if type(doc["length"]) is not int or type(doc["stored_length"]) is not int or not re.fullmatch(r"[0-9a-f]{64}", str(doc["sha256"])):
            raise ValueError("malformed metadata entry")
        return cls(doc["length"], doc["stored_length"], str(doc["sha256"]))


def _aad(header: bytes, backup: str, kind: str) -> bytes:
    return header + b"braid/v1/metadata:" + backup.encode() + b":" + kind.encode()


def seal_metadata(key: DataKey, backup: str, kind: str, plaintext: bytes) -> tuple[bytes, MetadataEntry]:
    """The stored object for `plaintext` and the manifest's entry for it."""
    if not KIND.match(kind):
        raise ValueError(f"invalid metadata kind {kind!r}")
    import zstandard  # here, not at import: the cloud agent reads manifests' types but seals nothing

    packed = zstandard.ZstdCompressor(level=3).compress(plaintext)
    compression = 1 if len(packed) < len(plaintext) else 0
    payload = packed if compression else plaintext
    nonce = os.urandom(12)
    header = MAGIC + bytes([VERSION, compression]) + nonce
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # only where sealing: a cloud agent never loads it

    stored = header + AESGCM(key.metadata_key).encrypt(nonce, payload, _aad(header, backup, kind))
    return stored, MetadataEntry(len(plaintext), len(stored), sha256(stored).hex())


def open_metadata(key: DataKey, backup: str, kind: str, stored: bytes, entry: MetadataEntry) -> bytes:
    """The plaintext of a stored metadata object the manifest's `entry` names; IntegrityError unless it is exactly that."""
    where = f"{kind} of backup {backup}"
    if len(stored) != entry.stored_length or sha256(stored).hex() != entry.sha256:
        raise IntegrityError(f"{where} does not match its manifest entry (corrupt or replaced)")
    if len(stored) < _HEADER + 16 or stored[:4] != MAGIC or stored[4] != VERSION or stored[5] not in (0, 1):
        raise IntegrityError(f"{where} is not a Braid metadata object (corrupt)")
    header = stored[:_HEADER]
    import zstandard
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # only where reading: a cloud agent never loads it

    try:
        payload = AESGCM(key.metadata_key).decrypt(header[6:], stored[_HEADER:], _aad(header, backup, kind))
    except InvalidTag:
        raise IntegrityError(f"{where} failed authentication (tampered, or not written by this key)") from None
    if header[5] == 1:
        try:
            payload = zstandard.ZstdDecompressor().decompress(payload, max_output_size=MAX_METADATA)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"{where}: zstd frame does not decode ({exc})") from None
    if len(payload) != entry.length:
        raise IntegrityError(f"{where} is {len(payload)} bytes, its manifest entry says {entry.length}")
    return payload
