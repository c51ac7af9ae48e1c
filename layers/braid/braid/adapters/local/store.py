"""ObjectStore over a local directory: the embedded default's repository.

Writes go to a temporary file in the target directory, are fsynced, then
linked (create-only) or renamed into place, so a reader never sees a partial
object and a crash leaves at most a `.tmp-*` file that is not part of the
repository.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from braid.errors import AlreadyExistsError, IntegrityError, NotFoundError, PermissionDeniedError, StorageError
from braid.format.buffers import WritableBuffer, new_buffer, read_full
from braid.format.checksum import stored_checksum
from braid.ports.store import Buffer, ObjectInfo

_TMP_PREFIX = ".tmp-"
_PREFETCH_STEP = 128 * 1024


def _storage_error(action: str, path: Path, exc: OSError) -> StorageError:
    if exc.errno == errno.ENOSPC:
        return StorageError(f"repository disk is full while {action} {path}; free space and run the backup again")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PermissionDeniedError(f"permission denied while {action} {path}: fix its owner or mode (a run as another user?)")
    if exc.errno == errno.EROFS:
        return StorageError(f"permission denied while {action} {path}")
    return StorageError(f"error while {action} {path}: {exc.strerror or exc}")


def _drop_cache(fd: int) -> None:
    """Chunks are written once and read once: keep them out of the page cache.

    On a database host the page cache belongs to the database; a backup that
    fills it with chunks evicts hot pages (and makes the kernel reclaim under
    memory limits, which we measured costing more CPU than the writes).
    Pages still dirty are not dropped: Linux starts writing them back
    (without waiting) and drops only the clean ones.
    """
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def _fsync_directory(directory: Path) -> None:
    """A new name is durable only once its directory is synced."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on directories; the data itself is synced
    finally:
        os.close(fd)


def _modified(status: os.stat_result) -> datetime:
    return datetime.fromtimestamp(status.st_mtime, UTC)


