"""Opening named pipes with a deadline, for backup inputs and restore outputs.

open(2) on a FIFO blocks until a process opens the other end: a database
backup that never starts, a typo in a script's path, or a restore tool that
died before opening its pipe would hang braid without a word. Each side here
waits at most `timeout` seconds (`--open-timeout`), says what it waits for
after a few seconds, and then fails with an InputError (exit 5) naming the
path.

Writing (a restore output): O_WRONLY|O_NONBLOCK fails with ENXIO until a
reader has the FIFO open, so that open is retried until it succeeds; the
descriptor is then switched back to blocking, since back-pressure from a
slow reader is what bounds restore's memory.

Reading (a backup input): O_RDONLY|O_NONBLOCK succeeds at once with no
writer, and poll() cannot tell a writer that opened and is still silent
from no writer at all (pg_basebackup opens its output and writes nothing
through a long spread checkpoint), so polling would time out good backups.
The blocking open runs in a helper thread instead, and returns exactly when
a writer opened. To stop waiting (deadline, or the backup was cancelled) we
release that open by opening the FIFO for writing ourselves, non-blocking,
and closing at once; the helper closes what it got, so nobody reads it.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable

from braid.errors import InputError

__all__ = ["DEFAULT_OPEN_TIMEOUT", "is_fifo", "note_delay", "open_fifo_for_reading", "open_fifo_for_writing"]

DEFAULT_OPEN_TIMEOUT = 600.0
"""Seconds a FIFO may stay unopened by the other side (`--open-timeout`): a database may take minutes to start writing."""

NOTE_AFTER = 5.0
_POLL = 0.05
_RELEASE_WITHIN = 5.0  # the helper enters open(2) within this long of being started, however loaded the host

Note = Callable[[], None]


def note_delay(timeout: float) -> float:
    """When to say what we wait for: after a few seconds, or halfway to a short deadline."""
    return min(NOTE_AFTER, timeout / 2)


def is_fifo(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def _seconds(timeout: float) -> str:
    return f"{timeout:g} s"


class _Deadline:
    """Tracks one wait: when to say so (once), and when to give up."""

    def __init__(self, timeout: float, note: Note | None) -> None:
        self.timeout = timeout
        self._note = note
        self._started = time.monotonic()
        self._noted = False

    def expired(self) -> bool:
        waited = time.monotonic() - self._started
        if not self._noted and waited >= note_delay(self.timeout):
            self._noted = True
            if self._note is not None:
                self._note()
        return waited >= self.timeout


class _ReadOpener:
    """A blocking open(O_RDONLY) in a helper thread, which can be given up."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.done = threading.Event()
        self.error: OSError | None = None
        self._fd: int | None = None
        self._abandoned = False
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="braid-open", daemon=True).start()

    def _run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            self.error = exc
        else:
            with self._lock:
                if self._abandoned:
                    os.close(fd)
                else:
                    self._fd = fd
        finally:
            self.done.set()

    def result(self) -> int:
        if self.error is not None:
            raise InputError(f"cannot open input {self.path}: {self.error.strerror}")
        assert self._fd is not None
        return self._fd

    def abandon(self) -> int | None:
        """Stop waiting; a descriptor if a writer came just in time (then it is the caller's)."""
        with self._lock:
            if self._fd is not None:
                return self._fd
            self._abandoned = True
        # ENXIO means the helper is not inside open(2) yet: keep trying until it leaves it.
        until = time.monotonic() + _RELEASE_WITHIN
        while not self.done.is_set() and time.monotonic() < until:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                pass
            else:
                os.close(fd)
            self.done.wait(_POLL)
        return None


def open_fifo_for_reading(path: str, *, timeout: float, note: Note | None = None, cancelled: threading.Event | None = None) -> int | None:
    """A blocking read descriptor once a writer opened `path`; None if `cancelled` came first.

    Raises InputError when no process opened it for writing within `timeout` seconds.
    """
    opener = _ReadOpener(path)
    deadline = _Deadline(timeout, note)
    while not opener.done.wait(_POLL):
        if cancelled is not None and cancelled.is_set():
            fd = opener.abandon()
            if fd is not None:
                os.close(fd)
            return None
        if deadline.expired():
            fd = opener.abandon()
            if fd is not None:
                return fd
            raise InputError(
                f"input {path}: no process opened it for writing within {_seconds(timeout)} (--open-timeout); "
                "start the backup that writes to it, or check the path"
            )
    return opener.result()


def open_fifo_for_writing(path: str, *, timeout: float, note: Note | None = None, cancelled: threading.Event | None = None) -> int | None:
    """A blocking write descriptor once a reader opened `path`; None if `cancelled` came first.

    Raises InputError when no process opened it for reading within `timeout` seconds.
    """
    deadline = _Deadline(timeout, note)
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise InputError(f"cannot open output {path}: {exc.strerror}") from None
        else:
            os.set_blocking(fd, True)
            return fd
        if deadline.expired():
            raise InputError(
                f"output {path}: no process opened it for reading within {_seconds(timeout)} (--open-timeout); "
                "start the restore that reads it, or check the path"
            )
        if cancelled is not None and cancelled.wait(_POLL):
            return None
        if cancelled is None:
            time.sleep(_POLL)
