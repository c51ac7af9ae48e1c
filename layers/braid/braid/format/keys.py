"""Per-backup key material: the data key and the keys derived from it.

Envelope encryption: a key service (KMS, or the local master-key file) makes a
fresh 256-bit data key for every backup and returns it wrapped, bound to an
encryption context naming the backup. Only the wrapped form is ever stored.
From the data key we derive, with HKDF-SHA256 and distinct labels, one key per
purpose, so no key is used for two jobs:

- chunk encryption (AES-256-GCM, random 96-bit nonces),
- plaintext checksums (a keyed MAC per chunk, so the manifest never carries an
  unkeyed hash that would let someone confirm a guess about the content),
- the manifest MAC,
- the catalog summary MAC (braid.format.summary),
- backup metadata encryption (braid.format.metadata: AES-256-GCM, random nonces).

The key service itself is a port (braid.ports.keys.KeyService): KMS in the
cloud, the local master-key file (braid.adapters.local.keys) on a host.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field

from braid.format.canonical import canonical_json
from braid.format.digests import hmac_sha256, hmac_sha256_matches, sha256

DATA_KEY_BYTES = 32
# Random 96-bit nonces: NIST SP 800-38D limit of chunks sealed under one data key (braid.format.chunk);
# defined here so the engines' driver checks it without loading the codec and zstandard.
MAX_CHUNKS_PER_KEY = 2**32


# cryptography is imported where a key is used, not with this module: the cloud agent reads the
# format's records but holds no key, and its start-up is paid per backup (docs/design/agent-startup.md).


def _hkdf(key: bytes, label: bytes, length: int = 32) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=b"braid/v1/" + label).derive(key)


def encryption_context(repository_id: str, backup: str) -> dict[str, str]:
    """The context every data key is bound to: KMS refuses to unwrap it for another backup."""
    return {"braid:repository": repository_id, "braid:backup": backup}


def canonical_context(context: Mapping[str, str]) -> bytes:
    """The encryption context as the local key file binds it (AES-GCM associated data)."""
    return canonical_json(dict(context))


@dataclass(frozen=True)
class WrappedKey:
    """A data key as stored: ciphertext from the key service plus what unwrapping needs."""

    key_id: str
    ciphertext: bytes
    context: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "key_id": self.key_id,
            "ciphertext": base64.b64encode(self.ciphertext).decode(),
            "encryption_context": dict(sorted(self.context.items())),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> WrappedKey:
        context = doc["encryption_context"]
        if not isinstance(context, Mapping):
            raise TypeError("encryption_context is not an object")
        return cls(
            key_id=str(doc["key_id"]),
            ciphertext=base64.b64decode(str(doc["ciphertext"])),
            context={str(k): str(v) for k, v in context.items()},
        )


class DataKey:
    """The plaintext data key of one backup, with its derived purpose keys.

    Never logged, never written: `repr` shows only a fingerprint.
    """

    __slots__ = ("_encryption", "_chunk_mac", "_manifest_mac", "_input_mac", "_summary_mac", "_metadata", "fingerprint")

    def __init__(self, material: bytes) -> None:
        if len(material) != DATA_KEY_BYTES:
            raise ValueError("a data key is 32 bytes")
        self._encryption = _hkdf(material, b"chunk-encryption")
        self._chunk_mac = _hkdf(material, b"chunk-plaintext-mac")
        self._manifest_mac = _hkdf(material, b"manifest-mac")
        self._input_mac = _hkdf(material, b"input-mac")
        self._summary_mac = _hkdf(material, b"summary-mac")
        self._metadata = _hkdf(material, b"metadata-encryption")
        self.fingerprint = sha256(b"braid/v1/fingerprint", material).hex()[:16]

    def __repr__(self) -> str:
        return f"DataKey(fingerprint={self.fingerprint})"

    @property
    def encryption_key(self) -> bytes:
        return self._encryption

    @property
    def metadata_key(self) -> bytes:
        """AES-256-GCM key of the backup's metadata objects (braid.format.metadata), never of a chunk."""
        return self._metadata

    def chunk_mac(self, index: int, plaintext: bytes | bytearray | memoryview) -> bytes:
        """Keyed checksum of one chunk's plaintext.

        Poly1305 under a one-time key derived for this chunk index: a chunk
        index carries exactly one plaintext per backup, which is Poly1305's
        one-key-one-message rule, and it runs at several GB/s where
        HMAC-SHA256 would cost a third of the worker's CPU (measured, see
        docs/format.md).
        """
        from cryptography.hazmat.primitives.poly1305 import Poly1305

        return Poly1305.generate_tag(self._one_time_key(index), plaintext)

    def chunk_mac_matches(self, index: int, plaintext: bytes | bytearray | memoryview, tag: bytes) -> bool:
        """Whether `tag` is `chunk_mac(index, plaintext)`, checked in constant time."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.poly1305 import Poly1305

        try:
            Poly1305.verify_tag(self._one_time_key(index), plaintext, bytes(tag))
        except InvalidSignature:
            return False
        return True

    def _one_time_key(self, index: int) -> bytes:
        return hmac_sha256(self._chunk_mac, b"chunk:%d" % index)

    def manifest_mac(self, body: bytes) -> bytes:
        return hmac_sha256(self._manifest_mac, body)

    def manifest_mac_matches(self, body: bytes, mac: bytes) -> bool:
        """Whether `mac` is `manifest_mac(body)`, checked in constant time."""
        return hmac_sha256_matches(self._manifest_mac, mac, body)

    def summary_mac(self, body: bytes) -> bytes:
        """MAC of a catalog summary: its own label, so a summary can never pass for a manifest or the reverse."""
        return hmac_sha256(self._summary_mac, body)

    def summary_mac_matches(self, body: bytes, mac: bytes) -> bool:
        """Whether `mac` is `summary_mac(body)`, checked in constant time."""
        return hmac_sha256_matches(self._summary_mac, mac, body)

    def input_mac(self, input_index: int, length: int, chunk_macs: list[bytes]) -> bytes:
        """Whole-input checksum, chained from the chunk MACs in order.

        Derived rather than streamed so that neither the host agent (which
        holds no key in the cloud path) nor a single worker must read the
        whole input; any reordering, loss or duplication of chunks changes it.
        """
        return hmac_sha256(self._input_mac, b"input:%d:length:%d:chunks:%d" % (input_index, length, len(chunk_macs)), *chunk_macs)

