"""`braid verify`: quick (stored checksums) or --deep (authenticated and decoded), one backup or --all.

The exit code says what kind of trouble was found, as restore's would: 6
when something was read and found wrong, otherwise the code of what stopped
the check (7 for chunks the repository would not hand over, 4 for a key
that does not open a backup under --all, ...). A storage failure is never
reported as corruption: "permission denied" is not a bad chunk.
"""

from __future__ import annotations

import argparse
from typing import Any

from braid.cli.compose import open_key_service, open_repository, repo_url
from braid.cli.render import print_verify_reports
from braid.errors import BackupError, IntegrityError, StorageError
from braid.format.ids import BackupRef
from braid.ops.verify import verify_published


def cmd_verify(args: argparse.Namespace) -> int:
    repository = open_repository(repo_url(args.repo))
    refs = repository.backups() if args.all else [repository.resolve(BackupRef.parse(args.backup))]
    keys = open_key_service(repository, args.key_file, unwrap_only=True) if args.deep else None
    reports: list[dict[str, Any]] = []
    errors: list[BackupError] = []  # what stopped each failed backup's check, most serious first below
    for ref in refs:
        try:
            report = verify_published(repository, ref, keys, sample_percent=args.sample, workers=args.workers)
        except BackupError as exc:
            if not args.all:
                raise
            # --all reports every backup: one that will not open is a failure among the others.
            reports.append({"backup": str(ref), "ok": False, "failures": [str(exc)], "unreadable": []})
            errors.append(exc)
            continue
        reports.append(report.to_json())
        if report.corrupt:
            errors.append(IntegrityError(next(f for f in report.failures if f not in report.unreadable)))
        elif not report.ok:
            errors.append(StorageError(report.unreadable[0]))
    failed = [r for r in reports if not r["ok"]]
    if args.json or not args.quiet:
        print_verify_reports(reports, args.json)
    elif failed:  # --quiet: only what failed, for the cron mail
        print_verify_reports(failed, args.json)
    if failed:
        # Corruption outranks an unreadable chunk: the one is proof of damage, the other only a check not done.
        worst = next((e for e in errors if isinstance(e, IntegrityError)), errors[0])
        what = "failed verification" if isinstance(worst, IntegrityError) else "could not be verified"
        raise type(worst)(f"{len(failed)} of {len(reports)} backup(s) {what}; first: {worst}")
    return 0
