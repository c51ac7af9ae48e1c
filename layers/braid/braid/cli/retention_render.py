"""What the retention commands print: prune's plan, the stored policies, forget's plan.

Same contract as braid.cli.render (whose print_json they use): JSON for
scripts on stdout, a line per removed or kept thing for people, and notes
meant only for the person at the terminal on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from braid.cli.render import print_json
from braid.format.timestamps import format_timestamp

if TYPE_CHECKING:  # annotations only: `braid backup` need not import prune's and forget's modules
    from braid.format.policy import KeepRules
    from braid.ops.forget import ForgetPlan
    from braid.ops.retention import PrunePlan
    from braid.ops.wal_retention import WalPrunePlan


def print_prune_plan(plan: PrunePlan, dry_run: bool, as_json: bool, wal: Sequence[WalPrunePlan] = (), storage: dict[str, Any] | None = None) -> None:
    """`storage`: braid.ops.storage_class.StoragePlan's JSON (moves, early-deletion charges), under "storage"."""
    if as_json:
        print_json({"dry_run": dry_run, **plan.to_json(), **({"wal": [w.to_json() for w in wal]} if wal else {}), **({"storage": storage} if storage else {})})
        return
    verb = "would remove" if dry_run else "removed"
    for archive in wal:
        lock = archive.describe_lock()
        if archive.error is not None:
            print(f"FAILED to remove {archive.describe()}: {archive.error}")
        elif archive.remove:
            print(f"{verb} {archive.describe()}")
        elif archive.reason or not lock:
            print(f"kept every WAL file of {archive.name} ({archive.reason or 'the kept backups need all of it'})")
        for line in lock:
            print(line)
    for ref in plan.forget:
        print(f"{verb} {ref}")
    for ref in plan.orphans:
        print(f"{verb} leftovers of incomplete backup {ref}")
    for key in plan.temporary:
        print(f"{verb} temporary file {key} of an interrupted write")
    for ref in plan.spared:
        print(f"kept leftovers of {ref}: it showed activity (or published) while the prune ran")
    for entry in plan.unreadable:
        print(f"UNREADABLE {entry.ref}: not counted, not removed ({entry.error})")
    for locked in plan.locked:
        print(f"kept {locked.ref}: under Object Lock retention until {format_timestamp(locked.until)}; a prune after that date removes it")
    for name in plan.unmanaged:
        print(f"left {name} alone: no stored policy (store one with 'braid prune --name {name} --keep-... --save-policy')")
    if dry_run:  # why each is kept: the rules that matched, as restic says
        for ref in plan.keep:
            if ref in plan.reasons:
                print(f"would keep {ref}: {'; '.join(plan.reasons[ref])}")
    print(f"kept {len(plan.keep)} backup(s)", file=sys.stderr)


def print_policies(policies: Mapping[str, KeepRules], as_json: bool, saved: str | None = None) -> None:
    """Stored retention policies, by name; `saved`: the key one was just written to."""
    if as_json:
        doc: dict[str, Any] = {"policies": {name: rules.to_json() for name, rules in sorted(policies.items())}}
        if saved is not None:
            doc["saved"] = saved
        print_json(doc)
        return
    if not policies:
        print("no stored retention policy: 'braid prune' without --keep-* rules removes no backup", file=sys.stderr)
    for name, rules in sorted(policies.items()):
        print(f"{name}: {rules.describe()}")
    if saved is not None:
        print(f"saved as {saved}", file=sys.stderr)


def print_forget(plan: ForgetPlan, dry_run: bool, as_json: bool, wal: WalPrunePlan | None = None) -> None:
    if as_json:
        print_json({"dry_run": dry_run, **plan.to_json(), **({"wal": wal.to_json()} if wal is not None else {})})
        return
    verb = "would remove" if dry_run else "removed"
    for child in plan.children:
        print(f"{verb} {child.ref} (an incremental built on {plan.ref}: manifest {child.manifest} and {len(child.objects)} data object(s))")
    print(f"{verb} {plan.ref} (manifest {plan.manifest} and {len(plan.objects)} data object(s))")
    if wal is not None:  # forget leaves the archive alone: prune removes what no backup needs
        print(f"then 'braid prune' removes {wal.describe()}" if wal.remove else f"WAL: {wal.describe()}")
