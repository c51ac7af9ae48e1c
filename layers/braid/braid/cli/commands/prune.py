"""`braid prune`: apply a retention policy (the same code the scheduled maintenance job runs)."""

from __future__ import annotations

import argparse

from braid.cli.compose import open_repository, repo_url
from braid.cli.render import print_prune_plan
from braid.ops.retention import RetentionPolicy, execute_prune, plan_prune


def cmd_prune(args: argparse.Namespace) -> int:
    policy = RetentionPolicy(args.keep_last, args.keep_days, args.orphan_grace_hours)
    repository = open_repository(repo_url(args.repo))
    plan = plan_prune(repository, policy)
    if not args.dry_run:
        execute_prune(repository, plan)
    print_prune_plan(plan, args.dry_run, args.json)
    return 0
