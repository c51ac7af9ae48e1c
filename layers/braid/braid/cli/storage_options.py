"""`braid prune --storage-class CLASS:DAYS`, and how prune and `list`/`show` print storage classes.

The option is part of a stored policy (`--save-policy`): the name's chunks
move to CLASS (STANDARD_IA or GLACIER_IR) once a kept backup is DAYS old
(braid.ops.storage_class). A directory repository has no storage classes:
saving one there is refused (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from braid.errors import UsageError
from braid.format.prices import PriceTable, significant
from braid.format.storage_class import LOCAL, StoragePolicy, monthly_cost
from braid.format.timestamps import format_timestamp
from braid.ops.storage_class import StoragePlan


def _storage_policy(text: str) -> StoragePolicy:
    try:
        return StoragePolicy.parse(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def add_prune_options(prune: argparse.ArgumentParser) -> None:
    prune.add_argument(
        "--storage-class",
        type=_storage_policy,
        metavar="CLASS:DAYS",
        help="with --save-policy: move the chunks of --name's backups to CLASS (STANDARD_IA or GLACIER_IR, both restorable"
        " without a restore request) once they are DAYS old; S3 repositories only. Manifests and the catalog stay in Standard",
    )


def check_prune_options(args: argparse.Namespace) -> StoragePolicy | None:
    """The `--storage-class` given, or None; a UsageError when it comes without --save-policy."""
    storage: StoragePolicy | None = args.storage_class
    if storage is not None and not args.save_policy:
        raise UsageError(f"--storage-class is part of a stored policy: give it with --name NAME --keep-... --storage-class {storage} --save-policy")
    return storage


def print_storage_policies(policies: Mapping[str, StoragePolicy], as_json: bool) -> None:
    if as_json:
        return  # `prune --show-policy --json` carries them under "storage" (braid.cli.commands.prune)
    for name, policy in sorted(policies.items()):
        print(f"{name}: --storage-class {policy} (chunks move to {policy.storage_class} after {policy.after_days} days)")


def print_storage_plan(plan: StoragePlan, dry_run: bool, prices: PriceTable) -> None:
    """Prune's text lines about storage classes: the moves, and each early-deletion charge with the total."""
    if plan.local:
        return
    verb = "would move" if dry_run else "moved"
    for move in plan.moves:
        print(f"{verb} the chunks of {move.ref} to {move.storage_class}")
    for entry in plan.early:
        since = format_timestamp(entry.placement.since) if entry.placement.since else "?"
        print(
            f"early deletion of {entry.ref}: in {entry.placement.storage_class} since {since}, {entry.remaining_days:.1f} day(s) short of its"
            f" minimum storage duration: {prices.currency} {entry.charge:.4f}"
        )
    if plan.early:
        print(f"early-deletion charge {'this prune would cause' if dry_run else 'caused'}: {prices.currency} {plan.charge:.4f}", file=sys.stderr)


def storage_fields(placement_json: dict[str, Any], stored_bytes: int, prices: PriceTable | None) -> dict[str, Any]:
    """`list --json` and `show --json`'s `storage`: {"class", "since", "per_month", "currency"}; per_month null unpriced or local."""
    storage_class = placement_json["class"]
    per_month = None
    if prices is not None:
        per_month = significant(monthly_cost(stored_bytes, "STANDARD" if storage_class == LOCAL else storage_class, prices.prices))
    return {"storage": {**placement_json, "per_month": per_month, "currency": prices.currency if prices is not None else None}}


def storage_line(storage: Mapping[str, Any]) -> str:
    """`show`'s storage line from the `storage` field: the class, since when it moved, and a month of it."""
    if storage["class"] == LOCAL:
        text = "local (a directory repository has no storage classes)"
    else:
        text = storage["class"] + (f" since {storage['since']}" if storage.get("since") else "")
    if storage.get("per_month") is not None:
        text += f", {storage['currency']} {storage['per_month']:.4f} per month"
    return text
