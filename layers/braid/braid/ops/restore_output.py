"""Where restored bytes go: stdout, a named pipe, or a regular file, safely.

A regular file is never written under its own name: restore writes
`PATH.braid-partial`, fsyncs it, and only when every output of the restore
succeeded renames it over PATH and fsyncs the directory. So a chunk found
missing or corrupt half-way leaves no half file under the real name, and
`--force` never destroys a good file before a replacement is complete.
A failed restore removes its partial files.

A named pipe is opened for writing with a deadline (braid.engine.fifo_open): a
database restore tool that never opens its pipe fails the restore with
exit 5 instead of hanging it. stdout and pipes stream; they cannot be taken
back, which is why restore checks every chunk is present before the first
byte (braid.ops.restore).
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from io import FileIO

from braid.engine.fifo_open import DEFAULT_OPEN_TIMEOUT, is_fifo, open_fifo_for_writing
from braid.engine.pipe_buffer import widen
from braid.errors import InputError

PARTIAL_SUFFIX = ".braid-partial"


@dataclass(frozen=True)
class OutputTarget:
    label: str
    path: str | None  # None: stdout

    def check(self, force: bool) -> None:
        """Before any chunk is fetched: refuse an output that cannot work or would overwrite a file unasked."""
        if self.path is None:
            return
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError:
            parent = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(parent):
                raise InputError(f"output {self.path}: directory {parent} does not exist") from None
            return
        except OSError as exc:
            raise InputError(f"output {self.path} cannot be used: {exc.strerror}") from None
        if stat.S_ISDIR(mode):
            raise InputError(f"output {self.path} is a directory")
        if stat.S_ISREG(mode) and os.path.getsize(self.path) > 0 and not force:
            raise InputError(f"output {self.path} already exists; remove it or pass --force to overwrite")

    @property
    def ends_soon(self) -> bool:
        """Whether its writer always ends soon once the restore is cancelled (it writes here, not to a reader), so a failed restore waits for it."""
        return self.partial_path is not None

    @property
    def partial_path(self) -> str | None:
        """Where a regular-file output is written until the restore succeeded; None for stdout, pipes, devices."""
        if self.path is None:
            return None
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):
            return None
        return os.path.realpath(self.path) + PARTIAL_SUFFIX

    def open(
        self,
        *,
        timeout: float = DEFAULT_OPEN_TIMEOUT,
        note: Callable[[], None] | None = None,
        cancelled: threading.Event | None = None,
    ) -> Output | None:
        """The opened output; None if `cancelled` while waiting for a pipe's reader."""
        if self.path is None:
            fd = os.dup(sys.stdout.fileno())
            widen(fd)
            return Output(self.label, os.fdopen(fd, "wb", buffering=0))
        if is_fifo(self.path):
            got = open_fifo_for_writing(self.path, timeout=timeout, note=note, cancelled=cancelled)
            if got is None:
                return None
            widen(got)
            return Output(self.label, os.fdopen(got, "wb", buffering=0))
        partial = self.partial_path
        if partial is None:  # a device, e.g. /dev/null: written in place
            return Output(self.label, self._open_in_place())
        return Output(self.label, _create_partial(partial, self.path), partial=partial, final=partial.removesuffix(PARTIAL_SUFFIX))

    def _open_in_place(self) -> FileIO:
        assert self.path is not None
        try:
            return open(self.path, "wb", buffering=0)
        except OSError as exc:
            raise InputError(f"cannot open output {self.path}: {exc.strerror}") from None


def _create_partial(partial: str, path: str) -> FileIO:
    """A fresh partial file (a leftover of an interrupted restore is replaced), with the mode of the file it will replace."""
    try:
        try:
            os.unlink(partial)
        except FileNotFoundError:
            pass
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise InputError(f"cannot create {partial} for output {path}: {exc.strerror}") from None
    try:
        os.chmod(fd, stat.S_IMODE(os.stat(path).st_mode))
    except FileNotFoundError:
        pass  # a new file: the umask decides, as for any file the user creates
    except OSError:
        os.close(fd)
        os.unlink(partial)
        raise
    return os.fdopen(fd, "wb", buffering=0)


class Output:
    """One opened output; `finish` makes its bytes durable, `commit` puts a file under its name."""

    def __init__(self, label: str, handle: FileIO, *, partial: str | None = None, final: str | None = None) -> None:
        self.label = label
        self.handle = handle
        self.partial = partial
        self.final = final

    def write(self, data: memoryview) -> None:
        view = data
        try:
            while view:
                written = self.handle.write(view)
                if written is None:
                    continue
                view = view[written:]
        except BrokenPipeError:
            raise InputError(f"output {self.label} was closed by its reader before the restore finished") from None
        except OSError as exc:
            raise InputError(f"error writing output {self.label}: {exc.strerror or exc}") from None

    def finish(self) -> None:
        """Every byte written and verified: on stable storage before exit 0 (files; pipes have nothing to sync)."""
        try:
            if stat.S_ISREG(os.fstat(self.handle.fileno()).st_mode):
                os.fsync(self.handle.fileno())
        except OSError as exc:
            raise InputError(f"error writing output {self.label}: {exc.strerror or exc}") from None
        finally:
            self.handle.close()

    def discard(self) -> None:
        """The restore failed: close, and remove the partial file (the real one, if any, is untouched)."""
        self.handle.close()
        if self.partial is not None:
            remove_partial(self.partial)

    def commit(self) -> str | None:
        """Rename the finished partial file over its real name; the directory to fsync, if any."""
        if self.partial is None or self.final is None:
            return None
        try:
            os.replace(self.partial, self.final)
        except OSError as exc:
            raise InputError(f"cannot rename {self.partial} to {self.final}: {exc.strerror}") from None
        return os.path.dirname(self.final)


def remove_partial(partial: str) -> None:
    try:
        os.unlink(partial)
    except FileNotFoundError:
        pass


def commit_all(outputs: Iterable[Output]) -> None:
    """Every output succeeded: put the files under their names, then make the renames durable."""
    directories = {d for d in (output.commit() for output in outputs) if d is not None}
    for directory in sorted(directories):
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise InputError(f"cannot sync directory {directory}: {exc.strerror}") from None
        try:
            os.fsync(fd)
        except OSError as exc:
            raise InputError(f"cannot sync directory {directory}: {exc.strerror}") from None
        finally:
            os.close(fd)

