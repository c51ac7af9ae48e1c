"""`{parent_manifest}` and `{parent_lsn}` in an incremental's producer command, resolved from its parent.

- `{parent_manifest}`: the path of a private file (mode 0600, in a 0700
  directory, removed when the backup ends) holding the parent's PostgreSQL
  `backup_manifest`, as Braid captured it from the parent's tar stream
  (`pg_basebackup --incremental={parent_manifest}`);
- `{parent_lsn}`: the parent's `to_lsn`, from the `xtrabackup_checkpoints`
  Braid captured from the parent's MariaDB xbstream
  (`mariadb-backup --incremental-lsn={parent_lsn}`).

Both are read through the parent's authenticated manifest
(braid.ops.metadata); a placeholder whose value the parent does not have is a
UsageError (exit 2) naming it, raised before the producer starts.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from types import TracebackType

from braid.engine.xbstream import CHECKPOINTS, to_lsn
from braid.errors import NotFoundError, UsageError
from braid.format.metadata import BACKUP_MANIFEST
from braid.ops.metadata import read_metadata
from braid.ops.open import OpenedBackup
from braid.ports.store import ObjectStore

__all__ = ["ParentValues", "named_placeholders"]

_PLACEHOLDER = re.compile(r"\{(parent_manifest|parent_lsn)\}")


def named_placeholders(argv: Sequence[str]) -> list[str]:
    """The parent placeholders `argv` uses, in order of first use."""
    found: list[str] = []
    for arg in argv:
        for match in _PLACEHOLDER.finditer(arg):
            if match.group(1) not in found:
                found.append(match.group(1))
    return found


class ParentValues:
    """The values of the placeholders `argv` names, from `parent` (None: not an incremental); a context manager
    that removes the private file on exit."""

    def __init__(self, store: ObjectStore, parent: OpenedBackup | None, argv: Sequence[str]) -> None:
        self.names = named_placeholders(argv)
        self._dir: str | None = None
        self.values: dict[str, str] = {}
        if not self.names:
            return
        if parent is None:
            raise UsageError(f"{{{self.names[0]}}} names the parent of an incremental backup: add --incremental[=NAME@ID]")
        manifest, key = parent
        if "parent_lsn" in self.names:
            lsn = to_lsn(self._read(store, parent, CHECKPOINTS, "parent_lsn", "a MariaDB xbstream"))
            if lsn is None:
                raise UsageError(f"{{parent_lsn}}: the xtrabackup_checkpoints of the parent {manifest.backup} names no to_lsn")
            self.values["parent_lsn"] = lsn
        if "parent_manifest" in self.names:
            self._write(self._read(store, parent, BACKUP_MANIFEST, "parent_manifest", "a PostgreSQL tar stream (pg_basebackup -Ft -D -)"))

    @classmethod
    def handed_over(cls, argv: Sequence[str]) -> ParentValues:
        """The values of a cloud incremental, which the pipeline reads (the host holds no key): empty until `fill`."""
        values = cls.__new__(cls)
        values.names, values._dir, values.values = named_placeholders(argv), None, {}
        return values

    def fill(self, parent: str, lsn: str | None, manifest: bytes | None) -> None:
        """What the pipeline handed over for `parent` (braid.pipeline.parent, which refused any value it lacks)."""
        for name, value in (("parent_lsn", lsn), ("parent_manifest", manifest)):
            if name in self.names and value is None:
                raise UsageError(f"{{{name}}}: the pipeline handed over no value from the parent {parent}; nothing was started")
        if "parent_lsn" in self.names and lsn is not None:
            self.values["parent_lsn"] = lsn
        if "parent_manifest" in self.names and manifest is not None:
            self._write(manifest)

    def _write(self, content: bytes) -> None:
        """`{parent_manifest}`: a private file (0600 in a 0700 directory), removed on close."""
        self._dir = tempfile.mkdtemp(prefix="braid-parent-")  # 0700
        path = os.path.join(self._dir, "backup_manifest")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        self.values["parent_manifest"] = path

    @staticmethod
    def _read(store: ObjectStore, parent: OpenedBackup, kind: str, name: str, source: str) -> bytes:
        try:
            return read_metadata(store, parent.manifest, parent.key, kind)
        except NotFoundError:
            raise UsageError(
                f"{{{name}}}: the parent {parent.manifest.backup} has no {kind} (its stream was not {source}); nothing was started"
            ) from None

    def substitute(self, argv: Sequence[str]) -> list[str]:
        return [_PLACEHOLDER.sub(lambda m: self.values[m.group(1)], arg) for arg in argv]

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> ParentValues:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()
