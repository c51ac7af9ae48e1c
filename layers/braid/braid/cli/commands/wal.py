"""`braid wal-push` and `braid wal-fetch`: PostgreSQL's archive_command and restore_command.

Both print nothing on success (PostgreSQL logs their output) and one line
on failure. wal-fetch's exit 1 is reserved for "not in the archive"
(braid.errors.WalNotArchivedError); braid.cli.main keeps every other
failure of it at 2 or more.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from braid.errors import UsageError


def _name(args: argparse.Namespace, command: str) -> str:
    if not args.name:
        raise UsageError(f"'braid {command}' needs --name NAME: the WAL archive's name (the cluster's backup name)")
    return str(args.name)


def cmd_wal_push(args: argparse.Namespace) -> int:
    name = _name(args, "wal-push")
    path = Path(args.path)
    if args.async_push:
        from braid.ops.wal_async import push_async

        push_async(args, name, path)
        return 0
    from braid.cli.compose import open_key_service, open_repository, repo_url
    from braid.ops.wal_push import push_wal

    repository = open_repository(repo_url(args.repo))
    result = push_wal(repository, open_key_service(repository, args.key_file), name, path, level=args.level)
    if args.json:
        from braid.cli.render import print_json

        print_json({"file": result.file, "outcome": result.outcome, "size": result.size, "stored_size": result.stored_size}, indent=None)
    return 0


def cmd_wal_fetch(args: argparse.Namespace) -> int:
    name = _name(args, "wal-fetch")
    from braid.cli.compose import key_service_on_demand, open_repository, repo_url
    from braid.ops.wal_fetch import fetch_wal

    repository = open_repository(repo_url(args.repo))
    fetch_wal(repository, key_service_on_demand(repository, args.key_file), name, args.walfile, Path(args.dest))
    return 0
