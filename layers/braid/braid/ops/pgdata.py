"""Extract a restored tar stream into a PostgreSQL data directory, files written in parallel.

`restore --pgdata DIR` plugs `PgDataTarget` into the ordinary restore
(braid.ops.restore), so every byte reaching it was authenticated and
checked first. Its output parses the tar as it arrives
(braid.format.tar_stream): directories, links and empty files are made on
the restore's writer thread, in stream order; the data of each restored
chunk is cut into its files' byte ranges, which a small thread pool writes
with `pwrite` side by side (file writes release the GIL) while the
restore's decoders already decode the chunks after it. Large files are
written with O_DIRECT, past the page cache (policy `direct-restore`,
braid.ops.pg_direct). Each file is closed once written; at the end one
syncfs(2) makes them all durable, then each directory is fsynced.

DIR must be empty or absent (`check_pgdata`): a failed restore removes
what it extracted, so DIR is left as it was found. Member names are
relative, without `..`, and never lead through a symlink the archive made.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from braid.errors import InputError, IntegrityError, UsageError
from braid.format.tar_stream import DIRECTORY, HARDLINK, REGULAR, SYMLINK, MemberConsumer, TarFormatError, TarMember, TarStream
from braid.ops import pg_direct
from braid.ops.restore_output import Output, OutputTarget

__all__ = ["PgDataTarget", "check_pgdata", "server_running"]

_INLINE = 1 << 20  # a chunk's writes below this many bytes are done on the writer thread
_OPEN_COST = 1 << 18  # creating a file costs about as much as writing this many bytes (measured: ~2.6 ms a file on a busy disk)


def server_running(directory: str) -> int | None:
    """The pid in DIR/postmaster.pid if that process is alive, else None."""
    try:
        with open(os.path.join(directory, "postmaster.pid"), "rb") as handle:
            first = handle.readline().strip()
    except OSError:
        return None
    if not first.isdigit():
        return None
    pid = int(first)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def check_pgdata(directory: str) -> None:
    """Refuse (UsageError, exit 2, nothing written) a DIR that is not an empty directory, or whose parent is missing."""
    pid = server_running(directory)
    if pid is not None:
        raise UsageError(f"--pgdata {directory} holds the postmaster.pid of a running server (pid {pid}); stop it and give an empty directory")
    try:
        info = os.stat(directory)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(directory))
        if not os.path.isdir(parent):
            raise UsageError(f"--pgdata {directory}: directory {parent} does not exist") from None
        return
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"--pgdata {directory} is not a directory")
    try:
        entries = os.listdir(directory)
    except OSError as exc:
        raise UsageError(f"--pgdata {directory} cannot be read: {exc.strerror}") from None
    if entries:
        raise UsageError(f"--pgdata {directory} is not empty ({len(entries)} entries, e.g. {sorted(entries)[0]}); restore into an empty directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"--pgdata {directory} is not writable by this user")


@dataclass(frozen=True)
class PgDataTarget(OutputTarget):
    """The restore's one output: the data directory `path`, extracted with `writers` threads."""

    writers: int = 2

    def check(self, force: bool) -> None:
        assert self.path is not None
        check_pgdata(self.path)

    @property
    def partial_path(self) -> str | None:
        return None

    @property
    def ends_soon(self) -> bool:
        return True  # a failed restore waits for the writer to remove what it extracted

    def open(self, *, timeout: float = 0.0, note: Callable[[], None] | None = None, cancelled: threading.Event | None = None) -> Output | None:
        assert self.path is not None
        return TarExtract(self.label, self.path, self.writers)


