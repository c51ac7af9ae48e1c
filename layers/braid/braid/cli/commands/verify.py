"""`braid verify`: quick (stored checksums) or --deep (authenticated and decoded), one backup or --all."""

from __future__ import annotations

import argparse
from typing import Any

from braid.cli.compose import open_key_service, open_repository, repo_url
from braid.cli.render import print_verify_reports
from braid.errors import BackupError, IntegrityError
from braid.format.ids import BackupRef
from braid.ops.verify import verify_published


def cmd_verify(args: argparse.Namespace) -> int:
    repository = open_repository(repo_url(args.repo))
    refs = repository.backups() if args.all else [repository.resolve(BackupRef.parse(args.backup))]
    keys = open_key_service(repository, args.key_file, unwrap_only=True) if args.deep else None
    reports: list[dict[str, Any]] = []
    for ref in refs:
        try:
            reports.append(verify_published(repository, ref, keys, sample_percent=args.sample, workers=args.workers).to_json())
        except BackupError as exc:
            if not args.all:
                raise
            # --all reports every backup: one that will not open is a failure among the others.
            reports.append({"backup": str(ref), "ok": False, "failures": [str(exc)]})
    print_verify_reports(reports, args.json)
    failed = [r for r in reports if not r["ok"]]
    if failed:
        first = failed[0]["failures"][0] if failed[0]["failures"] else "verification failed"
        raise IntegrityError(f"{len(failed)} of {len(reports)} backup(s) failed verification; first: {first}")
    return 0
