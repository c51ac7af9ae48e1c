"""`braid prune`: apply a retention policy (the same code the scheduled maintenance job runs).

Needs the key: only backups whose manifest authenticates count towards a
rule (braid.ops.retention). Unreadable backups are reported and left in
place; the prune does everything else that is safe, prints what it did,
then exits non-zero naming the first unreadable backup.

Without --keep-* rules each name's stored policy applies (names without
one are left alone); --save-policy / --show-policy / --delete-policy
manage those policies and prune nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from braid.cli.compose import open_key_service, open_repository, repo_url
from braid.cli.render import print_json, print_policies, print_prune_plan
from braid.errors import UsageError
from braid.format.policy import KeepRules
from braid.ops.retention import PrunePlan, RetentionPolicy, delete_policy, execute_prune, load_policies, plan_prune, save_policy, unreadable_error
from braid.ops.wal_retention import WalPrunePlan, archive_names, execute_wal_prune, plan_wal_prune


def _rules(args: argparse.Namespace) -> dict[str, Any]:
    """The keep rules given on the command line (the --keep-* flags are KeepRules' fields)."""
    return {f.name: getattr(args, f.name) for f in fields(KeepRules) if getattr(args, f.name) is not None}


def _policy(args: argparse.Namespace, stored: bool) -> RetentionPolicy:
    return RetentionPolicy.of(orphan_grace_hours=args.orphan_grace_hours, stored=stored, **_rules(args))


def _wal_plans(repository: Any, plan: PrunePlan, name: str | None) -> list[WalPrunePlan]:
    """Per name with a WAL archive (and a policy this prune applied): the WAL no backup it keeps needs."""
    kept = [*plan.keep, *(locked.ref for locked in plan.locked)]
    names = [n for n in archive_names(repository.store) if name in (None, n) and n not in plan.unmanaged]
    return [plan_wal_prune(repository, n, kept, [u.ref for u in plan.unreadable if u.ref.name == n]) for n in names]


def cmd_prune(args: argparse.Namespace) -> int:
    managing = args.save_policy or args.delete_policy
    if managing and args.name is None:
        raise UsageError(f"--{'save' if args.save_policy else 'delete'}-policy needs --name NAME: policies are stored per name")
    given = bool(_rules(args))
    if args.save_policy:
        policy = _policy(args, stored=False)  # validates; a policy without a rule is refused
    elif args.delete_policy or args.show_policy:
        if given:
            raise UsageError("--show-policy and --delete-policy take no --keep-* rule")
        policy = None
    else:
        policy = _policy(args, stored=not given)
    repository = open_repository(repo_url(args.repo))
    if args.save_policy:
        assert policy is not None
        key = save_policy(repository, args.name, policy.rules)
        print_policies({args.name: policy.rules}, args.json, saved=key)
        return 0
    if args.delete_policy:
        deleted = delete_policy(repository, args.name)
        if args.json:
            print_json({"name": args.name, "deleted": deleted}, indent=None)
        else:
            print(f"removed the stored policy of {args.name}" if deleted else f"no stored policy for {args.name}")
        return 0
    if args.show_policy:
        policies = load_policies(repository)
        print_policies({k: v for k, v in policies.items() if args.name in (None, k)}, args.json)
        return 0
    assert policy is not None
    keys = open_key_service(repository, args.key_file, unwrap_only=True, strict=args.strict_permissions)
    plan = plan_prune(repository, policy, keys, name=args.name)
    wal = _wal_plans(repository, plan, args.name)
    if not args.dry_run:
        execute_prune(repository, plan)
        execute_wal_prune(repository, wal)
    error = unreadable_error(plan)
    if args.json or not args.quiet or error is not None:
        print_prune_plan(plan, args.dry_run, args.json, wal)
    if error is not None:
        raise error
    return 0