Payload = memoryview | tuple[memoryview | bytes, ...]
"""A queued range of a file: its bytes, or a direct file's whole-block piece in parts (braid.ops.pg_direct)."""
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _File:
    """One regular member being written: opened by the pool task that writes its first range, then pwrite at offsets.

    At most one range of a file is queued per chunk, and a chunk's ranges are all written before the next chunk's
    are queued. A page-cache file is written by one thread at a time, in order. A direct file's range is queued as
    whole-block pieces (braid.ops.pg_direct), which writer threads may write side by side: it is opened under a
    lock, and closed only once every piece is written."""

    def __init__(self, owner: TarExtract, path: str, member: TarMember, direct: bool) -> None:
        self.owner = owner
        self.path = path
        self.fd: int | None = None  # opened by a writer thread: file creation is most of a data directory's cost
        self.member = member
        self.written = 0
        self.direct = pg_direct.DirectWriter(member.size) if direct else None
        self.lock = threading.Lock() if direct else None

    def open(self) -> int:
        if self.fd is None:
            mode = self.member.mode & 0o7777 or 0o600
            if self.direct is None or self.lock is None:
                self.fd = os.open(self.path, _FLAGS, mode)
                return self.fd
            with self.lock:
                if self.fd is None:
                    self.fd, self.direct.direct = pg_direct.open_direct(self.path, _FLAGS, mode)
        assert self.fd is not None
        return self.fd

    def put(self, data: Payload, offset: int) -> None:
        """Write one range, or one direct piece (on a writer thread)."""
        fd = self.open()
        if not isinstance(data, memoryview):
            assert self.direct is not None
            self.direct.write(fd, offset, data)
            return
        view = data
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written

    def end(self) -> None:
        """The last block, the member's mtime, then close (on a writer thread)."""
        fd = self.open()
        try:
            if self.direct is not None:
                self.direct.end(fd)
            os.utime(fd, (self.member.mtime, self.member.mtime))
        finally:
            os.close(fd)

    def write(self, data: memoryview) -> None:
        if self.direct is None:
            self.owner.tasks.append((self, data, self.written))
        else:
            self.owner.tasks.extend((self, parts, position) for position, parts in self.direct.plan(data, self.written))
            self.owner.direct_queued = True
        self.written += len(data)

    def close(self) -> None:
        self.owner.closing.append(self)


