"""`braid prune`: apply a retention policy (the same code the scheduled maintenance job runs).

Needs the key: only backups whose manifest authenticates count towards a
rule (braid.ops.retention). Unreadable backups are reported and left in
place; the prune does everything else that is safe, prints what it did,
then exits non-zero naming the first unreadable backup.

Without --keep-* rules each name's stored policy applies (names without
one are left alone); --save-policy / --show-policy / --delete-policy
manage those policies and prune nothing. A policy may move old backups'
chunks to a cheaper S3 storage class (`--storage-class CLASS:DAYS`,
braid.ops.storage_class): prune moves the kept backups that are due, and
reports the early-deletion charge its removals cause (text and --json,
--dry-run included).
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from braid.cli.compose import open_key_service, open_repository, repo_url
from braid.cli.render import print_json
from braid.cli.retention_render import print_policies, print_prune_plan
from braid.cli.storage_options import check_prune_options
from braid.cli.storage_render import print_storage_plan, print_storage_policies
from braid.errors import UsageError
from braid.format.ids import BackupRef
from braid.format.policy import KeepRules
from braid.ops.catalog import Unreadable, read_catalog
from braid.ops.prices import load_prices
from braid.ops.retention import PrunePlan, RetentionPolicy, delete_policy, execute_prune, load_policies, plan_prune, save_policy, unreadable_error
from braid.ops.storage_class import StoragePlan, execute_moves, load_storage_policies, plan_storage, refuse_local
from braid.ops.wal_retention import execute_wal_prune, plans_for_prune, wal_error


def _rules(args: argparse.Namespace) -> dict[str, Any]:
    """The keep rules given on the command line (the --keep-* flags are KeepRules' fields)."""
    return {f.name: getattr(args, f.name) for f in fields(KeepRules) if getattr(args, f.name) is not None}


def _policy(args: argparse.Namespace, stored: bool) -> RetentionPolicy:
    return RetentionPolicy.of(orphan_grace_hours=args.orphan_grace_hours, stored=stored, **_rules(args))


def _storage_plan(repository: Any, plan: PrunePlan) -> StoragePlan:
    """The moves due among the backups this prune keeps, and the early-deletion charges of those it removes."""
    sizes: dict[BackupRef, int] = {}
    if plan.forget:
        for entry in read_catalog(repository, write=False).entries:
            if not isinstance(entry, Unreadable):
                sizes[BackupRef.parse(entry.backup)] = entry.stored_bytes
    kept = [*plan.keep, *(locked.ref for locked in plan.locked)]
    return plan_storage(repository, kept, plan.forget, sizes, plan.now, load_prices(repository.store))


def cmd_prune(args: argparse.Namespace) -> int:
    storage = check_prune_options(args)
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
        if storage is not None:
            refuse_local(repository.store, f"--storage-class {storage}")
        key = save_policy(repository, args.name, policy.rules, storage)
        _print_policies({args.name: policy.rules}, {args.name: storage} if storage else {}, args.json, saved=key)
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
        classes = {k: v for k, v in load_storage_policies(repository).items() if args.name in (None, k)}
        _print_policies({k: v for k, v in policies.items() if args.name in (None, k)}, classes, args.json)
        return 0
    assert policy is not None
    keys = open_key_service(repository, args.key_file, unwrap_only=True, strict=args.strict_permissions)
    plan = plan_prune(repository, policy, keys, name=args.name)
    wal = plans_for_prune(repository, plan, args.name)
    storage_plan = _storage_plan(repository, plan)  # before anything is removed: the charges come from the storage records
    if not args.dry_run:
        execute_prune(repository, plan)
        execute_wal_prune(repository, wal, keep_going=True)  # a failure is reported below, after the moves
        execute_moves(repository, storage_plan, plan.now)
    error = unreadable_error(plan) or wal_error(wal)
    if args.json or not args.quiet or error is not None or storage_plan.early:
        prices = load_prices(repository.store)
        print_prune_plan(plan, args.dry_run, args.json, wal, storage_plan.to_json(prices.currency))
        if not args.json:
            print_storage_plan(storage_plan, args.dry_run, prices)
    if error is not None:
        raise error
    return 0


def _print_policies(rules: dict[str, KeepRules], classes: dict[str, Any], as_json: bool, saved: str | None = None) -> None:
    if as_json:
        doc: dict[str, Any] = {"policies": {n: r.to_json() for n, r in sorted(rules.items())}}
        if classes:  # names whose policy sets a storage class: {"NAME": {"class", "after_days"}}
            doc["storage"] = {n: c.to_json() for n, c in sorted(classes.items())}
        if saved is not None:
            doc["saved"] = saved
        print_json(doc)
        return
    print_policies(rules, False, saved)
    print_storage_policies(classes, False)
