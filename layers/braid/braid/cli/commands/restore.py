"""`braid restore`: a backup's original bytes to stdout or one --output per input."""

from __future__ import annotations

import argparse

from braid.cli.compose import key_service_on_demand, open_repository, repo_url
from braid.cli.progress import Progress
from braid.format.ids import BackupRef
from braid.ops.open import open_backup
from braid.ops.restore import restore_backup, targets_from_args


def cmd_restore(args: argparse.Namespace) -> int:
    repository = open_repository(repo_url(args.repo))
    ref = BackupRef.parse(args.backup)
    manifest, key = open_backup(repository, ref, key_service_on_demand(repository, args.key_file))
    targets = targets_from_args(args.output, manifest)
    progress = Progress.for_terminal(args.json)
    restore_backup(repository.store, manifest, key, targets, workers=args.workers, force=args.force, progress=progress)
    progress({"event": "done", "backup": manifest.backup, "bytes_written": manifest.plaintext_bytes, "chunks_done": manifest.chunk_count})
    return 0
