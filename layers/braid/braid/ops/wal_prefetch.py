"""wal-fetch's prefetch: while PostgreSQL replays segment N, the next ones are fetched into a private spool.

Each `wal-fetch` of a segment writes its name to the spool's `position`,
serves the segment from the spool when the prefetcher already has it (moved
or copied to DEST atomically), removes every spooled segment before it (
PostgreSQL never asks for an earlier one again; a request on a later
timeline ends the old timeline's too), and starts the prefetcher when none
holds the spool's lock. The prefetcher keeps the `--prefetch` segments after
`position` in the spool, each one authenticated, decrypted and checked
before it is written there (atomically), so the spool only ever holds
verified bytes. A request for a segment that is not archived (the end of
recovery's archive) empties the spool.

Once it has had nothing to do for IDLE_EXIT seconds (recovery ended,
paused or stopped) the prefetcher removes the spool: its segments, then
Braid's own files in it (position, identity, log, lock, temporary files),
then the directory and an emptied `.braid-prefetch` root, each only if
nothing else appeared meanwhile. A file Braid did not write, or a call that
is using the spool again, leaves the directory in place. Nothing it removes
is needed: a later restore_command (recovery resumed after a pause or a
restart) misses the fast path and runs wal-fetch, which makes the spool
again (asking once more if it vanished under it) and starts a prefetcher.
A prefetcher that fails drops its segments and keeps the spool with its
log; one that is killed leaves the spool to the next one's idle exit.

`braid restore --pgdata` writes a restore_command whose sh fast path serves
a spooled segment without starting Python (braid.ops.recovery): it writes
`position` the same way and hard-links the segment to DEST. The prefetcher
reads `position` each round, so it keeps fetching ahead of that path, stays
alive while positions change, and drops the spooled segments before it.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from braid.errors import BackupError, InputError
from braid.format.wal import SEGMENT, WalFile, segment_name

if TYPE_CHECKING:  # a call served from the spool loads no cryptography, zstd or repository code
    from braid.format.repository import Repository
    from braid.ports.keys import KeyService
    from braid.ports.wal_staging import WalStaging

LOCK = "prefetch.lock"
POSITION = "position"
LOG = "prefetch.log"
IDLE_EXIT = 10.0


def spooled_segments(spool: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in os.scandir(spool) if len(entry.name) == 24 and not entry.name.startswith("."))
    except FileNotFoundError:  # removed (by hand, or by an idle prefetcher): nothing spooled
        return []


def _drop_before(spool: Path, file_name: str) -> None:
    for older in spooled_segments(spool):
        if older < file_name:
            _unlink(spool / older)


def serve_from_spool(spool: Path, file_name: str, dest: Path) -> bool:
    """Move the spooled `file_name` to `dest` (atomically) and drop older ones; False when it is not spooled."""
    _drop_before(spool, file_name)
    source = spool / file_name
    try:
        os.replace(source, dest)  # the same file system: a rename, nothing copied
        return True
    except FileNotFoundError:
        return False
    except OSError:
        pass  # another file system: copy, then remove
    from braid.ops.wal_fetch import write_atomically

    try:
        with open(source, "rb") as handle:
            write_atomically(dest, handle.read())
    except FileNotFoundError:
        return False
    _unlink(source)
    return True


def note_position(spool: Path, file_name: str) -> None:
    tmp = spool / f".{POSITION}.{os.getpid()}"
    tmp.write_text(file_name)
    os.replace(tmp, spool / POSITION)


def forget_spool(spool: Path) -> None:
    """The archive ended at a segment PostgreSQL asked for: nothing spooled will be asked for."""
    for name in spooled_segments(spool):
        _unlink(spool / name)


def open_spool(root: str | None, repo: str, name: str, wal_directory: Path, file_name: str) -> Path:
    """The fetch spool (braid.ops.spool.spool_for) with `file_name` noted as its position; made again, once, when a
    prefetcher's idle exit removed it meanwhile. InputError when it cannot be made (a relative root outside DIR)."""
    from braid.ops.spool import spool_for

    try:
        spool = spool_for(root, "fetch", repo, name, wal_directory)
        note_position(spool, file_name)
    except FileNotFoundError:
        try:
            spool = spool_for(root, "fetch", repo, name, wal_directory)
            note_position(spool, file_name)
        except FileNotFoundError as exc:
            raise InputError(
                f"cannot make the spool {Path(root or '.').absolute()}: {exc.strerror} (a relative --spool is made in the working"
                " directory, which for restore_command is the data directory)"
            ) from None
    return spool


