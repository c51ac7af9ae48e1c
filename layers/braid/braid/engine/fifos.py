"""Named pipes Braid makes for a command, and the `{pipes}` placeholders that name them.

`braid backup --pipes 3 -- db2 backup db SAMPLE to {pipes}` and its restore
mirror hand a database tool pipes it writes (or reads) in parallel. Braid
creates them in a private directory (mode 0700, pipes 0600; removed
afterwards), substitutes their paths into the command, and holds both ends
of each pipe itself for as long as the command runs. Holding both ends is
what makes the command's end, not the pipe's, decide the stream's end:

- opening never blocks: whichever side opens first finds a partner, so a
  command that dies before opening a pipe cannot leave Braid waiting in
  open() forever;
- a reader sees end-of-file only when Braid lets go of its held writer
  (after the producer exited; after a restore verified every byte of that
  pipe's input), so a consumer never takes a stream cut short by a failure
  for a complete one;
- once a consumer is gone, the held reader takes (`drain`) and counts what
  it left in the pipe and whatever the restore still writes, so nothing
  blocks on a pipe nobody reads and no byte it did not take goes unnoticed.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
from collections.abc import Sequence

from braid.engine.pipe_buffer import widen
from braid.errors import UsageError

__all__ = ["HeldFifo", "PipeDir", "check_placeholders", "substitute"]

_PLACEHOLDER = re.compile(r"\{pipe(s|\d+)\}", re.ASCII)


def check_placeholders(argv: Sequence[str], count: int | None, flag: str = "--pipes N") -> None:
    """Refuse a command whose placeholders cannot name exactly `count` pipes (None: no pipes made).

    With pipes, every pipe must be named (by `{pipes}`, or each `{pipeK}`):
    a pipe the command never opens would hold half of the backup.
    """
    found = [m.group(1) for arg in argv for m in _PLACEHOLDER.finditer(arg)]
    if count is None:
        if found:
            raise UsageError(f"the command names pipes ({', '.join('{pipe' + f + '}' for f in found)}) but Braid makes none: add {flag}")
        return
    if "s" in found:
        numbers = set(range(1, count + 1))
    else:
        numbers = {int(f) for f in found}
    outside = sorted(n for n in numbers if not 1 <= n <= count)
    if outside:
        raise UsageError(f"the command names {{pipe{outside[0]}}}, but there are {count} pipes ({{pipe1}}..{{pipe{count}}})")
    missing = sorted(set(range(1, count + 1)) - numbers)
    if missing:
        named = "none of them" if not numbers else f"only {', '.join(f'{{pipe{n}}}' for n in sorted(numbers))}"
        raise UsageError(f"the command must name every one of the {count} pipes, with {{pipes}} or {{pipe1}}..{{pipe{count}}}; it names {named}")


def substitute(argv: Sequence[str], paths: Sequence[str]) -> list[str]:
    """The command with `{pipes}` as the paths joined by ", " (Db2's list syntax) and `{pipeK}` as path K."""

    def one(match: re.Match[str]) -> str:
        which = match.group(1)
        return ", ".join(paths) if which == "s" else paths[int(which) - 1]

    return [_PLACEHOLDER.sub(one, arg) for arg in argv]


class HeldFifo:
    """One pipe with both ends held by Braid; each end is let go of once, from any thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        # Read end first, non-blocking (no writer yet), so the write end opens at once.
        self._reader: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._writer: int | None = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except BaseException:
            os.close(self._reader)
            raise
        os.set_blocking(self._reader, True)  # shared with a consumer that takes it as its stdin
        widen(self._reader)

    @property
    def reader(self) -> int:
        """The held read end (a producer's pipe to read, a consumer's stdin); only while held."""
        assert self._reader is not None, "the held reader was let go of"
        return self._reader

    def drain(self) -> int:
        """Read and drop whatever is in the pipe now; the byte count. For after the consumer ended:
        the restore's writes then neither block nor reach anyone, and each one is counted."""
        with self._lock:
            if self._reader is None:
                return 0
            os.set_blocking(self._reader, False)  # the consumer that shared it is gone
            total = 0
            while True:
                try:
                    data = os.read(self._reader, 1 << 20)
                except BlockingIOError:
                    return total
                if not data:
                    return total
                total += len(data)

    def writer(self) -> int:
        """A duplicate of the held write end (the caller closes it): writing through it opens nothing,
        so an open of the path is always another process's (braid.engine.open_watch)."""
        with self._lock:
            assert self._writer is not None, "the held writer was let go of"
            return os.dup(self._writer)

    def release_writer(self) -> None:
        """Let go of the held writer: readers see end-of-file once every other writer closed."""
        with self._lock:
            fd, self._writer = self._writer, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self.release_writer()
        with self._lock:
            fd, self._reader = self._reader, None
        if fd is not None:
            os.close(fd)


class PipeDir:
    """`count` named pipes, pipe1..pipeN, in a private temporary directory; `close` removes it."""

    def __init__(self, count: int, role: str) -> None:
        if count < 1:
            raise UsageError("--pipes needs at least 1 pipe")
        self.root = tempfile.mkdtemp(prefix=f"braid-{role}-")  # mode 0700: only this user opens the pipes
        self.fifos: list[HeldFifo] = []
        try:
            for number in range(1, count + 1):
                path = os.path.join(self.root, f"pipe{number}")
                os.mkfifo(path, 0o600)
                self.fifos.append(HeldFifo(path))
        except BaseException:
            self.close()
            raise

    @property
    def paths(self) -> list[str]:
        return [fifo.path for fifo in self.fifos]

    def close(self) -> None:
        for fifo in self.fifos:
            fifo.close()
        shutil.rmtree(self.root, ignore_errors=True)
