"""`braid backup -- COMMAND`: Braid runs the producer and judges it before publishing.

In `pg_basebackup ... | braid backup` a producer that fails, or is killed
mid-stream, closes the pipe exactly as one that finished: Braid would
publish a truncated or empty backup, and `set -o pipefail` only tells the
shell after that. Run by Braid, the producer's exit status is part of the
stream: its verdict is the first question of the stream gate
(braid.engine.gate), asked after the last byte and before anything is
published, so a backup is published only when its producer exited 0.

Two forms:

- one stream: the command's stdout is the backup's only input (its stderr
  passes through to ours);
- `--pipes N`: Braid makes N named pipes (braid.engine.fifos), puts their
  paths into the command (`{pipes}`, `{pipe1}`..), reads them all at once,
  and ends each input when the command exits; the command's stdout goes to
  our stderr, so stdout stays the NAME@ID contract.

A producer's stream cannot be read again, so such a backup is not
resumable: a failed cloud upload is abandoned at once (braid.agent).
"""

from __future__ import annotations

import io
import os
import select
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from io import FileIO
from types import TracebackType

from braid.engine.child import Child, program_name
from braid.engine.fifos import PipeDir, check_placeholders, substitute
from braid.engine.open_watch import OpenWatch
from braid.engine.stream import InputSource
from braid.errors import ProducerError, UsageError
from braid.format.buffers import WritableBuffer

__all__ = ["DescriptorSource", "Producer"]

# How long the producer's stdout may stay open after the producer exited.
# Its last bytes sit in the pipe whatever Braid is busy with; an open write
# end is another process, one the producer started and left running, whose
# output and exit status Braid cannot judge.
HELD_STDOUT_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class DescriptorSource(InputSource):
    """An input Braid already holds open: a producer's stdout, or a pipe Braid made."""

    fd: int = -1

    def check(self) -> None:
        """Nothing to check: Braid made it, and it is open."""

    def open(self, **_: object) -> FileIO:
        """A duplicate, so the reader's close never closes ours (already open: no writer to wait for)."""
        return os.fdopen(os.dup(self.fd), "rb", buffering=0)


class _GuardedStdout(io.RawIOBase):
    """The producer's stdout for the reader, failing the read once `stop` is signalled.

    A blocked read() cannot be interrupted from another thread, so each
    read first polls the pipe together with a wake-up pipe (one poll per
    pipe-sized read: noise next to the copy).
    """

    def __init__(self, fd: int, wake: int, why: Callable[[], ProducerError]) -> None:
        super().__init__()
        self._fd = fd
        self._why = why
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._poll.register(wake, select.POLLIN)
        self._wake = wake

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: WritableBuffer) -> int:  # type: ignore[override]
        ready = dict(self._poll.poll())
        if ready.get(self._wake):
            raise self._why()
        return os.readv(self._fd, [buffer])

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


@dataclass(frozen=True)
class _StdoutSource(InputSource):
    """The producer's stdout: the one-stream form's input."""

    fd: int = -1
    wake: int = -1
    why: Callable[[], ProducerError] | None = None

    def check(self) -> None:
        """Nothing to check: Braid made it, and it is open."""

    def open(self, **_: object) -> io.RawIOBase:
        assert self.why is not None
        return _GuardedStdout(os.dup(self.fd), self.wake, self.why)


