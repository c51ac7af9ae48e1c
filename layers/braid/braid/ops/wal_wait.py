"""Publish a base backup taken without its WAL (`pg_basebackup -X none`) only once that WAL is archived.

Such a backup restores only with the archive's segments from its start LSN
to its stop LSN. Before its manifest is written, `wait_for_wal_range`
asks the archive (braid.ops.wal.wal_range_present) for the missing
segments, polling until none are missing or `timeout` seconds passed; then
it fails with WalRangeMissingError (exit 11, like a failed producer: the
backup is not published, its chunks are removed) naming the first missing
segments. A backup that carries its WAL (-X fetch: segments under pg_wal/
in its tar) or that is not a PostgreSQL base backup passes at once.
With the stack (`include_staged`), a segment still in `wal-staging/NAME/`
counts, alone or in a bundle: it is durable there, and the WAL worker archives it within seconds
(braid.ops.wal_stage); the agent checks before it writes the stream-end
record, so a backup refused here is abandoned and nothing is published.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from braid.engine.capture import Captured
from braid.errors import ProducerError
from braid.format.layout import wal_staged_bundle, wal_staging_prefix
from braid.ops.wal import wal_range_present
from braid.ports.store import ObjectStore

__all__ = ["DEFAULT_WAL_WAIT", "WalRangeMissingError", "wait_for_wal_range", "wal_gate"]

DEFAULT_WAL_WAIT = 60.0
POLL = 0.5


class WalRangeMissingError(ProducerError):
    """A -X none base backup whose WAL range is not (yet) in the archive: nothing was published."""


def staged_names(store: ObjectStore, name: str) -> set[str]:
    """The WAL files staged for `name`: one LIST (key names), and each staged bundle's members (a ranged GET of its head)."""
    from braid.ops.wal_bundled import staged_bundle_members

    prefix = wal_staging_prefix(name)
    names: set[str] = set()
    for info in store.list(prefix):
        if wal_staged_bundle(info.key) is not None:
            names.update(staged_bundle_members(store, info.key))
        else:
            names.add(info.key[len(prefix) :])
    return names


def wait_for_wal_range(
    store: ObjectStore,
    name: str,
    captured: Captured,
    timeout: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    include_staged: bool = False,
) -> None:
    """Return once the WAL range of the base backup in `captured` is archived under `name`; WalRangeMissingError after `timeout`."""
    wal = captured.wal
    if wal is None or captured.wal_segments or wal.start_lsn is None or wal.timeline is None:
        return
    stop = wal.stop_lsn if wal.stop_lsn is not None else wal.start_lsn + 1
    deadline = clock() + timeout
    while True:
        missing = wal_range_present(store, name, wal.timeline, wal.start_lsn, stop)
        if missing and include_staged:
            staged = staged_names(store, name)
            missing = [segment for segment in missing if segment not in staged]
        if not missing or clock() >= deadline:
            break
        sleep(POLL)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise WalRangeMissingError(
            f"the base backup carries no WAL (pg_basebackup -X none) and its WAL range {wal.fields.get('start_lsn')}..{wal.fields.get('stop_lsn', '?')}"
            f" (timeline {wal.timeline}) is not archived under {name!r} after {timeout:g} s: missing {shown}; nothing was published."
            f" Archive with archive_command = 'braid wal-push --name {name} %p', or back up with -X fetch"
        )


def wal_gate(store: ObjectStore, name: str, timeout: float, *, include_staged: bool = False) -> Callable[[Captured], None]:
    """The BackupRequest.wal_gate of a backup of `name` (`include_staged`: with the stack, staged WAL counts)."""
    return lambda captured: wait_for_wal_range(store, name, captured, timeout, include_staged=include_staged)
