"""Request bodies for S3 writes: the caller's buffers, sent without a copy.

The agent's memory bound is (inputs + concurrency + 1) chunk buffers; a second
chunk-sized copy per request would double it, and botocore must be able to
rewind a body for its own retries. A staging part of several chunks is sent
straight from the chunks' own buffers, one after the other, never joined.
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Sequence
from typing import Any

from braid.ports.store import Buffer

_SEND_BLOCK = 1024 * 1024


def _bytes_view(data: Buffer) -> memoryview:
    view = memoryview(data)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class _ViewReader(io.RawIOBase):
    """A seekable file over memoryview slices laid end to end, so botocore sends them without a copy."""

    def __init__(self, views: Sequence[memoryview]) -> None:
        super().__init__()
        self._views = [v for v in views if len(v)]
        self._starts: list[int] = []  # offset of each view within the body
        total = 0
        for view in self._views:
            self._starts.append(total)
            total += len(view)
        self._length = total
        self._pos = 0

    def views(self) -> list[memoryview]:
        """The body's buffers in order (the light client sends them straight to the socket)."""
        return list(self._views)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _slice(self, end: int) -> memoryview | bytes:
        """The bytes from the position to `end`, within one view (a read never spans two)."""
        if self._pos >= min(end, self._length):
            return b""
        i = bisect.bisect_right(self._starts, self._pos) - 1
        start = self._pos - self._starts[i]
        stop = min(len(self._views[i]), end - self._starts[i])
        return self._views[i][start:stop]

    def read(self, size: int | None = -1) -> bytes:
        # Direct, one copy per block (RawIOBase.read would copy twice). The
        # HTTP layer asks for 8-16 KiB at a time; answering with up to 1 MiB
        # (every caller sends or hashes whatever it gets) cuts a 64 MiB part
        # from ~8,000 Python calls and sends to 64: the agent's CPU per GiB
        # is mostly these calls otherwise (scripts/bench cloud). A read stops
        # at the end of a view; the caller reads on, as it must for any file.
        if size is not None and size >= 0:
            size = max(size, _SEND_BLOCK)
        if size is None or size < 0:
            rest = []
            while piece := self._slice(self._length):
                rest.append(bytes(piece))
                self._pos += len(piece)
            return b"".join(rest)
        block = bytes(self._slice(min(self._length, self._pos + size)))
        self._pos += len(block)
        return block

    def readinto(self, target: Any) -> int:
        out = memoryview(target).cast("B")
        done = 0
        while done < len(out):
            piece = self._slice(self._pos + len(out) - done)
            if not piece:
                break
            out[done : done + len(piece)] = piece
            done += len(piece)
            self._pos += len(piece)
        return done

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return self._length


def request_body(data: Buffer | Sequence[Buffer]) -> Any:
    """What botocore accepts without copying the caller's buffers: bytes or a seekable file.

    `data` is one buffer, or a list or tuple of them (a staging part made of
    several chunks) sent back to back. botocore refuses memoryviews, and
    moto's in-process stub mishandles bytearrays, so anything but bytes goes
    through a reader over the caller's (pool) buffers: no second chunk-sized
    allocation, which keeps the agent's memory bound, and botocore can
    rewind it for its own retries.
    """
    if isinstance(data, bytes):
        return data
    if isinstance(data, (list, tuple)):
        return _ViewReader([_bytes_view(piece) for piece in data])
    return _ViewReader([_bytes_view(data)])  # type: ignore[arg-type]