class Producer:
    """The command whose output is the backup; use as a context manager around the engine's run.

    Not started until entered, so a wrong repository or key never starts a
    database backup for nothing; on leaving, a producer still running (the
    backup failed) is stopped and the pipes are removed.
    """

    def __init__(self, argv: Sequence[str], *, pipes: int | None = None, echo: Callable[[bytes], None] | None = None) -> None:
        if not argv:
            raise UsageError("give the command that writes the backup after --, e.g. braid backup --name pg -- pg_basebackup -Ft -D - -X fetch")
        check_placeholders(argv, pipes)
        self.argv = list(argv)
        self.pipes = pipes
        self.echo = echo  # how the command's stderr is shown (braid.engine.child.Child)
        self.name = program_name(argv)
        self.sources: list[InputSource] = []
        self._child: Child | None = None
        self._dir: PipeDir | None = None
        self._watch: OpenWatch | None = None
        self._wake: tuple[int, int] | None = None  # a pipe: written to fail a read of a stdout held open too long

    def __enter__(self) -> Producer:
        try:
            if self.pipes is None:
                self._child = Child("producer", self.argv, stdout=subprocess.PIPE, echo=self.echo)
                assert self._child.proc.stdout is not None
                stdout = self._child.proc.stdout.fileno()
                self._wake = os.pipe()
                self.sources = [_StdoutSource(0, f"stdout of {self.name}", None, fd=stdout, wake=self._wake[0], why=self._held_stdout)]
                threading.Thread(target=self._watch_stdout, args=(self._child, stdout, self._wake[1]), name="braid-producer-stdout", daemon=True).start()
            else:
                self._dir = PipeDir(self.pipes, "backup")
                self._watch = OpenWatch(self._dir.paths)  # after Braid's own opens: every open it sees is the producer's
                # Its stdout goes to our stderr: our stdout carries only NAME@ID.
                self._child = Child("producer", substitute(self.argv, self._dir.paths), stdout=2, echo=self.echo)
                self.sources = [
                    DescriptorSource(i, f"pipe{i + 1} of {self.name}", fifo.path, fd=fifo.reader) for i, fifo in enumerate(self._dir.fifos)
                ]
                threading.Thread(target=self._end_pipes_at_exit, args=(self._child, self._dir), name="braid-producer-exit", daemon=True).start()
        except BaseException:
            self._close()
            raise
        return self

    @staticmethod
    def _end_pipes_at_exit(child: Child, pipes: PipeDir) -> None:
        """The producer ended: let go of our writers, so each pipe ends once the producer's side closed."""
        child.await_end()
        for fifo in pipes.fifos:
            fifo.release_writer()

    @staticmethod
    def _watch_stdout(child: Child, stdout: int, wake: int) -> None:
        """After the producer exited, give its stdout's other holders a grace; then fail the read.

        POLLHUP says no writer is left (data may still be buffered), so the
        check does not depend on how far behind the reader is.
        """
        child.await_end()
        poller = select.poll()
        poller.register(stdout, 0)  # POLLHUP and POLLERR are always reported
        try:
            for _fd, events in poller.poll(HELD_STDOUT_GRACE_SECONDS * 1000):
                if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    return
            os.write(wake, b"!")
        except OSError:
            return  # closed under us: the backup is over either way

    def _held_stdout(self) -> ProducerError:
        assert self._child is not None
        code = self._child.proc.wait()  # it ended (the watcher saw it): the status, without waiting on its stderr
        return self._child.failure(
            self._child.describe(
                code,
                f", but a process it started still held its stdout open {HELD_STDOUT_GRACE_SECONDS:g} s later"
                " (the stream must end with the producer: run the tool in the foreground)",
            ),
            "nothing was published",
        )

    def verdict(self) -> None:
        """Wait for the producer to end; raise ProducerError unless it exited 0 (the stream gate's first question)."""
        assert self._child is not None, "the producer was not started"
        code = self._child.wait()
        if code != 0:
            raise self._child.failure(self._child.describe(code), "nothing was published")
        unopened = self._watch.unopened() if self._watch is not None else None
        if unopened:
            # Read as empty, a pipe never opened is not an empty stream but a missing one.
            names = ", ".join(f"pipe{i + 1}" for i in unopened)
            raise self._child.failure(
                self._child.describe(code, f" without ever opening {names} of the {self.pipes} pipes"), "nothing was published"
            )

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self._close()

    def _close(self) -> None:
        try:
            if self._child is not None:
                self._child.stop()
                if self._child.proc.stdout is not None:
                    self._child.proc.stdout.close()
        finally:
            if self._wake is not None:
                for fd in self._wake:
                    os.close(fd)
                self._wake = None
            if self._watch is not None:
                self._watch.close()
            if self._dir is not None:
                self._dir.close()
