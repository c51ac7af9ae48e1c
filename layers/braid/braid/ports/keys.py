"""Port: the key service that makes and unwraps per-backup data keys.

The format (braid.format.keys) says what a data key and its wrapped form
are; who wraps them is a deployment choice, so it is a port: AWS KMS
(braid.adapters.aws.kms) in the cloud, the local master-key file
(braid.adapters.local.keys) on a host. Engines and pipeline steps take this
Protocol, never an adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from braid.format.keys import DataKey, WrappedKey


class KeyService(Protocol):
    """Makes a fresh data key bound to an encryption context, and unwraps stored ones."""

    @property
    def key_id(self) -> str: ...

    def generate_data_key(self, context: Mapping[str, str]) -> tuple[DataKey, WrappedKey]: ...

    def unwrap(self, wrapped: WrappedKey) -> DataKey: ...


class KeyRewrapper(Protocol):
    """Re-wraps a stored data key under one target key, without the data key leaving the key service where it can help it.

    `braid rekey` (braid.ops.rekey): KMS ReEncrypt, or the local master-key
    file's unwrap-and-wrap. The encryption context stays the same, so the
    re-wrapped key is still bound to its backup and repository.
    """

    @property
    def target_key_id(self) -> str: ...

    def rewrap(self, wrapped: WrappedKey) -> WrappedKey: ...


class DataKeyCopier(Protocol):
    """Wraps a backup's data key, as another repository's key service wraps it, for `braid copy` (braid.ops.copy).

    The source key service unwraps it and the target's (its master-key
    file, or KMS Encrypt) wraps it for the target's encryption context: the
    copy is bound to its own repository, as a backup made there would be.
    The chunks are never decrypted: their keys derive from this data key,
    which does not change.
    """

    @property
    def target_key_id(self) -> str: ...

    def copy_wrapped(self, wrapped: WrappedKey, context: Mapping[str, str]) -> WrappedKey: ...
