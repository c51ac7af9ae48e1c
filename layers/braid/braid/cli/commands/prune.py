"""`braid prune`: apply a retention policy (the same code the scheduled maintenance job runs).

Needs the key: only backups whose manifest authenticates count towards a
rule (braid.ops.retention). Unreadable backups are reported and left in
place; the prune does everything else that is safe, prints what it did,
then exits non-zero naming the first unreadable backup.
"""

from __future__ import annotations

import argparse

from braid.cli.compose import open_key_service, open_repository, repo_url
from braid.cli.render import print_prune_plan
from braid.ops.retention import RetentionPolicy, execute_prune, plan_prune, unreadable_error


def cmd_prune(args: argparse.Namespace) -> int:
    policy = RetentionPolicy(args.keep_last, args.keep_days, args.orphan_grace_hours)
    repository = open_repository(repo_url(args.repo))
    keys = open_key_service(repository, args.key_file, unwrap_only=True)
    plan = plan_prune(repository, policy, keys)
    if not args.dry_run:
        execute_prune(repository, plan)
    print_prune_plan(plan, args.dry_run, args.json)
    error = unreadable_error(plan)
    if error is not None:
        raise error
    return 0
