"""Concurrent backups share the account's worker concurrency: each map runs at most its backup's share of one budget.

The budget (braid.adapters.aws.lambda_env.worker_concurrency) is what every
backup of the stack may run at once, together. A planner planning a round
registers its backup (staging/_running/NAME/ID/STAMP, renewed every
REFRESH_SECONDS), counts the backups registered in the last
REGISTRATION_SECONDS (one LIST) and runs the map at budget // running, at
most its --fan-out (docs/design/2026-11-28-account-budget-and-precompression.md).
A planner that is done removes its registrations; a failed one's expire,
and the next planner (or its staging's removal) deletes them.
"""

from __future__ import annotations

from collections.abc import Callable

from braid.format.ids import BackupRef
from braid.format.staging.keys import parse_running_key, running_key, running_prefix
from braid.ports.store import ObjectStore

# A backup counts for this long after its planner last registered: a round's map and the planner's next call fit in
# it (the Plan function's 15 minutes, contract.PLAN_TIMEOUT_SECONDS). A backup planning no round meanwhile (a slow
# stream) needs no workers; it registers again with its next round.
REGISTRATION_SECONDS = 900
REFRESH_SECONDS = 60  # a registration is renewed at most this often (a PUT; the old one is deleted)


def share(
    store: ObjectStore, ref: BackupRef, *, budget: int, requested: int, now: float, purge: Callable[[str], object] | None = None,
) -> int:
    """Register `ref` as running at `now` (epoch seconds) and return its map's concurrency: `budget` over the backups
    running, at most `requested`, at least 1. `purge(key)`: removes every version of one object (default: a delete)."""
    mine: list[tuple[int, str]] = []
    others: set[str] = set()
    expired: list[str] = []
    for info in store.list(running_prefix()):
        parsed = parse_running_key(info.key)
        if parsed is None:
            continue
        owner, stamp = parsed
        if owner == str(ref):
            mine.append((stamp, info.key))
        elif now - stamp < REGISTRATION_SECONDS:
            others.add(owner)
        else:
            expired.append(info.key)
    latest = max((stamp for stamp, _ in mine), default=None)
    if latest is None or now - latest >= REFRESH_SECONDS:
        store.put(running_key(ref, int(now)), b"{}")
        expired += [key for stamp, key in mine if stamp != int(now)]
    _remove(store, expired, purge)
    return max(1, min(requested, budget // (len(others) + 1)))


def release(store: ObjectStore, ref: BackupRef, purge: Callable[[str], object] | None = None) -> None:
    """The backup's planner is done: it no longer counts against the budget."""
    _remove(store, [info.key for info in store.list(running_prefix(ref))], purge)


def _remove(store: ObjectStore, keys: list[str], purge: Callable[[str], object] | None) -> None:
    if purge is None:
        store.delete(keys)
        return
    for key in keys:
        purge(key)
