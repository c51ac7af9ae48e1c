"""Policy `pipe-buffer`: every pipe Braid reads a backup from or writes a restore into gets a 1 MiB kernel buffer.

A Linux pipe holds 64 KiB by default, so a producer and Braid on a busy
host hand the stream over in 64 KiB turns, each a wake-up of the other
side (pg_basebackup into Braid: ~13,000 per GiB). `widen` asks the kernel
for PIPE_BUFFER_BYTES (F_SETPIPE_SZ) on a pipe or named pipe; the
measured worth is in docs/design/2026-11-29-pipe-buffer.md.

Contract: it never fails the backup or restore. Not a pipe, the policy
off (ENV_PIPE_BUFFER=off), or a kernel that refuses (EPERM once the user's
pipe pages pass /proc/sys/fs/pipe-user-pages-soft, a size above
/proc/sys/fs/pipe-max-size, EBUSY when the pipe holds more than the new
size): the pipe keeps the size it had. It only ever enlarges a pipe, so it
adds at most PIPE_BUFFER_BYTES of kernel memory per input or output, and
bytes in flight are the pipe's as before: no ordering or end-of-stream
change.
"""

from __future__ import annotations

import fcntl
import os
import stat

from braid.contract import ENV_PIPE_BUFFER

__all__ = ["PIPE_BUFFER_BYTES", "enabled", "widen"]

PIPE_BUFFER_BYTES = 1 << 20
"""The size asked for: /proc/sys/fs/pipe-max-size's default, so an unprivileged user gets it (pipe(7))."""

# Linux's fcntl numbers (fcntl(2)); Python's fcntl module names them from 3.10 on Linux only.
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)


def enabled() -> bool:
    """Whether the policy is on in this process (ENV_PIPE_BUFFER unset or anything but "off")."""
    return os.environ.get(ENV_PIPE_BUFFER, "").strip().lower() != "off"


def widen(fd: int) -> int | None:
    """Enlarge the pipe behind `fd` to PIPE_BUFFER_BYTES if the policy is on; its size now, or None if left as it was."""
    if not enabled():
        return None
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
        if fcntl.fcntl(fd, _F_GETPIPE_SZ) >= PIPE_BUFFER_BYTES:
            return None
        return fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BUFFER_BYTES)
    except OSError:
        return None
