"""The algorithms descriptor every manifest carries.

It names what the format's other modules do (the chunk codec, the keyed
checksums, the stored checksum, the key derivation), so it lives with them:
a local and a cloud backup describe themselves with this one function and
therefore identically. Readers use it for display only; the chunk header and
the manifest version are what decoding relies on.
"""

from __future__ import annotations

from braid.format.checksum import ALGORITHM as STORED_CHECKSUM


def algorithms(level: int) -> dict[str, object]:
    """The descriptor of a backup written at zstd `level`."""
    return {
        "compression": "zstd",
        "level": level,
        "cipher": "aes-256-gcm",
        "nonce": "random-96",
        "chunk_mac": "poly1305-hmac-sha256-derived-key",
        "input_mac": "hmac-sha256-chain",
        "manifest_mac": "hmac-sha256",
        "stored_checksum": STORED_CHECKSUM,
        "key_derivation": "hkdf-sha256",
    }
