"""`braid list` and `braid show`: what the repository holds, read without a key.

Both read manifests checked against their own checksums only; nothing here
decrypts, so a host without the key can still see what is there.
`list --incomplete` shows what has no manifest yet (braid.ops.incomplete).
"""

from __future__ import annotations

import argparse
from typing import Any

from braid.cli.compose import open_repository, repo_url
from braid.cli.render import manifest_summary, print_backup_list, print_incomplete_list, print_manifest
from braid.errors import BackupError
from braid.format.ids import BackupRef, validate_name
from braid.ops.incomplete import incomplete_backups
from braid.ops.open import read_manifest


def cmd_list(args: argparse.Namespace) -> int:
    if args.name is not None:
        validate_name(args.name)  # a name is a path component: "../x" is a usage error, not a lookup
    repository = open_repository(repo_url(args.repo))
    if args.incomplete:
        print_incomplete_list([found.to_json() for found in incomplete_backups(repository, args.name)], args.json)
        return 0
    rows: list[dict[str, Any]] = []
    for ref in repository.backups(args.name):
        try:
            rows.append(manifest_summary(read_manifest(repository, ref)))
        except BackupError as exc:  # one bad manifest must not hide the others
            rows.append({"backup": str(ref), "error": str(exc), "created": ""})
    rows.sort(key=lambda row: (row["created"], row["backup"]))
    empty = f"no backups named {args.name!r}{repository.suggest_name(args.name)}" if args.name and not rows else "no backups"
    print_backup_list(rows, args.json, empty=empty)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    repository = open_repository(repo_url(args.repo))
    print_manifest(read_manifest(repository, BackupRef.parse(args.backup)), args.json)
    return 0
