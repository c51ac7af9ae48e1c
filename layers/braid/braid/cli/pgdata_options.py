"""`braid restore --pgdata DIR` and its recovery targets: the options, declared apart from braid.cli.parser's table."""

from __future__ import annotations

import argparse


def add_pgdata_options(restore: argparse.ArgumentParser) -> None:
    """--pgdata, one --target-* (mutually exclusive), --target-action and --target-timeline."""
    group = restore.add_argument_group(
        "PostgreSQL point-in-time restore",
        "extract a pg_basebackup -Ft backup into an empty DIR (mode 0700), as the database's user (files take its ownership);\n"
        "write recovery.signal and, in postgresql.auto.conf, restore_command = 'braid wal-fetch ...' and the target;\n"
        "pg_ctl start then recovers to it (to the end of the archive without a target)",
    )
    group.add_argument("--pgdata", metavar="DIR", help="the data directory to create: absent or empty (exit 2 otherwise, nothing written)")
    targets = group.add_mutually_exclusive_group()
    targets.add_argument("--target-time", metavar="T", help="recover to T (YYYY-MM-DD HH:MM:SS[.ffffff][+HH]); with NAME@latest, from the newest backup that ended before T")
    targets.add_argument("--target-lsn", metavar="L", help="recover to WAL position L (X/Y)")
    targets.add_argument("--target-xid", metavar="X", help="recover to transaction id X")
    targets.add_argument("--target-name", metavar="N", help="recover to the restore point N (pg_create_restore_point)")
    group.add_argument("--target-action", choices=("promote", "pause", "shutdown"), help="what the server does at the target (PostgreSQL's default: pause)")
    group.add_argument("--target-timeline", metavar="latest|N", help="the timeline to recover along (PostgreSQL's default: latest)")
