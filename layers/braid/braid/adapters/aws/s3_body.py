"""Request bodies for S3 writes: the caller's buffer, sent without a copy.

The agent's memory bound is (inputs + concurrency + 1) chunk buffers; a second
chunk-sized copy per request would double it, and botocore must be able to
rewind a body for its own retries.
"""

from __future__ import annotations

import io
from typing import Any

from braid.ports.store import Buffer

_SEND_BLOCK = 1024 * 1024


class _ViewReader(io.RawIOBase):
    """A seekable file over a memoryview slice, so botocore sends it without a copy."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        # Direct, one copy per block (RawIOBase.read would copy twice). The
        # HTTP layer asks for 8-16 KiB at a time; answering with up to 1 MiB
        # (every caller sends or hashes whatever it gets) cuts a 64 MiB part
        # from ~8,000 Python calls and sends to 64: the agent's CPU per GiB
        # is mostly these calls otherwise (scripts/bench cloud).
        if size is not None and size >= 0:
            size = max(size, _SEND_BLOCK)
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        block = bytes(self._view[self._pos : end])
        self._pos = max(self._pos, end)
        return block

    def readinto(self, target: Any) -> int:
        n = min(len(target), len(self._view) - self._pos)
        if n <= 0:
            return 0
        memoryview(target)[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._view)


def request_body(data: Buffer) -> Any:
    """What botocore accepts without copying the whole buffer: bytes or a seekable file.

    botocore refuses memoryviews, and moto's in-process stub mishandles
    bytearrays, so anything but bytes goes through a reader over the caller's
    (pool) buffer: no second chunk-sized allocation, which keeps the agent's
    memory bound, and botocore can rewind it for its own retries.
    """
    if isinstance(data, bytes):
        return data
    return _ViewReader(memoryview(data))
