"""Restoring an incremental chain: every link into a private working directory, then the database combines them.

PostgreSQL (`restore NAME@ID --pgdata DIR` of an incremental): each link's
tar is extracted (braid.ops.pgdata, verified bytes only) into WORK/NN, NN its
position from 00 (the full), then `pg_combinebackup WORK/00 .. WORK/NN -o
DIR` writes the data directory, and WORK is removed, whatever happened.
Generic (`restore NAME@ID --chain -- COMMAND`): the command runs once per
link, oldest first, with that link's stream on its stdin and `{link}`,
`{link_id}` and `{dir}` (an empty private WORK/NN, kept for the database's
own prepare step) in its arguments. Where WORK and DIR share a file system
and pg_combinebackup has `--link` (PostgreSQL 18), unchanged files are
hard-linked into DIR instead of copied: the rebuild then writes little more
than the links themselves.

Before anything is written, every link's manifest is opened and authenticated
(braid.ops.chain.open_chain: a missing or unreadable link is exit 6) and the
disk is checked (exit 3 if short): WORK needs the sum of the links' sizes,
DIR about the full's size plus the incrementals' (`disk_needed`).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from braid.errors import BackupError, InputError, ProducerError, UsageError
from braid.ops.open import OpenedBackup

__all__ = ["ChainWork", "DiskSpaceError", "check_disk", "combine", "find_tool", "link_command", "links_files", "work_dir_for"]

_LINK_PLACEHOLDER = re.compile(r"\{(link|link_id|dir)\}")


class DiskSpaceError(BackupError):
    """Not enough free space for a chain restore (exit 3): nothing was written."""

    exit_code = 3


def work_dir_for(target: str, given: str | None) -> str:
    """`--work-dir`, or a new private directory beside `target` (same file system: the links and DIR share it)."""
    if given:
        return os.path.abspath(given)
    parent, base = os.path.split(os.path.abspath(target).rstrip("/"))
    return os.path.join(parent, f".{base}.braid-chain-{secrets.token_hex(4)}")


def check_disk(links: Sequence[OpenedBackup], work: str, target: str | None, *, linked: bool = False) -> None:
    """Free space for every link in `work`, and for the combined directory in `target` (DiskSpaceError, exit 3):
    at most every link's size again, or only the incrementals' when `linked` (pg_combinebackup --link on one file system)."""
    sizes = [link.manifest.plaintext_bytes for link in links]
    combined = sum(sizes[1:]) if linked else sum(sizes)
    needs: dict[int, list[tuple[str, int]]] = {}
    for path, size in ((work, sum(sizes)), *(((target, combined),) if target is not None else ())):
        probe = _existing(path)
        needs.setdefault(os.stat(probe).st_dev, []).append((probe, size))
    for wants in needs.values():
        probe = wants[0][0]
        free = shutil.disk_usage(probe).free
        total = sum(size for _, size in wants)
        if free < total:
            raise DiskSpaceError(
                f"a chain restore of {len(links)} links needs {total} bytes free on the file system of {probe}"
                f" (the links in the work directory{' and the combined data directory' if len(wants) > 1 else ''}), which has {free};"
                " nothing was written (choose another place with --work-dir)"
            )


def _existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def find_tool(name: str, bin_dir: str | None) -> str:
    """`name` in `--pg-bin DIR`, else on PATH; UsageError (exit 2) before anything is written."""
    path = os.path.join(bin_dir, name) if bin_dir else shutil.which(name)
    if not path or not os.access(path, os.X_OK):
        where = f"in --pg-bin {bin_dir}" if bin_dir else "on PATH"
        raise UsageError(f"{name} was not found {where}: it rebuilds a PostgreSQL incremental chain (PostgreSQL 17+); give --pg-bin DIR")
    return path


@dataclass
class ChainWork:
    """The private working directory: created 0700 (must not exist), one subdirectory per link, removed by `close`."""

    path: str

    def __post_init__(self) -> None:
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            raise UsageError(f"--work-dir {self.path} already exists: give a new directory (it is removed afterwards)") from None
        except OSError as exc:
            raise InputError(f"cannot create the work directory {self.path}: {exc.strerror}") from None

    def link(self, position: int) -> str:
        return os.path.join(self.path, f"{position:02d}")

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def links_files(tool: str) -> bool:
    """Whether this pg_combinebackup can hard-link unchanged files (`--link`, PostgreSQL 18+) instead of copying them."""
    try:
        shown = subprocess.run([tool, "--help"], stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--link" in shown


def combine(tool: str, links: Sequence[str], target: str, *, link: bool) -> None:
    """pg_combinebackup LINKS.. -o TARGET (`link`: with --link; the links are on TARGET's file system and removed after,
    so DIR keeps the only name of each linked file); ProducerError (exit 11) with its last words if it fails."""
    argv = [tool, *links, "-o", target, *(["--link"] if link else [])]
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        said = " ".join(result.stderr.strip().splitlines()[-2:]) or f"exit status {result.returncode}"
        raise ProducerError(f"pg_combinebackup failed: {said}; nothing was left in {target}")


def link_command(argv: Sequence[str], position: int, link_id: str, directory: str) -> list[str]:
    """The generic form's command for one link: `{link}` its position (0: the full), `{link_id}` NAME@ID, `{dir}` its directory."""
    values: dict[str, Callable[[], str]] = {"link": lambda: str(position), "link_id": lambda: link_id, "dir": lambda: directory}
    return [_LINK_PLACEHOLDER.sub(lambda m: values[m.group(1)](), arg) for arg in argv]
