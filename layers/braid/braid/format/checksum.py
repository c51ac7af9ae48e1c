"""Checksum of a stored object, in the form S3 itself computes and keeps.

CRC64NVME is S3's full-object checksum: the object store verifies it on
upload and returns it from HEAD, so a quick verify on S3 compares the manifest
with the store's own record without downloading anything. It is an integrity
check against storage faults, not an authenticator: GCM covers tampering.
"""

from __future__ import annotations

import base64

from awscrt import checksums

ALGORITHM = "crc64nvme"


def crc64nvme(data: bytes | bytearray | memoryview, previous: int = 0) -> int:
    return checksums.crc64nvme(data, previous)


def encode_crc64nvme(value: int) -> str:
    """The base64 text S3 uses in `x-amz-checksum-crc64nvme`."""
    return base64.b64encode(value.to_bytes(8, "big")).decode()


def stored_checksum(data: bytes | bytearray | memoryview) -> str:
    return f"{ALGORITHM}:{encode_crc64nvme(crc64nvme(data))}"


def s3_checksum_value(checksum: str) -> str:
    """The bare base64 value of a `crc64nvme:...` checksum string."""
    algorithm, _, value = checksum.partition(":")
    if algorithm != ALGORITHM:
        raise ValueError(f"unsupported stored checksum algorithm {algorithm!r}")
    return value
