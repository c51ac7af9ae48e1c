"""The `in-place` rebuild of a PostgreSQL chain: each link's tar applied, in order, onto one tree.

`restore NAME@ID --pgdata DIR` of an incremental (braid.cli.commands.
restore_chain) streams every link, oldest first, through an `ApplyTarget`
onto WORK/tree, a private directory beside DIR; then braid.ops.pg_tree's
`finish_tree` and `move_into` make it DIR. What a link does to the tree is what
pg_combinebackup makes of the same chain (src/bin/pg_combinebackup):

- a regular file replaces the tree's (written by braid.ops.pgdata's
  parallel writers);
- `INCREMENTAL.<name>` under base/, global or pg_tblspc/ (braid.ops.
  pg_incremental reads it) truncates `<name>` to its truncation_block_length
  blocks and writes its blocks in place: only the changed blocks are written;
- whatever the tree holds that the link's tar does not (its files and
  directories, INCREMENTAL.<name> counting as <name>) is removed;
- backup_label and backup_manifest are read, not written: each label must
  follow its parent's (`check_link`), each manifest and global/pg_control
  name the full's system identifier; at the end backup_label is the newest
  link's without its INCREMENTAL FROM lines, as pg_combinebackup writes it;
- pg_wal comes from the newest link (the older links' WAL is not written).

Unlike pg_combinebackup, no backup_manifest is written into DIR: it would
need a checksum of every rebuilt file (reading them all again), and
PostgreSQL never reads it to start. Nothing is synced until the tree is
whole: then one syncfs(2) and an fsync per directory, and DIR appears by
one rename (an empty existing DIR is replaced; a mount point gets the
entries one by one, global/ last, so a half-moved DIR has no pg_control).
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from braid.errors import BackupError, InputError, IntegrityError
from braid.format.tar_stream import DIRECTORY, HARDLINK, REGULAR, MemberConsumer, TarFormatError, TarMember
from braid.ops.pg_incremental import (
    BLCKSZ,
    FIXED_HEADER,
    BackupLabel,
    ChainMismatchError,
    IncrementalFileError,
    IncrementalHeader,
    check_link,
    parse_fixed,
    parse_header,
    parse_label,
)
from braid.ops.pg_tree import remove, remove_absent
from braid.ops.pgdata import TarExtract, _File
from braid.ops.restore_output import Output, OutputTarget

__all__ = ["ApplyTarget", "ChainState"]

_PREFIX = "INCREMENTAL."
_METADATA = ("backup_label", "backup_manifest")
_MAX_METADATA = 1 << 30


@dataclass
class ChainState:
    """What the links applied so far established (labels, system identifier, the tree's files), and whose turn it is:
    a link may be read and decoded while the one before it is applied, but is applied only once that one is done."""

    links: int
    labels: list[BackupLabel] = field(default_factory=list)
    system_identifier: int | None = None
    symlinks: set[str] = field(default_factory=set)  # made by any link: no later member is written through one
    sizes: dict[str, int] = field(default_factory=dict)  # the tree's regular files (one name each) and their lengths
    applied: int = 0  # links applied, oldest first
    failed: bool = False
    turn: threading.Condition = field(default_factory=threading.Condition)

    def wait_turn(self, position: int) -> None:
        """Block until every link before `position` is applied; BackupError if one of them failed."""
        with self.turn:
            self.turn.wait_for(lambda: self.applied >= position or self.failed)
            if self.failed:
                raise BackupError(f"link {position} of the chain was not applied: an earlier link failed")

    def done(self, position: int) -> None:
        with self.turn:
            self.applied = max(self.applied, position + 1)
            self.turn.notify_all()

    def fail(self) -> None:
        with self.turn:
            self.failed = True
            self.turn.notify_all()


@dataclass(frozen=True)
class ApplyTarget(OutputTarget):
    """Link `position` of `state.links` applied onto the tree at `path` (created by link 0; it must not exist before)."""

    position: int = 0
    backup: str = ""
    state: ChainState = field(default_factory=lambda: ChainState(1))
    writers: int = 2

    def check(self, force: bool) -> None:
        return None  # the tree is Braid's own private directory (braid.ops.chain_restore.ChainWork)

    @property
    def partial_path(self) -> str | None:
        return None

    @property
    def ends_soon(self) -> bool:
        return True

    def open(self, *, timeout: float = 0.0, note: Callable[[], None] | None = None, cancelled: threading.Event | None = None) -> Output | None:
        assert self.path is not None
        return ApplyLink(self)


def _incremental_dir(relative_dir: str) -> bool:
    """Where pg_combinebackup looks for INCREMENTAL files (elsewhere such a name is an ordinary file)."""
    return relative_dir.startswith(("base/", "pg_tblspc/")) or relative_dir == "global"


class _Capture:
    """A small member kept in memory (backup_label, backup_manifest)."""

    def __init__(self, name: str, done: Callable[[bytes], None]) -> None:
        self.name, self.done, self.data = name, done, bytearray()

    def write(self, data: memoryview) -> None:
        if len(self.data) + len(data) > _MAX_METADATA:
            raise IntegrityError(f"the backup's {self.name} is larger than {_MAX_METADATA} bytes; it is not PostgreSQL's")
        self.data += data

    def close(self) -> None:
        self.done(bytes(self.data))


class _Discard:
    def write(self, data: memoryview) -> None:
        return None

    def close(self) -> None:
        return None


class _Patch:
    """An INCREMENTAL.<name> member applied onto <name>: truncate to its truncation length, then its blocks in place."""

    def __init__(self, path: str, member: TarMember, where: str, sizes: dict[str, int], relative: str) -> None:
        self.path, self.member, self.where = path, member, where
        self.sizes, self.relative = sizes, relative
        self.ends: list[int] = []  # for each block, the index of the last one of its run of consecutive numbers
        self.head = bytearray()
        self.parsed: IncrementalHeader | None = None
        self.header: IncrementalHeader | None = None  # set once the target was truncated
        self.consumed = 0
        self.fd: int | None = None

    def write(self, data: memoryview) -> None:
        view = data
        if self.header is None:
            view = self._read_header(view)
            if self.header is None:
                return
        header, fd = self.header, self.fd
        while len(view):
            assert fd is not None  # blocks follow the header only when it has some
            index, inner = divmod(self.consumed - header.length, BLCKSZ)
            take = min(len(view), (self.ends[index] - index + 1) * BLCKSZ - inner)  # one write per run of blocks
            written = os.pwrite(fd, view[:take], header.blocks[index] * BLCKSZ + inner)
            view = view[written:]
            self.consumed += written

    def _read_header(self, view: memoryview) -> memoryview:
        """Take the header (and its padding) from `view`; once whole, truncate the target and return the rest."""
        while self.header is None:
            need = FIXED_HEADER if len(self.head) < FIXED_HEADER else FIXED_HEADER + 4 * parse_fixed(self.head, self.where)[0]
            if len(self.head) < need:
                if not len(view):
                    return view
                take = min(len(view), need - len(self.head))
                self.head += view[:take]
                view, self.consumed = view[take:], self.consumed + take
                continue
            if self.parsed is None:
                self.parsed = parse_header(self.head, self.where, self.member.size)
            skip = min(len(view), self.parsed.length - self.consumed)  # the padding up to the first block
            view, self.consumed = view[skip:], self.consumed + skip
            if self.consumed < self.parsed.length:
                return view
            self._start(self.parsed)
        return view

    def _start(self, header: IncrementalHeader) -> None:
        size = self.sizes.get(self.relative)
        if size is None:
            raise ChainMismatchError(f"{self.where} changes a file its parent does not have as a regular file: the chain is not PostgreSQL's")
        self.header = header
        self.sizes[self.relative] = header.block_length * BLCKSZ
        length = header.truncation_block_length * BLCKSZ
        if not header.blocks and size == length:
            return  # unchanged: most of a chain's INCREMENTAL files (nothing opened, no metadata written)
        self.ends = list(range(len(header.blocks)))
        for index in range(len(header.blocks) - 2, -1, -1):
            if header.blocks[index + 1] == header.blocks[index] + 1:
                self.ends[index] = self.ends[index + 1]
        self.fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        if size != length:
            os.ftruncate(self.fd, length)  # blocks past it are gone (zeros if the blocks below re-extend the file)

    def close(self) -> None:
        if self.header is None:  # the member ended inside the header (or its padding)
            parse_fixed(self.head, self.where)  # shorter than 12 bytes
            parse_header(self.head, self.where, self.member.size)
            raise IncrementalFileError(f"{self.where} is truncated: {self.member.size} bytes, shorter than its header")
        if self.fd is not None:  # its length is now header.block_length blocks: truncated, then the blocks written
            os.close(self.fd)
            self.fd = None


class _Unchanged:
    """An INCREMENTAL file of no blocks (12 bytes; most of a chain's): only its truncation length, set if it differs."""

    def __init__(self, patch: _Patch) -> None:
        self.patch, self.data = patch, b""

    def write(self, data: memoryview) -> None:
        self.data += data

    def close(self) -> None:
        patch = self.patch
        count, truncation = parse_fixed(self.data, patch.where)
        header = parse_header(self.data, patch.where, len(self.data)) if count else IncrementalHeader((), truncation, FIXED_HEADER)
        size = patch.sizes.get(patch.relative)
        if size == truncation * BLCKSZ:
            return
        patch.head = bytearray(self.data)
        patch.parsed = header
        patch._start(header)
        patch.close()


class _Overwrite(_File):
    """A whole file over the tree's file of that name: written in place, cut or extended to its new size first."""

    def open(self) -> int:
        if self.fd is None:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, self.member.mode & 0o7777 or 0o600)
            if os.fstat(fd).st_size != self.member.size:
                os.ftruncate(fd, self.member.size)
            self.fd = fd
        return self.fd


class ApplyLink(TarExtract):
    """One link's tar onto the tree (the module docstring says what each member does)."""

    def __init__(self, target: ApplyTarget) -> None:
        assert target.path is not None
        super().__init__(target.label, target.path, target.writers)
        self.target = target
        self.symlinks = target.state.symlinks
        self.where = f"link {target.position} ({target.backup})"
        self.seen: set[str] = set()
        self.manifest: bytes | None = None
        self.patches: list[_Patch] = []
        self.turn_taken = False

    def write(self, data: memoryview) -> None:
        if not self.turn_taken:
            self.target.state.wait_turn(self.target.position)
            self.turn_taken = True
        super().write(data)

    def _relative(self, name: str) -> str:
        """The member's path in the tree, checked as braid.ops.pgdata checks it (inside, never through a link's symlink)."""
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if not parts or name.startswith("/") or ".." in parts:
            raise IntegrityError(f"the backup's tar names {name!r}, which is not a path inside the data directory; nothing is extracted there")
        if self.symlinks:
            for depth in range(1, len(parts)):
                if "/".join(parts[:depth]) in self.symlinks:
                    raise IntegrityError(f"the backup's tar names {name!r}, which leads through a symlink it made")
        return "/".join(parts)

    def _member(self, member: TarMember) -> MemberConsumer | None:
        relative = self._relative(member.name)
        path = f"{self.root}/{relative}"
        directory, _, base = relative.rpartition("/")
        sizes = self.target.state.sizes
        if member.kind == DIRECTORY:
            self.seen.add(relative)
            return super()._member(member)
        if member.kind == REGULAR and base.startswith(_PREFIX) and _incremental_dir(directory):
            if self.target.position == 0:
                raise ChainMismatchError(f"{self.where}, the chain's full, holds the incremental file {relative}")
            real = f"{directory}/{base[len(_PREFIX):]}"
            self.seen.add(real)
            patch = _Patch(f"{self.root}/{real}", member, f"{relative} of {self.where}", sizes, real)
            self.patches.append(patch)
            return _Unchanged(patch) if member.size == FIXED_HEADER else patch
        self.seen.add(relative)
        if relative in _METADATA:
            return _Capture(relative, self._label if relative == "backup_label" else self._manifest)
        if relative.startswith("pg_wal/") and member.kind == REGULAR and self.target.position < self.target.state.links - 1:
            return _Discard()  # only the newest link's WAL is kept
        if member.kind == REGULAR and relative in sizes:
            sizes[relative] = member.size
            handle = _Overwrite(self, path, member, False)  # rewriting the file costs a tenth of replacing it (measured)
            self.open_files.append(handle)
            return handle
        sizes.pop(relative, None)
        if self.target.position > 0 and os.path.lexists(path):
            remove(path)
        if member.kind == REGULAR:
            sizes[relative] = member.size
        elif member.kind == HARDLINK:  # two names for one file: neither is rewritten in place later
            sizes.pop(self._relative(member.linkname), None)
        return super()._member(member)

    def _label(self, text: bytes) -> None:
        state = self.target.state
        label = parse_label(text, self.where)
        check_link(self.target.position, label, state.labels[-1] if state.labels else None, self.where)
        state.labels.append(label)

    def _manifest(self, text: bytes) -> None:
        self.manifest = text

    def finish(self) -> None:
        if not self.turn_taken:
            self.target.state.wait_turn(self.target.position)
            self.turn_taken = True
        try:
            self.parser.end()
        except TarFormatError as exc:
            raise IntegrityError(f"the tar stream of {self.where} is incomplete ({exc})") from None
        if not self.parser.ended:
            raise IntegrityError(f"the tar stream of {self.where} has no end-of-archive blocks")
        self.pool.shutdown()
        state = self.target.state
        if len(state.labels) != self.target.position + 1:
            raise ChainMismatchError(f"{self.where} has no backup_label: not a pg_basebackup -Ft stream")
        self._check_system()
        try:
            remove_absent(self.root, self.seen, state.sizes)
        except OSError as exc:
            raise InputError(f"error writing the chain's work directory {self.root}: {exc.strerror or exc}") from None
        state.done(self.target.position)

    def _check_system(self) -> None:
        state = self.target.state
        found: list[tuple[str, int]] = []
        try:
            with open(os.path.join(self.root, "global", "pg_control"), "rb") as handle:
                head = handle.read(8)
            if len(head) == 8:
                found.append(("global/pg_control", struct.unpack("=Q", head)[0]))
        except FileNotFoundError:
            raise ChainMismatchError(f"{self.where} has no global/pg_control: not a PostgreSQL data directory") from None
        if self.manifest is not None:
            try:
                value = json.loads(self.manifest).get("System-Identifier")
            except (ValueError, AttributeError):
                raise ChainMismatchError(f"the backup_manifest of {self.where} is not PostgreSQL's JSON") from None
            if isinstance(value, int):
                found.append(("backup_manifest", value))
        for source, value in found:
            if state.system_identifier is None:
                state.system_identifier = value
            elif value != state.system_identifier:
                raise ChainMismatchError(
                    f"{self.where}: its {source} names system identifier {value}, but the chain's full has {state.system_identifier}: another cluster"
                )

    def discard(self) -> None:
        """A failed link: close what is open, stop the later links; the whole work directory is removed by the caller."""
        self.target.state.fail()
        self.pool.shutdown(wait=True, cancel_futures=True)
        fds = [handle.fd for handle in self.open_files] + [patch.fd for patch in self.patches]
        for fd in fds:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.open_files, self.patches = [], []
