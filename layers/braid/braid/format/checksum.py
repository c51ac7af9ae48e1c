"""Checksum of a stored object, in the form S3 itself computes and keeps.

CRC64NVME is S3's full-object checksum: the object store verifies it on
upload and returns it from HEAD, so a quick verify on S3 compares the manifest
with the store's own record without downloading anything. It is an integrity
check against storage faults, not an authenticator: GCM covers tampering.

A checksum is written in exactly two spellings (docs/format.md, Checksums),
and only the helpers here spell them, so no caller builds either by hand:

- the *header* form, the bare base64 of the 8-byte big-endian value, as in
  S3's `x-amz-checksum-crc64nvme`: what S3 requests and responses carry, and
  the staging fields whose name already says the algorithm (part checksums);
- the *tagged* form `crc64nvme:<header form>`: a stored object's checksum in
  a manifest chunk entry, a segment record and `ObjectInfo.checksum`, so a
  reader sees which algorithm it is without knowing the field.
"""

from __future__ import annotations

import base64
import re
import threading
from types import ModuleType

ALGORITHM = "crc64nvme"
_PREFIX = ALGORITHM + ":"
_VALUE_BYTES = 8
# The one base64 spelling of 8 bytes, the one `encode_crc64nvme` writes: 10 digits, an 11th whose two
# low bits are zero (it carries the last 4 bits), then one "=". Matched rather than decoded and
# encoded again: a manifest's every chunk checksum is checked when it is sealed (16,384 at 1 TiB).
_HEADER_PATTERN = r"[A-Za-z0-9+/]{10}[AEIMQUYcgkosw048]="
_HEADER = re.compile(_HEADER_PATTERN)
_TAGGED = re.compile(re.escape(_PREFIX) + _HEADER_PATTERN)

Buffer = bytes | bytearray | memoryview


def _checksums() -> ModuleType:
    """awscrt's checksums, imported at the first CRC that needs them rather than with this module.

    Loading awscrt costs ~80 ms of CPU holding the GIL (its native library
    seeds a jitter-entropy generator when it loads, measured 2026-11-29): a
    tenth of a 256 MiB restore, which computes no CRC at all, and in a backup
    it delayed the first chunk's store by as much when the worker loaded it;
    `preload` loads it while the first chunk is being read instead (measured,
    scripts/bench local). Small inputs before that are done in Python
    (`_small_crc64nvme`): an empty cloud backup and the repository's config
    never load it.
    """
    global _crt
    from awscrt import checksums

    module: ModuleType = checksums
    _crt = module
    return module


_crt: ModuleType | None = None
_preloading = threading.Event()

# CRC64NVME (reflected polynomial, initial value and final XOR all ones), a byte at a time from a table: the
# value awscrt computes (tests/test_checksum_small.py compares them). ~0.1 us a byte, so only while awscrt is not
# loaded, on inputs of at most _SMALL bytes and _PYTHON_BUDGET bytes in all: a config file and a few records,
# never a chunk.
_POLY = 0x9A6C9329AC4BC9B5
_MASK = (1 << 64) - 1
_SMALL = 16 * 1024
_PYTHON_BUDGET = 256 * 1024
_python_bytes = 0
_table: list[int] = []


def _small_crc64nvme(data: Buffer, previous: int) -> int:
    if not _table:
        for byte in range(256):
            crc = byte
            for _ in range(8):
                crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
            _table.append(crc)
    table = _table
    crc = previous ^ _MASK
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ _MASK


def preload() -> None:
    """Import awscrt on a background thread now (once), so the first CRC does not wait for it.

    For callers that know a CRC of a large input is coming while this
    process has a core to spare and no other thread needs the GIL for a
    while (a backup once its first bytes arrive). A CRC asked for meanwhile
    waits for the import to finish (Python's import lock), as it would have
    loaded it itself.
    """
    if not _preloading.is_set():
        _preloading.set()
        threading.Thread(target=_checksums, name="braid-preload-crc", daemon=True).start()


def crc64nvme(data: Buffer, previous: int = 0) -> int:
    """CRC64NVME of `data`, continuing from `previous` (the CRC of the bytes before it)."""
    global _python_bytes
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if _crt is None and not _preloading.is_set() and size <= _SMALL and _python_bytes + size <= _PYTHON_BUDGET:
        _python_bytes += size
        return _small_crc64nvme(data, previous)
    value: int = (_crt or _checksums()).crc64nvme(data, previous)
    return value


def combine_crc64nvme(first: int, second: int, second_length: int) -> int:
    """The CRC64NVME of two byte runs laid end to end, from their own CRCs.

    How a multipart upload's full-object checksum follows from its parts'.
    """
    value: int = (_crt or _checksums()).combine_crc64nvme(first, second, second_length)
    return value


def encode_crc64nvme(value: int) -> str:
    """The header form: base64 of the 8-byte big-endian value, as S3 spells it."""
    return base64.b64encode(value.to_bytes(_VALUE_BYTES, "big")).decode()


def decode_crc64nvme(header: str) -> int:
    """The value a header-form checksum names; ValueError for anything else (any other spelling included)."""
    if not isinstance(header, str) or _HEADER.fullmatch(header) is None:
        raise ValueError(f"{header!r} is not a base64 CRC64NVME value")
    return int.from_bytes(base64.b64decode(header), "big")


def tagged_checksum(value: int) -> str:
    """The tagged form `crc64nvme:<base64>` of a CRC64NVME value."""
    return _PREFIX + encode_crc64nvme(value)


def stored_checksum(data: Buffer) -> str:
    """The tagged checksum of a whole stored object."""
    return tagged_checksum(crc64nvme(data))


def checksum_from_header(header: str) -> str:
    """The tagged form of a header-form value S3 returned (HEAD, PUT, Complete).

    Taken as given, not decoded: a malformed value from a misbehaving store
    then fails the comparison it is made for, with that comparison's message.
    """
    return _PREFIX + header


def parse_tagged_checksum(checksum: str) -> int:
    """The value a tagged checksum names; ValueError for any other text."""
    algorithm, sep, value = checksum.partition(":")
    if not sep or algorithm != ALGORITHM:
        raise ValueError(f"unsupported stored checksum {checksum!r}: expected {_PREFIX}<base64>")
    return decode_crc64nvme(value)


def is_tagged_checksum(checksum: str) -> bool:
    """Whether `parse_tagged_checksum` accepts `checksum`, without decoding it (sealing checks every chunk's)."""
    return isinstance(checksum, str) and _TAGGED.fullmatch(checksum) is not None


def s3_checksum_value(checksum: str) -> str:
    """The header form of a tagged checksum, to send to S3."""
    return encode_crc64nvme(parse_tagged_checksum(checksum))
