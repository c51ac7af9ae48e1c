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

import os
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from io import FileIO
from types import TracebackType

from braid.engine.child import Child, program_name
from braid.engine.fifos import PipeDir, check_placeholders, substitute
from braid.engine.open_watch import OpenWatch
from braid.engine.stream import InputSource
from braid.errors import UsageError

__all__ = ["DescriptorSource", "Producer"]


@dataclass(frozen=True)
class DescriptorSource(InputSource):
    """An input Braid already holds open: a producer's stdout, or a pipe Braid made."""

    fd: int = -1

    def check(self) -> None:
        """Nothing to check: Braid made it, and it is open."""

    def open(self, **_: object) -> FileIO:
        """A duplicate, so the reader's close never closes ours (already open: no writer to wait for)."""
        return os.fdopen(os.dup(self.fd), "rb", buffering=0)


class Producer:
    """The command whose output is the backup; use as a context manager around the engine's run.

    Not started until entered, so a wrong repository or key never starts a
    database backup for nothing; on leaving, a producer still running (the
    backup failed) is stopped and the pipes are removed.
    """

    def __init__(self, argv: Sequence[str], *, pipes: int | None = None) -> None:
        if not argv:
            raise UsageError("give the command that writes the backup after --, e.g. braid backup --name pg -- pg_basebackup -Ft -D - -X fetch")
        check_placeholders(argv, pipes)
        self.argv = list(argv)
        self.pipes = pipes
        self.name = program_name(argv)
        self.sources: list[InputSource] = []
        self._child: Child | None = None
        self._dir: PipeDir | None = None
        self._watch: OpenWatch | None = None

    def __enter__(self) -> Producer:
        try:
            if self.pipes is None:
                self._child = Child("producer", self.argv, stdout=subprocess.PIPE)
                assert self._child.proc.stdout is not None
                self.sources = [DescriptorSource(0, f"stdout of {self.name}", None, fd=self._child.proc.stdout.fileno())]
            else:
                self._dir = PipeDir(self.pipes, "backup")
                self._watch = OpenWatch(self._dir.paths)  # after Braid's own opens: every open it sees is the producer's
                # Its stdout goes to our stderr: our stdout carries only NAME@ID.
                self._child = Child("producer", substitute(self.argv, self._dir.paths), stdout=2)
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
            if self._watch is not None:
                self._watch.close()
            if self._dir is not None:
                self._dir.close()
