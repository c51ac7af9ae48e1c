"""`braid copy NAME@ID|--all [--name NAME] --to REPO2 [--to-key-file PATH]`: backups into a second repository (braid.ops.copy).

Chunks are copied as stored (never decrypted); each data key is re-wrapped
for the target's master key (its key file: `--to-key-file`, else its
default path) or KMS key. Prints each copied backup's NAME@ID on stdout
(those the target already held too: a rerun is safe). Exit 0 when every
backup asked for is in the target; else the first failure's exit code,
after copying the others.
"""

from __future__ import annotations

import argparse
import sys

from braid.cli.compose import open_copy_target, open_key_service, open_repository, repo_url
from braid.cli.render import print_json
from braid.cli.sizes import format_size
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.ops.copy import copy_backups


def cmd_copy(args: argparse.Namespace) -> int:
    if args.all == bool(args.backup):
        raise UsageError("give the backup to copy (NAME@ID or NAME@latest) or --all, not both")
    if args.backup and args.name:
        raise UsageError("--name goes with --all (every backup of NAME); a NAME@ID names its backup already")
    source = open_repository(repo_url(args.repo))
    refs = source.backups(args.name) if args.all else [BackupRef.parse(args.backup)]
    if args.all and not refs:
        what = f"named {args.name!r} " if args.name else ""
        raise UsageError(f"no backups {what}in {source.url} to copy{source.suggest_name(args.name) if args.name else ''}")
    source_keys = open_key_service(source, args.key_file, unwrap_only=True)
    target = open_copy_target(source, source_keys, args.to, args.to_key_file)

    def progress(backup: str, outcome: str) -> None:
        if not args.json:
            print(backup, flush=True)
        if not args.quiet and not args.json:
            print(f"{outcome} {backup} to {target.repository.url}", file=sys.stderr, flush=True)

    report = copy_backups(source, source_keys, target, refs, workers=args.workers, progress=progress)
    if args.json:
        print_json(report.to_json())
    elif not args.quiet:
        print(
            f"{len(report.copied)} backup(s) copied ({report.objects} objects, {format_size(report.bytes)}),"
            f" {len(report.already)} already in {target.repository.url}",
            file=sys.stderr,
        )
    if report.failed:
        backup, first = report.failed[0]
        for other, error in report.failed:
            print(f"FAILED {other}: {error}", file=sys.stderr)
        raise type(first)(f"{len(report.failed)} backup(s) could not be copied (the others were); first: {backup}: {first}")
    return 0
