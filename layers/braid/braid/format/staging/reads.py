"""StagingReads: where one backup's staging lives in a store, and how its records are read.

The base of StagingArea (braid.format.staging.area): a missing record reads
as None (callers decide whether that is an error), and many small records
are read READ_THREADS at once, in the order asked, each read counted for the
step that asked (braid.ports.usage).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from braid.errors import NotFoundError
from braid.format.ids import BackupRef
from braid.format.layout import staging_prefix
from braid.ports.store import ObjectStore
from braid.ports.usage import in_context

# Records read at once by _get_many; the thread name lets a counting store tell parallel reads apart.
READ_THREADS = 32
READ_THREAD_NAME = "braid-staging-read"

T = TypeVar("T")


class StagingReads:
    """One backup's staging in a store, and how its records are read: one, or many at once."""

    def __init__(self, store: ObjectStore, ref: BackupRef) -> None:
        self.store = store
        self.ref = ref

    @property
    def prefix(self) -> str:
        """Repository-relative prefix of every object of this backup's staging."""
        return staging_prefix(self.ref)

    def _get(self, key: str) -> bytes | None:
        try:
            return self.store.get(key)
        except NotFoundError:
            return None

    def _read(self, key: str, parse: Callable[[bytes, str], T]) -> T | None:
        """The record at `key` as `parse(raw, key)` reads it; None when there is none."""
        raw = self._get(key)
        return None if raw is None else parse(raw, key)

    def _get_many(self, keys: list[str]) -> list[bytes | None]:
        """Several small records at once (READ_THREADS in flight, not one request's latency after another), in the order asked."""
        if len(keys) <= 1:
            return [self._get(key) for key in keys]
        with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(keys)), thread_name_prefix=READ_THREAD_NAME) as pool:
            return list(pool.map(in_context(self._get), keys))  # the reads count for the step that asked (braid.ports.usage)
