"""Which of Braid's own pipes another process opened (Linux inotify).

Braid holds both ends of the pipes it makes for `--pipes` (braid.engine.fifos),
so the end of a pipe's stream is decided by the producer's exit, not by the
pipe. That has one blind spot: a pipe the producer never opened reads as
an empty input, exactly like a pipe it opened and closed without writing
(an empty tablespace). Publishing it would store a backup missing one
stream with no warning, and restore would hand the database an empty pipe.

No read or poll result tells the two apart, and opening a pipe changes
none of its inode times, but the kernel reports every open of a watched
path through inotify (IN_OPEN). Braid opens both of its ends before it
adds the watch, so every event afterwards is another process: the
producer, the only other user of a private 0700 directory.

inotify is Linux's (the glibc calls, through ctypes: the standard library
has no binding, and a dependency for three calls would be more to trust
than these few lines). Elsewhere the watch is unavailable and `unopened`
says so by returning None; docs/usage.md documents that the check is Linux only.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["OpenWatch"]

_IN_OPEN = 0x00000020
_IN_Q_OVERFLOW = 0x00004000  # events were lost: which pipes were opened is no longer known
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then `len` bytes of name (none for a watched file)


def _libc() -> Any:
    """libc's inotify calls, or None; ctypes is imported here, for --pipes only (start-up time)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    return libc if hasattr(libc, "inotify_init1") and hasattr(libc, "inotify_add_watch") else None


class OpenWatch:
    """Counts opens of `paths` by anyone from now on; `close` when done."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)
        self._opens = [0] * len(self.paths)
        self._lock = threading.Lock()  # the events are read from any thread
        self._lost = False
        self._fd: int | None = None
        self._watches: dict[int, int] = {}  # watch descriptor -> index into paths
        libc = _libc()
        if libc is None:
            return
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return  # out of inotify instances (fs.inotify.max_user_instances): no check, as elsewhere
        for index, path in enumerate(self.paths):
            wd = libc.inotify_add_watch(fd, os.fsencode(path), _IN_OPEN)
            if wd < 0:
                os.close(fd)
                return
            self._watches[wd] = index
        self._fd = fd

    @property
    def available(self) -> bool:
        return self._fd is not None

    def counts(self) -> list[int] | None:
        """Opens of each path by others since the watch began; None if they could not be watched."""
        with self._lock:
            if self._fd is None:
                return None
            while True:
                try:
                    data = os.read(self._fd, 64 * 1024)
                except BlockingIOError:
                    break
                offset = 0
                while offset + _EVENT.size <= len(data):
                    wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                    offset += _EVENT.size + length
                    if mask & _IN_Q_OVERFLOW:
                        self._lost = True
                    elif mask & _IN_OPEN and wd in self._watches:
                        self._opens[self._watches[wd]] += 1
            return None if self._lost else list(self._opens)

    def unopened(self) -> list[int] | None:
        """Indexes of the paths nobody opened since the watch began; None if it could not be watched."""
        counts = self.counts()
        return None if counts is None else [i for i, n in enumerate(counts) if not n]

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
