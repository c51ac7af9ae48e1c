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

In both forms the stream must end with the producer: a stdout or pipe that
a process the command started still holds open 5 s after the command
exited fails the backup (exit 11), as Braid cannot judge that process's
output or its end.

A producer's stream cannot be read again, so such a backup is not
resumable: a failed cloud upload is abandoned at once (braid.agent).
"""

from __future__ import annotations

import io
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

from braid.engine.child import Child, program_name
from braid.engine.fifo_open import DEFAULT_OPEN_TIMEOUT, note_delay
from braid.engine.fifos import PipeDir, check_placeholders, substitute
from braid.engine.open_watch import OpenWatch
from braid.engine.pipe_buffer import widen
from braid.engine.stream import InputSource
from braid.errors import ProducerError, UsageError
from braid.format.buffers import WritableBuffer
from braid.ports.progress import ProgressFn

__all__ = ["Producer"]

# How long the producer's stdout may stay open after the producer exited.
# Its last bytes sit in the pipe whatever Braid is busy with; an open write
# end is another process, one the producer started and left running, whose
# output and exit status Braid cannot judge.
HELD_STDOUT_GRACE_SECONDS = 5.0


class _GuardedStdout(io.RawIOBase):
    """The producer's stdout for the reader, failing the read once `stop` is signalled.

    A blocked read() cannot be interrupted from another thread, so each
    read first polls the pipe together with a wake-up pipe (one poll per
    pipe-sized read: noise next to the copy).
    """

    def __init__(self, fd: int, wake: int, why: Callable[[], ProducerError], got: list[int] | None = None, index: int = 0) -> None:
        super().__init__()
        self._fd = fd
        self._why = why
        self._got, self._index = got, index  # bytes read so far, per pipe (the misread-pipe watch reads it)
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
        count = os.readv(self._fd, [buffer])
        if self._got is not None:
            self._got[self._index] += count
        return count

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
    got: list[int] | None = None

    def check(self) -> None:
        """Nothing to check: Braid made it, and it is open."""

    def open(self, **_: object) -> io.RawIOBase:
        assert self.why is not None
        return _GuardedStdout(os.dup(self.fd), self.wake, self.why, self.got, self.index)


_HELD_POLL_SECONDS = 0.1
_MISREAD_POLL_SECONDS = 1.0


def _read_only_elsewhere(path: str) -> bool:
    """Other processes hold the FIFO `path` open, all of them for reading only (/proc, this user's processes)."""
    try:
        target = os.stat(path)
    except OSError:
        return False
    me = os.getpid()
    readers = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            try:
                info = os.stat(f"/proc/{entry.name}/fd/{fd}")
                if (info.st_dev, info.st_ino) != (target.st_dev, target.st_ino):
                    continue
                with open(f"/proc/{entry.name}/fdinfo/{fd}") as fdinfo:
                    flags = int(next(line for line in fdinfo if line.startswith("flags:")).split()[1], 8)
            except (OSError, StopIteration, ValueError):
                continue
            if flags & os.O_ACCMODE != os.O_RDONLY:
                return False  # a writer: it may just be slow to write
            readers += 1
    return readers > 0


def _written(readers: Sequence[int]) -> list[int]:
    """Indexes of the pipes some process holds open for writing now (a reader polls POLLHUP once none does)."""
    poller = select.poll()
    for fd in readers:
        poller.register(fd, 0)  # POLLHUP and POLLERR are always reported
    ended = {fd for fd, events in poller.poll(0) if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL)}
    return [i for i, fd in enumerate(readers) if fd not in ended]


