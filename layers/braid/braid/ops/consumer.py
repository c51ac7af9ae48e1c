"""`braid restore X -- COMMAND`: Braid runs the restore's consumer and judges it.

The mirror of braid.engine.producer. `braid restore X | tar -x` cannot tell
a consumer that took the whole backup from one that died, or stopped
reading early and exited 0: the shell sees only the last command's status.
Run by Braid, a restore succeeds only when the consumer exited 0 *and* took
every byte:

- one stream (`-- tar -x -C DIR`): the consumer's stdin is a pipe Braid
  holds; the backup must have one input;
- `--pipes -- db2 restore db SAMPLE from {pipes}`: one named pipe per input
  of the backup (N from the manifest), named in the command as for backup.

Braid holds both ends of every pipe (braid.engine.fifos), which gives the
guarantees this needs. The consumer sees a pipe's end-of-file only after
the restore wrote and verified every byte of that pipe's input: on a
failure the consumer is stopped first, so it never takes a cut-short stream
for a whole one. Each pipe ends on its own, as soon as its input is done
and the consumer has opened it: a reader that reads the pipes in turn
(Db2) needs a short input's end while the long ones still flow, and one
that reads them one after another (`cat {pipe1}; cat {pipe2}`) opens pipe 2
only after pipe 1 ended. A pipe is written only once the consumer opened
it (inotify, braid.engine.open_watch), and a consumer that has not opened
one within --open-timeout fails the restore (exit 5). When the consumer
ends, Braid counts what it left in the pipes and takes (and counts)
whatever the restore still writes, so nothing blocks on a pipe nobody reads
and no byte is silently lost; the restore then stops, and the consumer that
ended early is named as the cause (exit 11).

Before the consumer starts, the caller checks every chunk is present: a
database restore may drop the old database as its first step, so it must
not be started for a backup that cannot be restored.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from io import FileIO
from typing import Any

from braid.engine.child import Child, program_name
from braid.engine.fifo_open import note_delay
from braid.engine.fifos import HeldFifo, PipeDir, check_placeholders, substitute
from braid.engine.open_watch import OpenWatch
from braid.errors import InputError, ProducerError, UsageError
from braid.format.manifest import Manifest
from braid.ops.restore import OutputTarget
from braid.ops.restore_output import Output
from braid.ports.progress import ProgressFn

__all__ = ["Consumer"]

_INCOMPLETE = "the restore is incomplete"
_DRAIN_SECONDS = 0.05


class Consumer:
    """The command a restore writes into; `restore` runs it around the restore proper."""

    def __init__(self, argv: Sequence[str], *, pipes: bool) -> None:
        """Checks what can be checked before the backup is opened (the pipe count needs its manifest)."""
        if not argv:
            raise UsageError("give the command that reads the restore after --, e.g. braid restore pg@latest -- tar -x -C DIR")
        if not pipes:
            check_placeholders(argv, None, flag="--pipes")
        self.argv = list(argv)
        self.pipes = pipes
        self.name = program_name(argv)

    def check(self, manifest: Manifest) -> int:
        """The number of pipes this backup needs, or a UsageError naming the form that fits it."""
        count = len(manifest.inputs)
        if self.pipes:
            check_placeholders(self.argv, count, flag="--pipes")
        elif count != 1:
            raise UsageError(
                f"backup {manifest.backup} has {count} inputs; give the command one pipe per input: --pipes -- COMMAND naming {{pipes}} or {{pipe1}}..{{pipe{count}}}"
            )
        return count

    def restore(self, manifest: Manifest, run: Callable[[list[OutputTarget], ProgressFn], None], progress: ProgressFn) -> None:
        """Start the consumer and `run(targets, progress)` the restore into its pipes.

        Succeeds only if the consumer exited 0 having taken every byte; `run`
        must report each written chunk through the progress it is given,
        which stops the restore once the consumer is gone.
        """
        count = self.check(manifest)
        pipes = PipeDir(count, "restore")
        opens = _Opens(pipes.paths) if self.pipes else None  # after Braid's own opens: every open it sees is the consumer's
        watch: _Watch | None = None
        child: Child | None = None
        try:
            targets: list[OutputTarget]
            if self.pipes:
                child = Child("consumer", substitute(self.argv, pipes.paths))
                watch = _Watch(child, pipes)
                assert opens is not None
                targets = [
                    _ConsumerPipe(f"pipe{i} of {self.name}", fifo.path, fifo=fifo, index=i - 1, opens=opens, watch=watch)
                    for i, fifo in enumerate(pipes.fifos, start=1)
                ]
            else:
                child = Child("consumer", self.argv, stdin=pipes.fifos[0].reader)
                watch = _Watch(child, pipes)
                targets = [OutputTarget(f"stdin of {self.name}", pipes.fifos[0].path)]
            try:
                run(targets, watch.relay(progress))
            except (InputError, _ConsumerGone):
                if watch.gone.is_set():  # it stopped reading: that is why the restore stopped
                    raise self._early(child, opens) from None
                raise
            # Every byte is written and verified: only now may the consumer see the end.
            for fifo in pipes.fifos:
                fifo.release_writer()
            code = child.wait()
            unread = watch.finish(ended=True)
            if code != 0:
                raise child.failure(child.describe(code), _INCOMPLETE)
            if any(unread):
                where = ", ".join(f"{n} in pipe{i}" for i, n in enumerate(unread, start=1) if n) if self.pipes else str(sum(unread))
                raise child.failure(child.describe(code, f" before reading the whole backup ({where} byte(s) left unread)"), _INCOMPLETE)
        finally:
            if watch is not None:
                watch.finish(ended=False)
            if child is not None:
                child.stop()  # a failed restore: stopped before its pipes end, so it cannot mistake the cut for the end
            if opens is not None:
                opens.close()
            pipes.close()

    def _early(self, child: Child, opens: _Opens | None) -> ProducerError:
        """It ended while the restore was still writing: its status, or "before reading the whole backup"."""
        code = child.wait()
        detail = ""
        if code == 0:
            unopened = opens.unopened() if opens is not None else []
            never = f" (it never opened {', '.join(f'pipe{i + 1}' for i in unopened)})" if unopened else ""
            detail = f" before reading the whole backup{never}"
        return child.failure(child.describe(code, detail), _INCOMPLETE)


class _Opens:
    """Which pipes the consumer opened so far (inotify); shared by the restore's writer threads.

    Where opens cannot be watched (not Linux, out of inotify instances, lost
    events), every pipe counts as opened: pipes are then written at once, as
    before, and a consumer that reads them one after another may wait for ever.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self._watch = OpenWatch(paths)
        self._lock = threading.Lock()

    def unopened(self) -> list[int]:
        with self._lock:
            return self._watch.unopened() or []

    def opened(self, index: int) -> bool:
        return index not in self.unopened()

    def close(self) -> None:
        with self._lock:
            self._watch.close()


