"""`braid forget NAME@ID`: remove one backup, manifest first (braid.ops.forget).

Needs no key, so a backup whose manifest is unreadable can be removed too.
"""

from __future__ import annotations

import argparse

from braid.cli.compose import open_repository, repo_url
from braid.cli.retention_render import print_forget
from braid.format.ids import BackupRef
from braid.format.repository import Repository
from braid.ops.forget import exact_ref, execute_forget, plan_forget
from braid.ops.wal_retention import WalPrunePlan


def cmd_forget(args: argparse.Namespace) -> int:
    ref = exact_ref(BackupRef.parse(args.backup))
    repository = open_repository(repo_url(args.repo))
    plan = plan_forget(repository, ref, with_children=args.with_children)
    wal = _wal_after(repository, ref)
    if not args.dry_run:
        execute_forget(repository, plan)
    if args.json or not args.quiet:
        print_forget(plan, args.dry_run, args.json, wal)
    return 0


def _wal_after(repository: Repository, ref: BackupRef) -> WalPrunePlan | None:
    """The WAL of ref's name no other backup needs (prune removes it), when the name has a WAL archive."""
    from braid.ops.wal_retention import archive_names, plan_wal_prune

    if ref.name not in archive_names(repository.store):
        return None
    return plan_wal_prune(repository, ref.name, [other for other in repository.backups(ref.name) if other != ref])