def remove_spool(spool: Path) -> None:
    """The idle exit's cleanup: the spooled segments, Braid's own files, the spool and an emptied PGDATA_SPOOL root.

    The lock goes last: a wal-fetch may start the next prefetcher only once this one is done with the files, and a
    directory that is in use again (or holds anything else) stays.
    """
    from braid.ops.spool import PGDATA_SPOOL

    forget_spool(spool)
    try:
        entries = [entry.name for entry in os.scandir(spool)]
    except FileNotFoundError:
        return
    for entry in entries:
        if _ours(entry):
            _unlink(spool / entry)
    _unlink(spool / LOCK)
    for directory in (spool, spool.parent) if spool.parent.name == PGDATA_SPOOL else (spool,):
        try:
            directory.rmdir()
        except OSError:  # not empty: a wal-fetch or the fast path is using it again, or it holds what is not Braid's
            return


def _ours(entry: str) -> bool:
    """A file of the spool's that Braid writes (the lock aside): position and its temporary files (wal-fetch's,
    the fast path's), identity, the prefetcher's log, write_atomically's temporary segments."""
    temporary_segment = entry.startswith(".") and entry[25:32] == ".braid-" and len(entry) > 32
    return entry in (POSITION, "identity", LOG) or entry.startswith(f".{POSITION}.") or temporary_segment


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def locked(spool: Path) -> int | None:
    """The spool's prefetch lock, if no prefetcher holds it (closing the descriptor releases it)."""
    fd = os.open(spool / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def start_prefetcher(spool: Path, repo: str, name: str, count: int, key_file: str | None) -> None:
    """Start the prefetcher, detached, unless one serves the spool already.

    It runs in this process's working directory, so a relative spool (restore --pgdata's, in the data directory)
    names the same directory for both, and keeps naming it if the data directory is moved while it runs. `-P`:
    that directory (PostgreSQL's data directory) is never put on the import path.
    """
    fd = locked(spool)
    if fd is None:
        return
    os.close(fd)
    import subprocess  # only when a prefetcher starts

    command = [sys.executable, "-P", "-m", "braid.cli.wal_prefetcher", "--repo", repo, "--name", name, "--spool", str(spool), "--count", str(count)]
    if key_file:
        command += ["--key-file", key_file]
    with open(spool / LOG, "ab") as log:
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)


def _position(spool: Path) -> WalFile | None:
    try:
        return WalFile.parse((spool / POSITION).read_text().strip())
    except (FileNotFoundError, BackupError):
        return None


def _wanted(spool: Path, count: int, segment_size: int) -> list[str]:
    position = _position(spool)
    if position is None or position.kind != SEGMENT:
        return []
    segno = position.segno(segment_size)
    present = set(spooled_segments(spool))
    ahead = [segment_name(position.timeline, segno + k, segment_size) for k in range(1, count + 1)]
    return [n for n in ahead if n not in present]


def prefetch(repository: Repository, keys: KeyService, name: str, spool: Path, count: int, staging: WalStaging | None = None) -> None:
    """Keep the `count` segments after the spool's position spooled, verified, until IDLE_EXIT seconds pass without a new
    position; then remove the spool (remove_spool). On a failure, drop the spooled segments and raise."""
    from braid.ops.wal import segment_size_of

    size = segment_size_of(repository.store, name)
    try:
        _prefetch_until_idle(repository, keys, name, spool, count, size, staging)
    except BaseException:
        forget_spool(spool)  # nothing spooled outlives the prefetcher; the log says what failed
        raise
    remove_spool(spool)  # no request for IDLE_EXIT seconds: recovery ended, paused or stopped; nothing stays behind


def _prefetch_until_idle(
    repository: Repository, keys: KeyService, name: str, spool: Path, count: int, size: int, staging: WalStaging | None
) -> None:
    from braid.errors import WalNotArchivedError
    from braid.ops.wal_fetch import fetch_wal_bytes, write_atomically

    last, idle_since = None, time.monotonic()
    while time.monotonic() - idle_since < IDLE_EXIT:
        position = _position(spool)
        if position != last:  # a new position, from wal-fetch or the restore_command's sh fast path
            last, idle_since = position, time.monotonic()
            if position is not None:
                _drop_before(spool, position.name)
        wanted = _wanted(spool, count, size)
        if not wanted:
            time.sleep(0.05)
            continue
        try:
            data = fetch_wal_bytes(repository, keys, name, wanted[0], staging)
        except WalNotArchivedError:
            time.sleep(0.2)  # not archived (yet): the archive's end, for now
            continue
        if wanted[0] in _wanted(spool, count, size):  # still ahead of PostgreSQL (it may have asked past it meanwhile)
            write_atomically(spool / wanted[0], data)
