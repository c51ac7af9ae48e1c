"""`braid restore NAME@ID --pgdata DIR [--target-...]`: a PostgreSQL data directory, ready to recover to a target.

The checks that write nothing come first (the target's form, DIR empty and
no running server in it, the backup one tar stream), then the verified
restore extracts into DIR (braid.ops.pgdata), then recovery.signal and the
settings (braid.ops.recovery). A failure after extraction began removes
what was extracted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from braid.cli.budget import check_restore_memory
from braid.cli.compose import is_s3_url, key_service_on_demand, open_repository, repo_url
from braid.cli.progress import Progress
from braid.cli.render import operation_summary, print_json
from braid.contract import ENV_KEY_FILE
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.format.repository import Repository
from braid.ops.open import OpenedBackup, open_backup
from braid.ops.pgdata import PgDataTarget, check_pgdata
from braid.ops.recovery import RecoveryTarget, backup_before, fetch_spool, parse_target_time, restore_command, write_recovery
from braid.ops.restore import restore_backup


def recovery_target(args: argparse.Namespace) -> RecoveryTarget:
    for kind in ("time", "lsn", "xid", "name"):
        value = getattr(args, f"target_{kind}")
        if value is not None:
            return RecoveryTarget(kind, value, args.target_action, args.target_timeline)
    return RecoveryTarget(None, "", args.target_action, args.target_timeline)


def braid_executable() -> list[str]:
    """How PostgreSQL runs this same Braid: the absolute path of the running `braid`, else this Python with -m braid.cli."""
    argv0 = sys.argv[0] if sys.argv else ""
    found = shutil.which(argv0) if argv0 and os.path.basename(argv0).startswith("braid") else None
    if found:
        return [os.path.abspath(found)]
    return [os.path.abspath(sys.executable), "-P", "-m", "braid.cli"]


def explicit_key_file(args: argparse.Namespace) -> str | None:
    given = args.key_file or os.environ.get(ENV_KEY_FILE)
    return str(Path(given).expanduser().absolute()) if given else None


def check_pgdata_args(args: argparse.Namespace) -> None:
    if args.output or args.run or args.pipes:
        raise UsageError("--pgdata extracts the backup itself: it excludes --output, --pipes and a command after --")
    if args.force:
        raise UsageError("--pgdata never overwrites: give an empty or new directory (--force does not apply)")


def cmd_restore_pgdata(args: argparse.Namespace, progress: Progress) -> int:
    check_pgdata_args(args)
    target = recovery_target(args)
    target.check()
    directory = os.path.abspath(args.pgdata)
    check_pgdata(directory)
    url = repo_url(args.repo)
    repository = open_repository(url)
    ref = BackupRef.parse(args.backup)
    if ref.is_latest and target.kind == "time":
        ref = backup_before(repository, ref.name, parse_target_time(target.value))
    manifest, key = open_backup(repository, ref, key_service_on_demand(repository, args.key_file))
    progress.backup = manifest.backup
    if manifest.lineage.is_incremental:  # every link, then pg_combinebackup into DIR (braid.ops.chain_restore)
        from braid.cli.commands.restore_chain import restore_chain_pgdata

        restore_chain_pgdata(args, progress, repository, OpenedBackup(manifest, key), directory)
    else:
        _restore_full(args, progress, repository, OpenedBackup(manifest, key), directory)
    repo = url if is_s3_url(url) else os.path.abspath(os.path.expanduser(url))
    command = restore_command(braid_executable(), repo, manifest.name, explicit_key_file(args), fetch_spool(directory, repo, manifest.name))
    write_recovery(directory, command, target, manifest.backup)
    elapsed = progress.elapsed()
    summary = operation_summary(manifest, "restore", elapsed)
    progress({"event": "done", **summary})
    if args.json:  # the progress vocabulary's `done` has the figures; this document also says what was written
        extra: dict[str, object] = {"pgdata": directory, "restore_command": command, "target": {target.kind: target.value} if target.kind else None}
        if manifest.wal is not None:
            extra["wal"] = manifest.wal.to_json()
        print_json({**summary, **extra, "elapsed": round(elapsed, 3)}, indent=None)
    return 0


def _restore_full(args: argparse.Namespace, progress: Progress, repository: Repository, opened: OpenedBackup, directory: str) -> None:
    """One full backup's tar, extracted into DIR."""
    manifest, key = opened
    if len(manifest.inputs) != 1:
        raise UsageError(
            f"backup {manifest.backup} has {len(manifest.inputs)} inputs; --pgdata restores one pg_basebackup -Ft -D - stream"
            " (one tar: tablespaces cannot be written to stdout)"
        )
    check_restore_memory(manifest, args.workers)
    label = f"--pgdata {directory}"
    restore_backup(
        repository.store, manifest, key, [PgDataTarget(label, directory, max(2, args.workers))], workers=args.workers, progress=progress
    )
