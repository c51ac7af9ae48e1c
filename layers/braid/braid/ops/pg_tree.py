"""The tree of an `in-place` chain rebuild (braid.ops.pg_apply) as a whole: pruned to a link's files, finished, moved into DIR."""

from __future__ import annotations

import os
import shutil

from braid.errors import InputError
from braid.ops.pg_incremental import strip_incremental_lines
from braid.ops.pgdata import sync_filesystem

__all__ = ["finish_tree", "fsync_dir", "move_into", "remove", "remove_absent"]


def remove(path: str) -> None:
    """A file, symlink or whole directory."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def remove_absent(root: str, seen: set[str], sizes: dict[str, int]) -> None:
    """Remove from the tree what a link's tar did not name (`seen`; a directory named by a path under it stays),
    and from `sizes` the files removed."""
    keep = set(seen)
    for name in seen:
        parent = os.path.dirname(name)
        while parent and parent not in keep:
            keep.add(parent)
            parent = os.path.dirname(parent)
    for current, dirs, files in os.walk(root):
        relative = os.path.relpath(current, root)
        for name in list(dirs):
            child = name if relative == "." else f"{relative}/{name}"
            if child not in keep:
                remove(os.path.join(current, name))
                dirs.remove(name)
                for gone in [known for known in sizes if known.startswith(child + "/")]:
                    del sizes[gone]
        for name in files:
            child = name if relative == "." else f"{relative}/{name}"
            if child not in keep:
                os.unlink(os.path.join(current, name))
                sizes.pop(child, None)


def finish_tree(root: str, newest_label: bytes) -> None:
    """The rebuilt tree made whole and durable: the newest backup_label without INCREMENTAL FROM, then one sync."""
    label = strip_incremental_lines(newest_label)
    try:
        fd = os.open(os.path.join(root, "backup_label"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, label)
        finally:
            os.close(fd)
        sync_filesystem(root)
        for current, _, _ in os.walk(root):
            fsync_dir(current)
    except OSError as exc:
        raise InputError(f"error writing the chain's work directory {root}: {exc.strerror or exc}") from None


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def move_into(tree: str, directory: str) -> None:
    """Make the whole tree DIR: one rename (DIR absent or empty); for a DIR that cannot be replaced (a mount point),
    its entries one by one with global/ (pg_control) last, so DIR never looks complete before it is."""
    try:
        os.rename(tree, directory)
    except OSError as exc:
        if not os.path.isdir(directory) or os.listdir(directory):
            raise InputError(f"cannot move the rebuilt data directory into --pgdata {directory}: {exc.strerror or exc}") from None
        try:
            for name in sorted(os.listdir(tree), key=lambda entry: (entry == "global", entry)):
                os.rename(os.path.join(tree, name), os.path.join(directory, name))
            os.chmod(directory, 0o700)
        except OSError as inner:
            raise InputError(f"cannot move the rebuilt data directory into --pgdata {directory}: {inner.strerror or inner}") from None
    fsync_dir(directory)
    fsync_dir(os.path.dirname(os.path.abspath(directory)))