class Producer:
    """The command whose output is the backup; use as a context manager around the engine's run.

    Not started until entered, so a wrong repository or key never starts a
    database backup for nothing; on leaving, a producer still running (the
    backup failed) is stopped and the pipes are removed.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        pipes: int | None = None,
        open_timeout: float = DEFAULT_OPEN_TIMEOUT,
        progress: ProgressFn | None = None,
        echo: Callable[[bytes], None] | None = None,
    ) -> None:
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
        self._wake: tuple[int, int] | None = None  # a pipe: written to fail a read of a stdout (or pipe) held open too long
        self._held: list[int] = []  # the pipes still held open after the producer exited
        self._misread: list[int] = []  # the pipes it opened for reading, with no writer, for --open-timeout
        self._open_timeout = open_timeout
        self._progress = progress
        self._got: list[int] = [0] * (pipes or 0)
        self._closing = threading.Event()
        self._exit_seen = threading.Event()
        self._opens_at_exit: list[int] | None = None  # opens of each pipe by the time the producer exited

    def labels(self) -> list[str]:
        """The inputs' labels, known before the command starts (a cloud incremental's session names them first)."""
        return [f"stdout of {self.name}"] if self.pipes is None else [f"pipe{i + 1} of {self.name}" for i in range(self.pipes)]

    def __enter__(self) -> Producer:
        try:
            if self.pipes is None:
                self._child = Child("producer", self.argv, stdout=subprocess.PIPE, echo=self.echo)
                assert self._child.proc.stdout is not None
                stdout = self._child.proc.stdout.fileno()
                widen(stdout)
                self._wake = os.pipe()
                self.sources = [_StdoutSource(0, f"stdout of {self.name}", None, fd=stdout, wake=self._wake[0], why=self._held_stdout)]
                threading.Thread(target=self._watch_stdout, args=(self._child, stdout, self._wake[1]), name="braid-producer-stdout", daemon=True).start()
            else:
                self._dir = PipeDir(self.pipes, "backup")
                self._watch = OpenWatch(self._dir.paths)  # after Braid's own opens: every open it sees is the producer's
                # Its stdout goes to our stderr: our stdout carries only NAME@ID.
                self._child = Child("producer", substitute(self.argv, self._dir.paths), stdout=2, echo=self.echo)
                self._wake = os.pipe()
                self.sources = [
                    _StdoutSource(i, f"pipe{i + 1} of {self.name}", fifo.path, fd=fifo.reader, wake=self._wake[0], why=self._held_pipes, got=self._got)
                    for i, fifo in enumerate(self._dir.fifos)
                ]
                threading.Thread(
                    target=self._end_pipes_at_exit, args=(self._child, self._dir, self._wake[1]), name="braid-producer-exit", daemon=True
                ).start()
                threading.Thread(target=self._watch_misread, args=(self._dir, self._wake[1]), name="braid-producer-misread", daemon=True).start()
        except BaseException:
            self._close()
            raise
        return self

    def _end_pipes_at_exit(self, child: Child, pipes: PipeDir, wake: int) -> None:
        """The producer ended: let go of our writers, so each pipe ends once the producer's side closed.

        A pipe some other process holds open for writing for
        HELD_STDOUT_GRACE_SECONDS on end, from the producer's exit until the
        backup ends, fails the backup, as for stdout.
        """
        try:
            child.await_end()
            self._opens_at_exit = self._watch.counts() if self._watch is not None else None
        finally:
            self._exit_seen.set()
        try:
            readers = [fifo.reader for fifo in pipes.fifos]
            for fifo in pipes.fifos:
                fifo.release_writer()
            since: dict[int, float] = {}
            while not self._closing.wait(_HELD_POLL_SECONDS):
                now = time.monotonic()
                for i in _written(readers):
                    since.setdefault(i, now)
                for i in [i for i in since if i not in _written(readers)]:
                    del since[i]
                held = sorted(i for i, start in since.items() if now - start >= HELD_STDOUT_GRACE_SECONDS)
                if held:
                    self._held = held
                    os.write(wake, b"!")
                    return
        except (OSError, AssertionError):
            return  # closed under us (the backup failed or ended): the backup is over either way

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
        return self._held_open("its stdout")

    def _held_pipes(self) -> ProducerError:
        if self._misread:
            assert self._child is not None
            names = ", ".join(f"pipe{i + 1}" for i in self._misread)
            return self._child.failure(
                f"{self.name} opened {names} for reading, not writing, and no process wrote to it within {self._open_timeout:g} s (--open-timeout)",
                "nothing was published",
            )
        return self._held_open(", ".join(f"pipe{i + 1}" for i in self._held))

    def _watch_misread(self, pipes: PipeDir, wake: int) -> None:
        """While the producer runs: a pipe it opened only for reading (a producer bug) waits for ever on both sides.

        Seen as: opened by someone (inotify), nothing read from it, and the
        processes holding it (/proc) hold it for reading only. Said after a
        few seconds, and the backup fails at --open-timeout.
        """
        assert self._child is not None and self._watch is not None
        since: dict[int, float] = {}
        noted: set[int] = set()
        while not self._closing.wait(_MISREAD_POLL_SECONDS) and not self._child.ended():
            counts = self._watch.counts()
            if counts is None:
                return  # opens cannot be watched here
            now = time.monotonic()
            for i, fifo in enumerate(pipes.fifos):
                if not counts[i] or self._got[i] or not _read_only_elsewhere(fifo.path):
                    since.pop(i, None)
                    continue
                start = since.setdefault(i, now)
                if now - start >= note_delay(self._open_timeout) and i not in noted and self._progress is not None:
                    noted.add(i)
                    message = (
                        f"waiting for a writer on pipe{i + 1} of {self.name}: it opened the pipe for reading, not writing"
                        f" (giving up after {self._open_timeout:g} s, --open-timeout)"
                    )
                    self._progress({"event": "waiting", "input": f"pipe{i + 1} of {self.name}", "message": message})
            late = sorted(i for i, start in since.items() if now - start >= self._open_timeout)
            if late:
                self._misread = late
                try:
                    os.write(wake, b"!")
                except OSError:
                    pass
                return

    def _held_open(self, what: str) -> ProducerError:
        assert self._child is not None
        code = self._child.proc.wait()  # it ended (the watcher saw it): the status, without waiting on its stderr
        return self._child.failure(
            self._child.describe(
                code,
                f", but a process it started still held {what} open {HELD_STDOUT_GRACE_SECONDS:g} s later"
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
        if self._dir is not None:
            self._late_pipes()
        unopened = self._watch.unopened() if self._watch is not None else None
        if unopened:
            # Read as empty, a pipe never opened is not an empty stream but a missing one.
            names = ", ".join(f"pipe{i + 1}" for i in unopened)
            raise self._child.failure(
                self._child.describe(code, f" without ever opening {names} of the {self.pipes} pipes"), "nothing was published"
            )

    def _late_pipes(self) -> None:
        """Every input ended: a pipe held or opened again since the producer exited would have its bytes lost."""
        assert self._dir is not None and self._child is not None
        self._exit_seen.wait()
        readers = [fifo.reader for fifo in self._dir.fifos]
        late = set(_written(readers))
        counts = self._watch.counts() if self._watch is not None else None
        if counts is not None and self._opens_at_exit is not None:
            late |= {i for i, (now, then) in enumerate(zip(counts, self._opens_at_exit, strict=True)) if now > then}
        if late:
            names = ", ".join(f"pipe{i + 1}" for i in sorted(late))
            raise self._child.failure(
                self._child.describe(
                    0, f", but a process it started opened {names} after it exited (the stream must end with the producer: run the tool in the foreground)"
                ),
                "nothing was published",
            )

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self._close()

    def _close(self) -> None:
        self._closing.set()
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
