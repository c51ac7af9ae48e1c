"""The grammar of the WAL archive's commands, `wal-push` and `wal-fetch` (braid.cli.parser declares them).

PostgreSQL runs them once per WAL file (archive_command, restore_command),
so like every command they declare only their own options and import their
handlers when they run.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from braid.cli.parser import _backup_name, _command, _help, _level, _positive_int, _Shared

if TYPE_CHECKING:
    from braid.cli.parser import Subparsers

DEFAULT_ARCHIVE_TIMEOUT = 60.0
DEFAULT_PUSH_WORKERS = 4
DEFAULT_PREFETCH = 8


def _seconds(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= 86_400:
        raise argparse.ArgumentTypeError(f"must be a number of seconds more than 0 and at most 86400, not {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be from 0 to 64, not {text!r}")
    return value


def declare_wal_push(sub: Subparsers, shared: _Shared) -> None:
    push = sub.add_parser("wal-push", parents=[shared.common], **_help(
        "wal-push",
        "braid wal-push --repo /srv/braid --name pg %p           # postgresql.conf: archive_command = '...'",
        "braid wal-push --repo /srv/braid --name pg --async %p   # the resident pusher: several segments at once",
        description="Archive one PostgreSQL WAL file (a segment, .partial, .backup or .history file), compressed and"
                    " encrypted, as archive_command: exit 0 only once it is durable in the repository. A file already"
                    " archived with the same bytes is accepted; one with different bytes is refused (exit 7) and"
                    " nothing is overwritten.",
    ))
    push.add_argument("--name", type=_backup_name, help="the archive's name: the backup name of the cluster's base backups")
    push.add_argument("path", metavar="PATH", help="the WAL file (%%p)")
    push.add_argument("--level", type=_level, default=3, metavar="1-19", help="zstd level (default 3)")
    push.add_argument("--async", dest="async_push", action="store_true",
                      help="a resident pusher looks ahead at pg_wal/archive_status/*.ready and archives several files in"
                           " parallel; this call returns once its own file is stored (config key: async)")
    push.add_argument("--workers", type=_positive_int, default=DEFAULT_PUSH_WORKERS, metavar="N",
                      help=f"with --async: files the pusher stores at once (default {DEFAULT_PUSH_WORKERS})")
    push.add_argument("--archive-timeout", type=_seconds, default=DEFAULT_ARCHIVE_TIMEOUT, metavar="SECONDS",
                      help=f"with --async: fail (PostgreSQL retries) if the pusher has not stored this file within SECONDS"
                           f" (default {DEFAULT_ARCHIVE_TIMEOUT:g})")
    push.add_argument("--spool", metavar="DIR",
                      help="with --async: the pusher's private state directory (default $XDG_RUNTIME_DIR/braid, else /tmp/braid-UID)")
    push.set_defaults(handler=_command("wal:cmd_wal_push"))


def declare_wal_fetch(sub: Subparsers, shared: _Shared) -> None:
    fetch = sub.add_parser("wal-fetch", parents=[shared.common], **_help(
        "wal-fetch",
        "braid wal-fetch --repo /srv/braid --name pg %f %p       # restore_command = '...'",
        description="Fetch one archived WAL file's verified bytes to DEST, atomically, as restore_command. Exit 1 when"
                    " the file is not in the archive (PostgreSQL's end of the archive); every other failure exits 2 or"
                    " more. The next segments are fetched in the background into a private spool (--prefetch).",
    ))
    fetch.add_argument("--name", type=_backup_name, help="the archive's name")
    fetch.add_argument("walfile", metavar="WALFILE", nargs="?", help="the archived file's name (%%f)")
    fetch.add_argument("dest", metavar="DEST", nargs="?", help="where to write it (%%p)")
    fetch.add_argument("--print-restore-command", metavar="PGDATA",
                       help="print the restore_command for the data directory PGDATA (what restore --pgdata writes: a sh fast"
                            " path serving spooled segments without starting Braid, else this wal-fetch), making its spool in"
                            " PGDATA/pg_wal and naming it relative to PGDATA, so PGDATA may be moved; run it as the server's user")
    fetch.add_argument("--prefetch", type=_count, default=DEFAULT_PREFETCH, metavar="N",
                       help=f"segments to fetch ahead in the background (default {DEFAULT_PREFETCH}; 0: none)")
    fetch.add_argument("--spool", metavar="DIR",
                       help="the prefetch's private directory (default $XDG_RUNTIME_DIR/braid, else /tmp/braid-UID)")
    fetch.set_defaults(handler=_command("wal:cmd_wal_fetch"))
