"""`wal-push --async`: archive_command answered by a resident pusher (braid.cli.wal_pusher).

PostgreSQL runs archive_command once per segment, one at a time; a busy
cluster writes segments faster than one process start plus a synchronous
store each. The pusher looks ahead at `pg_wal/archive_status/*.ready` and
stores several files in parallel, and writes an `ok/FILE` marker in its
private spool only once FILE is durable in the repository. This call:

1. returns 0 at once when its file's `ok` marker is there (and removes it);
2. otherwise asks for the file (`queue/FILE`), starts the pusher if none
   holds the spool's lock, and waits for the marker, at most
   --archive-timeout seconds;
3. fails with one line when the pusher reported an error for the file
   (`error/FILE`), stopped, or did not store it in time (back-pressure:
   PostgreSQL keeps the segment and retries), never reporting a file as
   archived that is not stored.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from braid.contract import ENV_REPO
from braid.errors import StorageError, UsageError
from braid.format.wal import WalFile
from braid.ops.spool import spool_for

if TYPE_CHECKING:
    import subprocess

LOCK = "pusher.lock"
OK = "ok"
ERROR = "error"
QUEUE = "queue"
LOG = "pusher.log"


def pusher_running(spool: Path) -> bool:
    """Whether a pusher holds the spool's lock (a lock file, flock'd while it lives: no stale pid files)."""
    fd = os.open(spool / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock this call took
    return False


def start_pusher(args: argparse.Namespace, name: str, wal_directory: Path, spool: Path, repo: str) -> subprocess.Popen[bytes]:
    """Start the resident pusher, detached (its own session), logging to the spool's pusher.log.

    `-P`: archive_command runs in the data directory, which is never put on the pusher's import path."""
    import subprocess  # only when a pusher must be started: most calls find their file stored already

    command = [
        sys.executable, "-P", "-m", "braid.cli.wal_pusher", "--repo", repo, "--name", name, "--wal-dir", str(wal_directory),
        "--spool", str(spool), "--workers", str(args.workers), "--level", str(args.level),
    ]
    if args.key_file:
        command += ["--key-file", str(args.key_file)]
    with open(spool / LOG, "ab") as log:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)


def _request(spool: Path, file_name: str, path: Path) -> None:
    queue = spool / QUEUE
    queue.mkdir(mode=0o700, exist_ok=True)
    tmp = queue / f".{file_name}.{os.getpid()}"
    tmp.write_text(str(path.absolute()))
    os.replace(tmp, queue / file_name)


def _consume(marker: Path) -> str | None:
    """The marker's text, removing it; None when it is not there."""
    try:
        text = marker.read_text()
    except FileNotFoundError:
        return None
    try:
        marker.unlink()
    except FileNotFoundError:
        pass
    return text


def push_async(args: argparse.Namespace, name: str, path: Path) -> None:
    """Return once the pusher has stored `path`; StorageError (one line) when it failed, stopped or did not keep up."""
    file = WalFile.parse(path.name)
    repo = args.repo or os.environ.get(ENV_REPO)
    if not repo:
        raise UsageError("no repository given: pass --repo DIR|s3://BUCKET/PREFIX, set BRAID_REPO, or set repo in the config file")
    wal_directory = path.absolute().parent
    spool = spool_for(args.spool, "push", repo, name, wal_directory)
    for directory in (OK, ERROR):
        (spool / directory).mkdir(mode=0o700, exist_ok=True)
    if _consume(spool / OK / file.name) is not None:
        return
    _request(spool, file.name, path)
    deadline = time.monotonic() + args.archive_timeout
    started: subprocess.Popen[bytes] | None = None
    pause = 0.005
    while True:
        if _consume(spool / OK / file.name) is not None:
            return
        error = _consume(spool / ERROR / file.name)
        if error is not None:
            raise StorageError(f"the asynchronous pusher could not archive {file.name}: {error.strip()}")
        if not pusher_running(spool):
            if started is None:
                started = start_pusher(args, name, wal_directory, spool, repo)
            elif started.poll() is not None:
                tail = _log_tail(spool / LOG)
                raise StorageError(f"the asynchronous pusher stopped before archiving {file.name}{': ' + tail if tail else ''} (log {spool / LOG})")
        if time.monotonic() > deadline:
            waiting = len(list((wal_directory / "archive_status").glob("*.ready")))
            raise StorageError(
                f"the asynchronous pusher has not archived {file.name} within {args.archive_timeout:g} s ({waiting} file(s) waiting):"
                f" it cannot keep up with this cluster's WAL or the repository is slow (log {spool / LOG}); PostgreSQL will retry"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _log_tail(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:400] if lines else ""
