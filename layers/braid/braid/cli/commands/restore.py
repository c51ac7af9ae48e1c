"""`braid restore`: a backup's original bytes to stdout, one --output per input, or a command after `--`.

With a command (braid.ops.consumer), the restore succeeds only if the
command read every byte and exited 0; every chunk is checked present before
it starts, since a database restore may drop the old database first.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from braid.cli.budget import check_restore_memory
from braid.cli.compose import key_service_on_demand, open_repository, repo_url
from braid.cli.progress import Progress
from braid.cli.render import operation_summary, print_json
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.ops.open import open_backup
from braid.ops.restore import OutputTarget, check_chunks_present, restore_backup, targets_from_args
from braid.ports.progress import ProgressFn

if TYPE_CHECKING:
    from braid.ops.consumer import Consumer


def _consumer(args: argparse.Namespace) -> Consumer | None:
    """The command after `--` (not started yet), or None for stdout / --output."""
    if args.run is None:
        if args.pipes:
            raise UsageError("--pipes makes pipes for a command to read: give it after --, e.g. -- db2 restore db SAMPLE from {pipes}")
        return None
    if args.output:
        raise UsageError("--output and a command after -- exclude each other: the command reads the restore")
    from braid.ops.consumer import Consumer  # with its subprocess machinery, only when there is a command to run

    return Consumer(args.run, pipes=args.pipes)


def cmd_restore(args: argparse.Namespace) -> int:
    if args.pgdata is not None:
        from braid.cli.commands.restore_pgdata import check_pgdata_args, cmd_restore_pgdata

        check_pgdata_args(args)
        with Progress.for_command(args) as progress:
            progress.backup = args.backup
            return cmd_restore_pgdata(args, progress)
    if getattr(args, "chain", False):  # each link through the command (braid.cli.commands.restore_chain)
        from braid.cli.commands.restore_chain import restore_chain_generic

        with Progress.for_command(args) as progress:
            progress.backup = args.backup
            return restore_chain_generic(args, progress)
    if any(getattr(args, f"target_{k}") is not None for k in ("time", "lsn", "xid", "name", "action", "timeline")):
        raise UsageError("--target-* options need --pgdata DIR: they are written into the restored data directory's recovery settings")
    consumer = _consumer(args)
    with Progress.for_command(args) as progress:  # from here on, a failure is in the --log-file too
        progress.backup = args.backup
        return _restore(args, consumer, progress)


def _restore(args: argparse.Namespace, consumer: Consumer | None, progress: Progress) -> int:
    repository = open_repository(repo_url(args.repo))
    ref = BackupRef.parse(args.backup)
    keys = key_service_on_demand(repository, args.key_file, strict=args.strict_permissions)
    manifest, key = open_backup(repository, ref, keys)
    if manifest.lineage.is_incremental:  # every ancestor present and authentic before a byte is written (exit 6)
        from braid.ops.chain import open_chain

        open_chain(repository, BackupRef.parse(manifest.backup), keys, purpose="the incremental")
    targets = targets_from_args(args.output, manifest) if consumer is None else []
    if consumer is not None:
        consumer.check(manifest)
    check_restore_memory(manifest, args.workers)
    progress.backup = manifest.backup

    def run(targets: list[OutputTarget], progress: ProgressFn) -> None:
        restore_backup(repository.store, manifest, key, targets, workers=args.workers, force=args.force, progress=progress, open_timeout=args.open_timeout)

    if consumer is None:
        run(targets, progress)
    else:
        check_chunks_present(repository.store, manifest, key)  # before the consumer may touch the database
        consumer.restore(manifest, run, progress)
    elapsed = progress.elapsed()
    summary = operation_summary(manifest, "restore", elapsed)
    progress({"event": "done", **summary})
    if args.json and (args.output or consumer is not None):  # stdout is free: the summary document goes there
        print_json({**summary, "elapsed": round(elapsed, 3)}, indent=None)
    return 0
