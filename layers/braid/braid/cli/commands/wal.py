"""`braid wal-push` and `braid wal-fetch`: PostgreSQL's archive_command and restore_command.

Both print nothing on success (PostgreSQL logs their output) and one line
on failure. wal-fetch's exit 1 is reserved for "not in the archive"
(braid.errors.WalNotArchivedError); braid.cli.main keeps every other
failure of it at 2 or more.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from braid.errors import UsageError

if TYPE_CHECKING:
    from braid.format.repository import Repository
    from braid.ops.wal_lookahead import Looked
    from braid.ops.wal_packed import PackListing
    from braid.ops.wal_push import PushResult
    from braid.ports.keys import KeyService


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
    import os

    from braid.cli.compose import is_s3_url, open_repository, repo_url
    from braid.contract import ENV_WAL_SYNC_BUNDLE

    url = repo_url(args.repo)
    lookahead = os.environ.get(ENV_WAL_SYNC_BUNDLE, "on") != "off"  # policy sync-bundle (braid.ops.wal_lookahead)
    looked = None
    if lookahead and is_s3_url(url) and getattr(args, "engine", None) != "local":
        from braid.cli.compose import open_store
        from braid.ops.wal_lookahead import look_in_bundle

        looked = look_in_bundle(open_store(url, light=True), name, path)  # before config.json: a staged member answers alone
    if looked is not None and looked.result is not None:
        result = looked.result
    else:
        repository = open_repository(url, light=True)  # paid once per WAL segment: no botocore where it applies
        result = push_to(repository, args.key_file, getattr(args, "engine", None), name, path, args.level, lookahead=lookahead, looked=looked)
    if args.json:
        from braid.cli.render import print_json

        print_json({"file": result.file, "outcome": result.outcome, "size": result.size, "stored_size": result.stored_size}, indent=None)
    return 0


def push_to(
    repository: Repository, key_file: str | None, engine: str | None, name: str, path: Path, level: int, keys: KeyService | None = None,
    packs: PackListing | None = None, *, lookahead: bool = False, looked: Looked | None = None,
) -> PushResult:
    """Stage the file (a repository with a pipeline: braid.ops.wal_stage), else encode and store it here (braid.ops.wal_push),
    with `keys` when the caller holds them open and `packs` when it keeps the packs' listing (the async pusher);
    `lookahead`: a plain wal-push's policy sync-bundle (its ready slot-mates staged with it: braid.ops.wal_lookahead),
    `looked` what the call read of its slot's bundle already."""
    from braid.cli.compose import open_key_service, wal_staging_for

    staging = wal_staging_for(repository, engine)
    if staging is not None and lookahead:
        from braid.ops.wal_lookahead import stage_with_mates

        return stage_with_mates(repository, staging, name, path, looked=looked)
    if staging is not None:
        from braid.ops.wal_stage import stage_wal

        return stage_wal(repository, staging, name, path, packs)
    from braid.ops.wal_push import push_wal

    return push_wal(repository, keys or open_key_service(repository, key_file), name, path, level=level)


def cmd_wal_fetch(args: argparse.Namespace) -> int:
    """Serve from the prefetch spool when it has the segment; else fetch, with the prefetcher started for the next ones."""
    import os
    import sys

    from braid.contract import ENV_REPO
    from braid.errors import BackupError, WalNotArchivedError
    from braid.format.wal import SEGMENT, WalFile

    name = _name(args, "wal-fetch")
    if args.print_restore_command:
        return _print_restore_command(args, name)
    if args.walfile is None or args.dest is None:
        raise UsageError("'braid wal-fetch' needs WALFILE DEST (restore_command's %f %p), or --print-restore-command PGDATA")
    file = WalFile.parse(args.walfile)
    dest = Path(args.dest)
    repo = args.repo or os.environ.get(ENV_REPO) or ""
    spool = None
    if args.prefetch and file.kind == SEGMENT and repo:
        from braid.ops import wal_prefetch

        try:  # a relative --spool (restore --pgdata's) is in the data directory, PostgreSQL's working directory
            spool = wal_prefetch.open_spool(args.spool, repo, name, dest.absolute().parent, file.name)
            if wal_prefetch.serve_from_spool(spool, file.name, dest):
                wal_prefetch.start_prefetcher(spool, repo, name, args.prefetch, args.key_file)
                return 0
            wal_prefetch.start_prefetcher(spool, repo, name, args.prefetch, args.key_file)
        except (BackupError, OSError) as exc:  # the prefetch only saves time: the fetch goes on without it
            print(f"braid: warning: no prefetch: {exc}", file=sys.stderr)
            spool = None
    from braid.cli.compose import key_service_on_demand, open_repository, repo_url, wal_staging_for
    from braid.ops.wal_fetch import fetch_wal

    repository = open_repository(repo_url(args.repo))
    try:
        fetch_wal(repository, key_service_on_demand(repository, args.key_file), name, file.name, dest, wal_staging_for(repository))
    except WalNotArchivedError:
        if spool is not None:
            wal_prefetch.forget_spool(spool)
        raise
    return 0


def _print_restore_command(args: argparse.Namespace, name: str) -> int:
    """The restore_command `restore --pgdata` would write for PGDATA (its spool made in PGDATA/pg_wal), on stdout."""
    import os

    from braid.cli.commands.restore_pgdata import braid_executable, explicit_key_file
    from braid.cli.compose import is_s3_url, repo_url
    from braid.ops.recovery import fetch_spool, restore_command

    if args.walfile is not None:
        raise UsageError("--print-restore-command PGDATA takes no WALFILE DEST")
    url = repo_url(args.repo)
    repo = url if is_s3_url(url) else os.path.abspath(os.path.expanduser(url))
    directory = os.path.abspath(args.print_restore_command)
    if not os.path.isdir(directory):
        raise UsageError(f"--print-restore-command: {directory} is not a directory (give the data directory to recover)")
    print(restore_command(braid_executable(), repo, name, explicit_key_file(args), fetch_spool(directory, repo, name)))
    return 0
