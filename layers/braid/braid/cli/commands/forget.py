"""`braid forget NAME@ID`: remove one backup, manifest first (braid.ops.forget).

Needs no key, so a backup whose manifest is unreadable can be removed too.
"""

from __future__ import annotations

import argparse

from braid.cli.compose import open_repository, repo_url
from braid.cli.render import print_forget
from braid.format.ids import BackupRef
from braid.ops.forget import exact_ref, execute_forget, plan_forget


def cmd_forget(args: argparse.Namespace) -> int:
    ref = exact_ref(BackupRef.parse(args.backup))
    repository = open_repository(repo_url(args.repo))
    plan = plan_forget(repository, ref, with_children=args.with_children)
    if not args.dry_run:
        execute_forget(repository, plan)
    if args.json or not args.quiet:
        print_forget(plan, args.dry_run, args.json)
    return 0
