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
guarantees this needs. The consumer sees end-of-file only after the restore
wrote and verified every byte: on a failure the consumer is stopped first,
so it never takes a cut-short stream for a whole one. When the consumer
ends, Braid counts what it left in the pipes and takes (and counts)
whatever the restore still writes, so nothing blocks on a pipe nobody reads
and no byte is silently lost; the restore then stops, and the consumer that
ended early is named as the cause (exit 11).

Before the consumer starts, the caller checks every chunk is present: a
database restore may drop the old database as its first step, so it must
not be started for a backup that cannot be restored.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from braid.engine.child import Child, program_name
from braid.engine.fifos import PipeDir, check_placeholders, substitute
from braid.errors import InputError, ProducerError, UsageError
from braid.format.manifest import Manifest
from braid.ops.restore import OutputTarget
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
        watch: _Watch | None = None
        child: Child | None = None
        try:
            if self.pipes:
                child = Child("consumer", substitute(self.argv, pipes.paths))
                labels = [f"pipe{i} of {self.name}" for i in range(1, count + 1)]
            else:
                child = Child("consumer", self.argv, stdin=pipes.fifos[0].reader)
                labels = [f"stdin of {self.name}"]
            watch = _Watch(child, pipes)
            targets = [OutputTarget(label, fifo.path) for label, fifo in zip(labels, pipes.fifos, strict=True)]
            try:
                run(targets, watch.relay(progress))
            except (InputError, _ConsumerGone):
                if watch.gone.is_set():  # it stopped reading: that is why the restore stopped
                    raise self._early(child) from None
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
            pipes.close()

    def _early(self, child: Child) -> ProducerError:
        """It ended while the restore was still writing: its status, or "before reading the whole backup"."""
        code = child.wait()
        detail = "" if code != 0 else " before reading the whole backup"
        return child.failure(child.describe(code, detail), _INCOMPLETE)


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