def _unlistable(exc: OSError) -> None:
    """os.walk's onerror: a directory that is not there lists as empty; one
    that cannot be read fails the listing (by default os.walk skips it, and
    `list` would silently report no backups)."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return
    raise _storage_error("listing", Path(exc.filename or "?"), exc)


class LocalStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def url(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"invalid object key {key!r}")
        return self.root / key

    def put(
        self, key: str, data: Buffer, *, checksum: str | None = None, create_only: bool = False, durable: bool = True, replacing: str | None = None
    ) -> None:
        path = self._path(key)
        if checksum is not None and stored_checksum(data) != checksum:
            raise StorageError(f"checksum mismatch writing {path}: data changed in memory before it was stored")
        tmp_name: str | None = None
        try:
            created = not path.parent.is_dir()
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=path.parent)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                if durable:
                    os.fsync(handle.fileno())
                # Durable: the pages are clean, drop them. Not durable (sync()
                # comes later): on dirty pages this starts their writeback
                # without waiting for it, so the fsync in sync() waits for
                # little (measured: 55 ms -> 1 ms at the end of a 256 MiB
                # backup) instead of writing every chunk at the end.
                _drop_cache(handle.fileno())
            if replacing is not None:
                # Checked just before the rename: a directory offers no compare-and-swap, so this
                # narrows the window to a few system calls rather than closing it (docs/usage.md, Keys).
                current = self.head(key)
                if current is None or current.version != replacing:
                    raise IntegrityError(f"object {key} in {self.root} changed or went since it was read; nothing was replaced")
            if create_only:
                try:
                    os.link(tmp_name, path)
                except FileExistsError:
                    raise AlreadyExistsError(f"object {key} already exists in {self.root}") from None
            else:
                os.replace(tmp_name, path)
                tmp_name = None
            if durable:
                _fsync_directory(path.parent)
                if created:  # the new directories' own names are durable only once their parents are synced
                    for directory in path.parent.parents:
                        _fsync_directory(directory)
                        if directory == self.root:
                            break
        except OSError as exc:
            raise _storage_error("writing", path, exc) from None
        finally:
            if tmp_name is not None:
                try:
                    os.unlink(tmp_name)
                except OSError:
                    pass

    def sync(self, keys: Iterable[str]) -> None:
        """Make objects written with `durable=False` durable: one fsync per file,
        one per directory, and their pages dropped from the cache once clean.

        The local engine writes chunks without waiting for the disk and syncs
        them all here, before the manifest: a worker never stalls on fsync,
        and nothing is published before every chunk it names is on disk.
        """
        directories: set[Path] = set()
        for key in keys:
            path = self._path(key)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise NotFoundError(f"object {key} not found in {self.root}") from None
            except OSError as exc:
                raise _storage_error("syncing", path, exc) from None
            try:
                os.fsync(fd)
                _drop_cache(fd)
            except OSError as exc:
                raise _storage_error("syncing", path, exc) from None
            finally:
                os.close(fd)
            directories.add(path.parent)
        for directory in sorted(directories):
            _fsync_directory(directory)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"object {key} not found in {self.root}") from None
        except OSError as exc:
            raise _storage_error("reading", path, exc) from None

    def get_into(self, key: str, buffer: WritableBuffer) -> memoryview:
        """The whole object, read into `buffer` when it fits (else into a new one).

        Never resizes `buffer`: views of its previous contents may still be
        alive in other threads.
        """
        path = self._path(key)
        try:
            with open(path, "rb", buffering=0) as handle:
                size = os.fstat(handle.fileno()).st_size
                view = memoryview(buffer if len(buffer) >= size else new_buffer(size))[:size]
                filled = read_full(handle, view)
                _drop_cache(handle.fileno())
                return view[:filled]
        except FileNotFoundError:
            raise NotFoundError(f"object {key} not found in {self.root}") from None
        except OSError as exc:
            raise _storage_error("reading", path, exc) from None

    def prefetch(self, key: str) -> None:
        """Start reading the object into the page cache in the background (a hint: errors are ignored).

        Restore reads chunks cold (the store keeps them out of the cache);
        asked for the next chunk as each read completes, the disk works
        while the chunks before it decode (braid.ports.store.prefetch_object).
        """
        if not hasattr(os, "posix_fadvise"):
            return
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, ValueError):
            return
        try:
            # In steps: Linux reads at most one readahead window (128 KiB by
            # default) per call, however long the range it is given.
            size = os.fstat(fd).st_size
            for offset in range(0, size, _PREFETCH_STEP):
                os.posix_fadvise(fd, offset, _PREFETCH_STEP, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)

    def get_range_into(self, key: str, start: int, length: int, buffer: WritableBuffer) -> memoryview:
        """`get_range`, read into `buffer` when it fits (else into a new one); never resizes `buffer`."""
        path = self._path(key)
        try:
            with open(path, "rb", buffering=0) as handle:
                size = max(0, min(length, os.fstat(handle.fileno()).st_size - start))
                view = memoryview(buffer if len(buffer) >= size else new_buffer(size))[:size]
                handle.seek(start)
                filled = read_full(handle, view)
                return view[:filled]
        except FileNotFoundError:
            raise NotFoundError(f"object {key} not found in {self.root}") from None
        except OSError as exc:
            raise _storage_error("reading", path, exc) from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as handle:
                handle.seek(start)
                return handle.read(length)
        except FileNotFoundError:
            raise NotFoundError(f"object {key} not found in {self.root}") from None
        except OSError as exc:
            raise _storage_error("reading", path, exc) from None

    def head(self, key: str) -> ObjectInfo | None:
        try:
            status = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:  # an unreadable directory is a failed read, never "not there"
            raise _storage_error("reading", self._path(key), exc) from None
        return ObjectInfo(key, status.st_size, modified=_modified(status), version=_version(status))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        yield from self._walk(prefix, temporary=False)

    def list_prefixes(self, prefix: str) -> Iterator[str]:
        """braid.ports.store.PrefixListing: the subdirectories of the directory `prefix` names."""
        directory = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        try:
            names = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise _storage_error("listing", directory, exc) from None
        for name in names:
            yield f"{prefix}{name}/"

    def list_temporary(self, prefix: str) -> Iterator[ObjectInfo]:
        """The `.tmp-*` files interrupted puts left under `prefix` (braid.ports.store.TemporaryFiles)."""
        yield from self._walk(prefix, temporary=True)

    def _walk(self, prefix: str, *, temporary: bool) -> Iterator[ObjectInfo]:
        # Walk from the deepest directory the prefix names in full: a prefix
        # is a string prefix ("data/db" matches "data/db2/..."), as on S3.
        directory = prefix[: prefix.rfind("/") + 1]
        start = self._path(directory.rstrip("/")) if directory else self.root
        found: list[ObjectInfo] = []
        for dirpath, _dirs, files in os.walk(start, onerror=_unlistable):
            for name in files:
                if name.startswith(_TMP_PREFIX) != temporary:
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    try:
                        status = full.stat()
                    except FileNotFoundError:
                        continue
                    found.append(ObjectInfo(key, status.st_size, modified=_modified(status)))
        yield from sorted(found, key=lambda info: info.key)

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            path = self._path(key)
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _storage_error("deleting", path, exc) from None
            self._prune_empty_dirs(path.parent)

    def _prune_empty_dirs(self, directory: Path) -> None:
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent


def _version(status: os.stat_result) -> str:
    """A file's version for `put(replacing=...)`: every put writes a new file and renames it into
    place, so a rewrite changes the inode, and mtime and size tell apart a reused one."""
    return f"{status.st_ino}:{status.st_mtime_ns}:{status.st_size}"