_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class _ConsumerPipe(OutputTarget):
    """One `--pipes` pipe as a restore output: written once the consumer opened it, ended once its input is done."""

    fifo: HeldFifo | None = None
    index: int = 0
    opens: _Opens | None = None
    watch: _Watch | None = None

    def open(self, *, timeout: float = 0.0, note: Callable[[], None] | None = None, cancelled: threading.Event | None = None) -> Output | None:
        """Through Braid's held writer, once the consumer opened this pipe; None if `cancelled` first.

        Raises InputError (exit 5) when the consumer did not open it within
        `timeout` seconds, and stops the restore when the consumer ended first.
        """
        assert self.fifo is not None and self.opens is not None and self.watch is not None
        started = time.monotonic()
        noted = False
        while not self.opens.opened(self.index):
            if self.watch.gone.is_set():
                raise _ConsumerGone(f"the consumer {self.watch.child.name} ended without opening {self.label}")
            waited = time.monotonic() - started
            if waited >= timeout:
                raise InputError(
                    f"{self.label}: the consumer did not open it for reading within {timeout:g} s (--open-timeout); the restore is incomplete"
                )
            if not noted and waited >= note_delay(timeout):
                noted = True
                if note is not None:
                    note()
            if cancelled is not None and cancelled.wait(_POLL_SECONDS):
                return None
            if cancelled is None:
                time.sleep(_POLL_SECONDS)
        return _PipeOutput(self.label, os.fdopen(self.fifo.writer(), "wb", buffering=0), self.fifo)


class _PipeOutput(Output):
    """Written through a duplicate of the held writer; `finish` (every byte written and verified) ends the pipe."""

    def __init__(self, label: str, handle: FileIO, fifo: HeldFifo) -> None:
        super().__init__(label, handle)
        self._fifo = fifo

    def finish(self) -> None:
        super().finish()
        self._fifo.release_writer()


class _ConsumerGone(Exception):
    """Raised into the restore from its progress once the consumer ended: stop writing."""


class _Watch:
    """Watches the consumer's end; from then on takes and counts what the restore still writes.

    At the consumer's exit, what it left in each pipe is counted, and the
    held readers are kept and drained instead of closed: the restore's
    writes (and pipe opens) then never block, every byte written after the
    consumer's end is counted, and the next chunk's progress raises, which
    stops the restore. A consumer that exits 0 before end-of-file (it knows
    where its format ends) succeeds only if the restore had written
    everything by then and the pipes held nothing.
    """

    def __init__(self, child: Child, pipes: PipeDir) -> None:
        self.child = child
        self.pipes = pipes
        self.gone = threading.Event()
        self._done = threading.Event()
        self._left = [0] * len(pipes.fifos)
        self._exited_0 = False
        self._thread = threading.Thread(target=self._run, name="braid-consumer-exit", daemon=True)
        self._thread.start()

    def relay(self, progress: ProgressFn) -> ProgressFn:
        """`progress`, raising once the consumer is gone for good: it failed, or bytes reached no one.

        A consumer that exited 0 with nothing left over may just have read
        the last chunk whose progress this is: that restore goes on to finish.
        """

        def relayed(event: dict[str, Any]) -> None:
            if self.gone.is_set() and (not self._exited_0 or any(self._left)):
                raise _ConsumerGone(f"the consumer {self.child.name} ended")
            progress(event)

        return relayed

    def _run(self) -> None:
        self._exited_0 = self.child.await_end()
        fifos = self.pipes.fifos
        self._left = [fifo.drain() for fifo in fifos]  # what it left, taken so a blocked writer goes on
        self.gone.set()
        while True:
            finishing = self._done.is_set()
            for i, fifo in enumerate(fifos):
                self._left[i] += fifo.drain()
            if finishing:
                return
            self._done.wait(_DRAIN_SECONDS)

    def finish(self, *, ended: bool) -> list[int]:
        """The restore wrote its last byte: per pipe, the bytes the consumer did not take.

        `ended`: the consumer was waited for, so the count is final once
        this thread saw the end too; otherwise (cleaning up) nothing is waited for.
        """
        self._done.set()
        if ended:
            self._thread.join()
        return list(self._left)
