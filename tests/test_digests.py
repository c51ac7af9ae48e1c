"""The format's digests (braid.format.digests) are the standard SHA-256 and HMAC-SHA256, and MAC checks refuse every near miss."""

from __future__ import annotations

import hashlib
import hmac
import os

import pytest

from braid.format.digests import hmac_sha256, hmac_sha256_matches, sha256
from braid.format.keys import DataKey


def test_digests_are_the_standard_ones() -> None:
    assert sha256(b"abc").hex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2 vector
    key, body = os.urandom(32), os.urandom(1000)
    assert sha256(body[:10], body[10:]) == hashlib.sha256(body).digest()
    assert hmac_sha256(key, body[:1], body[1:]) == hmac.digest(key, body, "sha256")


def _near_misses(tag: bytes) -> list[bytes]:
    flipped = bytearray(tag)
    flipped[-1] ^= 1
    return [bytes(flipped), tag[:-1], tag + b"\0", b"", bytes(len(tag))]


def test_a_mac_check_accepts_the_mac_and_refuses_near_misses() -> None:
    key, body = os.urandom(32), b"body"
    tag = hmac_sha256(key, body)
    assert hmac_sha256_matches(key, tag, body)
    for wrong in _near_misses(tag):
        assert not hmac_sha256_matches(key, wrong, body)
    assert not hmac_sha256_matches(os.urandom(32), tag, body)


@pytest.mark.parametrize("kind", ["chunk", "manifest", "summary"])
def test_each_data_key_mac_checks_its_own_mac_only(kind: str) -> None:
    key, other = DataKey(os.urandom(32)), DataKey(os.urandom(32))
    body = os.urandom(100)
    make = {"chunk": lambda k, b: k.chunk_mac(7, b), "manifest": lambda k, b: k.manifest_mac(b), "summary": lambda k, b: k.summary_mac(b)}[kind]
    check = {
        "chunk": lambda k, b, t: k.chunk_mac_matches(7, b, t),
        "manifest": lambda k, b, t: k.manifest_mac_matches(b, t),
        "summary": lambda k, b, t: k.summary_mac_matches(b, t),
    }[kind]
    tag = make(key, body)
    assert check(key, body, tag)
    assert not check(other, body, tag)
    assert not check(key, body + b"x", tag)
    for wrong in _near_misses(tag):
        assert not check(key, body, wrong)
    if kind == "chunk":
        assert not key.chunk_mac_matches(8, body, tag)  # another index is another one-time key
    else:  # a summary MAC never passes for a manifest's, nor the reverse
        swapped = key.summary_mac(body) if kind == "manifest" else key.manifest_mac(body)
        assert not check(key, body, swapped)
