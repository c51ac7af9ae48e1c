"""How prune, `list` and `show` print storage classes (braid.ops.storage_class): moves, early-deletion charges, a backup's class."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from braid.format.prices import PriceTable, significant
from braid.format.storage_class import LOCAL, StoragePolicy, monthly_cost
from braid.format.timestamps import format_timestamp

if TYPE_CHECKING:  # `show` and `list` print through this module: they load no ops for it
    from braid.ops.storage_class import StoragePlan


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