class TarExtract(Output):
    """The Output of a PgDataTarget: the tar stream in, the data directory out (see the module docstring)."""

    def __init__(self, label: str, directory: str, writers: int) -> None:  # no file handle: Output's methods are all replaced
        self.label = label
        self.partial = None
        self.final = None
        self.root = os.path.abspath(directory)
        self.created_root = not os.path.exists(self.root)
        if self.created_root:
            os.mkdir(self.root, 0o700)
        os.chmod(self.root, 0o700)
        self.tasks: list[tuple[_File, Payload, int]] = []
        self.direct_queued = False
        self.closing: list[_File] = []
        self.open_files: list[_File] = []
        self.symlinks: set[str] = set()
        self.directories: set[str] = {self.root}
        self.pool = ThreadPoolExecutor(max_workers=max(1, writers), thread_name_prefix="braid-pgdata")
        self.writers = max(1, writers)
        self.direct = pg_direct.applies(self.root)
        self.parser = TarStream(self._member)

    def _path(self, name: str) -> str:
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if not parts or name.startswith("/") or ".." in parts:
            raise IntegrityError(f"the backup's tar names {name!r}, which is not a path inside the data directory; nothing is extracted there")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in self.symlinks:
                raise IntegrityError(f"the backup's tar names {name!r}, which leads through a symlink it made")
        return os.path.join(self.root, *parts)

    def _parent(self, path: str) -> None:
        parent = os.path.dirname(path)
        if parent not in self.directories:
            os.makedirs(parent, 0o700, exist_ok=True)
            self.directories.add(parent)

    def _member(self, member: TarMember) -> MemberConsumer | None:
        path = self._path(member.name)
        relative = os.path.relpath(path, self.root)
        mode = member.mode & 0o7777
        if member.kind == DIRECTORY:
            if path != self.root:
                self._parent(path)
                os.makedirs(path, 0o700, exist_ok=True)
                os.chmod(path, mode or 0o700)
                self.directories.add(path)
            return None
        self._parent(path)
        if member.kind == SYMLINK:
            os.symlink(member.linkname, path)
            self.symlinks.add(relative)
            return None
        if member.kind == HARDLINK:
            self._flush()  # its target may be a file whose creation is still queued for the writers
            os.link(self._path(member.linkname), path, follow_symlinks=False)
            return None
        if member.kind != REGULAR:
            raise IntegrityError(f"the backup's tar holds {member.name!r} of type {member.kind!r}; a data directory has only files, directories and links")
        handle = _File(self, path, member, self.direct and member.size >= pg_direct.DIRECT_MIN)
        self.open_files.append(handle)
        return handle

    def write(self, data: memoryview) -> None:
        try:
            self.parser.feed(data)
            self._flush()
        except TarFormatError as exc:
            raise IntegrityError(f"the backup is not a tar PostgreSQL can start from ({exc}); restore it without --pgdata") from None
        except OSError as exc:
            raise InputError(f"error writing --pgdata {self.root}: {exc.strerror or exc} ({exc.filename or ''})") from None

    def _flush(self) -> None:
        """Write this chunk's file ranges, in parallel when there are enough bytes, then close the finished files."""
        tasks, self.tasks = self.tasks, []
        closing, self.closing = self.closing, []
        total = sum(_weight(handle, data) for handle, data, _ in tasks) + _OPEN_COST * len(closing)
        direct, self.direct_queued = self.direct_queued, False
        if total < _INLINE or self.writers == 1 or len(tasks) + len(closing) < 2:
            _write_all(tasks, closing)
        elif direct:  # a direct file's pieces may be in several runs: every piece is written before any file is closed
            self._run(_split(tasks, [], self.writers))
            _write_all([], closing)
        else:
            self._run(_split(tasks, closing, self.writers))
        done = {id(f) for f in closing}
        self.open_files = [f for f in self.open_files if id(f) not in done]

    def _run(self, groups: list[tuple[list[tuple[_File, Payload, int]], list[_File]]]) -> None:
        for future in [self.pool.submit(_write_all, group_tasks, group_closing) for group_tasks, group_closing in groups]:
            future.result()

    def finish(self) -> None:
        try:
            self.parser.end()
        except TarFormatError as exc:
            raise IntegrityError(f"the backup's tar stream is incomplete ({exc})") from None
        if not self.parser.ended:
            raise IntegrityError("the backup's tar stream has no end-of-archive blocks; restore it without --pgdata")
        self.pool.shutdown()
        try:
            sync_filesystem(self.root)
            for directory in sorted(self.directories, key=len, reverse=True):
                fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise InputError(f"error syncing --pgdata {self.root}: {exc.strerror or exc}") from None

    def discard(self) -> None:
        """The restore failed: remove what was extracted, leaving DIR as it was found (absent, or empty)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        for handle in self.open_files:
            try:
                if handle.fd is not None:
                    os.close(handle.fd)
            except OSError:
                pass
        self.open_files = []
        if self.created_root:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        for entry in os.listdir(self.root):
            path = os.path.join(self.root, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def commit(self) -> str | None:
        return None


def _split(tasks: list[tuple[_File, Payload, int]], closing: list[_File], groups: int) -> list[tuple[list[tuple[_File, Payload, int]], list[_File]]]:
    """Cut the ranges into `groups` runs of about equal bytes; a file is closed by the run that writes its last range."""
    total = sum(_weight(handle, data) for handle, data, _ in tasks) + _OPEN_COST * len(closing) or 1
    share = -(-total // groups)
    runs: list[tuple[list[tuple[_File, Payload, int]], list[_File]]] = [([], [])]
    filled = 0
    last_run: dict[int, int] = {}
    for task in tasks:
        if filled >= share and len(runs) < groups:
            runs.append(([], []))
            filled = 0
        runs[-1][0].append(task)
        filled += _weight(task[0], task[1])
        last_run[id(task[0])] = len(runs) - 1
    spare = 0
    for handle in closing:  # an empty file (no range) is created by the run it is closed by: spread them out
        run = last_run.get(id(handle))
        if run is None:
            run, spare = spare % len(runs), spare + 1
        runs[run][1].append(handle)
    return runs


def _weight(handle: _File, data: Payload) -> int:
    size = data.nbytes if isinstance(data, memoryview) else sum(len(part) for part in data)
    return size + (_OPEN_COST if handle.fd is None else 0)


def _write_all(tasks: list[tuple[_File, Payload, int]], closing: list[_File]) -> None:
    for handle, data, offset in tasks:
        handle.put(data, offset)
    for handle in closing:
        handle.end()


def sync_filesystem(directory: str) -> None:
    """Every file written under `directory` on stable storage: one syncfs(2) of its file system (Linux), else sync(2).

    One call instead of an fsync per file: a data directory holds thousands
    of small files, and an fsync each made extraction 2.3x slower than
    `tar -x` (measured, docs/design/pitr-restore.md).
    """
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syncfs(fd) == 0:
                return
        except (OSError, AttributeError):
            pass
        os.sync()
    finally:
        os.close(fd)


