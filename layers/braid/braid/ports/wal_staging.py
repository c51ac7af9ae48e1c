"""Port: the cloud path's WAL staging, and the archived objects' recorded checksums.

With the stack, a host holds no key: `wal-push` stores the raw file under
`wal-staging/NAME/FILE` (S3 verifies the SHA-256 the PUT carries and keeps
it), and the WAL worker (braid.ops.wal_process) stores the compressed,
encrypted form under `wal/` with the plaintext's SHA-256 beside it, then
deletes every version of the staged object. Keys here are
repository-relative (braid.format.layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class StagedWal:
    """A staged raw WAL object: its size, the SHA-256 (hex) S3 verified at PUT, its version; `data` when read."""

    key: str
    size: int
    sha256: str
    version: str | None
    data: bytes | None = None


class WalStaging(Protocol):
    def put_staged(self, key: str, data: bytes | bytearray, sha256: str) -> None:
        """Create `key` with `data`, which the store checks against `sha256` (hex) before keeping it;
        AlreadyExistsError when a current object is there (nothing replaced)."""
        ...

    def staged(self, key: str) -> StagedWal | None:
        """The staged object's size, checksum and version (no bytes), or None when there is none."""
        ...

    def read_staged(self, key: str, version: str | None = None) -> StagedWal | None:
        """The staged object (that `version`, else the current one) with its bytes, checked against its
        stored SHA-256 (IntegrityError otherwise); None when it is not there."""
        ...

    def read_staged_range(self, key: str, version: str | None, start: int, length: int) -> bytes | None:
        """Up to `length` bytes of the staged object (that `version`, else the current one) from `start`, unchecked (a
        staged bundle's reader checks them against its index, braid.format.wal_bundle); None when it is not there."""
        ...

    def archived_sha256(self, key: str) -> str | None:
        """The plaintext SHA-256 (hex) recorded with the archived object at `key`: None when there is no
        such object, "" when it has none recorded (stored by a host, braid.ops.wal_push)."""
        ...

    def put_archived(self, key: str, blob: bytes | bytearray, sha256: str) -> None:
        """Create the archived object `key` (create-only: AlreadyExistsError), recording the plaintext's `sha256`."""
        ...

    def remove_staged(self, key: str, version: str | None) -> None:
        """Delete `version` of `key` by its id (None: a store that keeps no versions), so no delete marker
        hides it as a noncurrent version. Staged keys are create-only for every principal (the bucket
        policy), so a key holds one version at a time: the one each push made, removed by its processing."""
        ...
