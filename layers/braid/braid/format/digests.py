"""SHA-256 and HMAC-SHA256: every digest the format computes, and the checks of MACs.

From cryptography, which every backup and restore loads anyway for
AES-GCM, HKDF and Poly1305, rather than from hashlib and hmac: those load
Python's own OpenSSL binding (_hashlib, a second copy of libcrypto), ~4 ms
of every run's start-up on the database host (measured; a 256 MiB backup
takes well under a second, tests/test_startup.py keeps it out). The values
are the standard ones: docs/format.md names the algorithms, not a library.

A MAC is checked by cryptography's `verify`, in time that does not depend on
where a forgery differs. The SHA-256 self-checks of stored records detect
corruption, not forgery (they have no key), so they are compared plainly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.hazmat.primitives import hmac as _hmac

# Imported at the first digest, not with this module: the cloud agent loads the format's
# records but computes no digest on its way (its start-up is paid per backup).


def sha256(*parts: bytes) -> bytes:
    """SHA-256 of the parts laid end to end (no copy to join them)."""
    from cryptography.hazmat.primitives import hashes

    digest = hashes.Hash(hashes.SHA256())
    for part in parts:
        digest.update(part)
    return digest.finalize()


def _mac(key: bytes, parts: tuple[bytes, ...]) -> _hmac.HMAC:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import hmac as _hmac

    mac = _hmac.HMAC(key, hashes.SHA256())
    for part in parts:
        mac.update(part)
    return mac


def hmac_sha256(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 under `key` of the parts laid end to end."""
    return _mac(key, parts).finalize()


def hmac_sha256_matches(key: bytes, tag: bytes, *parts: bytes) -> bool:
    """Whether `tag` is the HMAC-SHA256 under `key` of the parts, checked in constant time."""
    from cryptography.exceptions import InvalidSignature

    try:
        _mac(key, parts).verify(bytes(tag))
    except InvalidSignature:
        return False
    return True
