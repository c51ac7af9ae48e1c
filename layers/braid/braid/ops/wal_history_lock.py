"""Under Object Lock, a backup's timeline history file stays at least as long as the backup (docs/design/wal-archive.md).

Archived WAL is locked for the days from its write (braid.format.lock), which
outlasts every backup that needs it but one kind of file: `TTTTTTTT.history`
is written at its timeline's switch, before the backups on that timeline
start. Without it, PostgreSQL recovers such a backup's timeline as having no
parents and a later PITR may pick a timeline id the archive already held.
So, before a backup on a timeline after the first is published (both
finalizers: braid.engine.finalize), `retain_history` lengthens that file's
date to the backup's own (`history_until`) through the store's
RetentionExtending port: one HEAD, and one PutObjectRetention only when the
date must grow. The file of the backup's own timeline is the one to keep:
it names every ancestor timeline.

It returns what it did, which the manifest records in `stats` as
`wal_history_lock`: "extended", "held" (the date was late enough already)
or "absent" (no such file archived under the backup's name, the archive's
name being the backup's: no archive, or the file still staged, which the
WAL worker then writes with a later date anyway). Nothing is asked without
a lock, for a backup without a timeline, or on timeline 1. A store that
cannot lengthen a date, or refuses to, fails the backup before publication
(HistoryRetentionError, exit 7): a published backup whose history may go
before it is the gap this closes.
"""

from __future__ import annotations

from datetime import datetime

from braid.errors import BackupError, StorageError
from braid.format.ids import BackupRef
from braid.format.layout import wal_key
from braid.format.lock import history_until
from braid.format.pg_backup import WalInfo
from braid.format.timestamps import format_timestamp
from braid.format.wal import WalFile
from braid.ports.store import ObjectStore, RetainingStore, RetentionExtending

__all__ = ["ABSENT", "EXTENDED", "HELD", "STAT", "HistoryRetentionError", "retain_history"]

STAT = "wal_history_lock"  # the manifest's stats key
EXTENDED, HELD, ABSENT = "extended", "held", "absent"


class HistoryRetentionError(StorageError):
    """The history file a backup's timeline needs could not be kept as long as the backup: nothing was published."""


def retain_history(store: ObjectStore, ref: BackupRef, wal: WalInfo | None, now: datetime | None = None) -> str | None:
    """Keep the archived history file of `ref`'s timeline (`wal.timeline` > 1) until at least `ref`'s retention date
    under the store's Object Lock; EXTENDED, HELD or ABSENT, None when nothing applies (no lock, timeline 1 or unknown)."""
    lock = store.object_lock if isinstance(store, RetainingStore) else None
    timeline = wal.timeline if wal is not None else None
    if lock is None or timeline is None or timeline <= 1:
        return None
    key = wal_key(ref.name, WalFile.parse(f"{timeline:08X}.history"))
    until = history_until(lock, ref, now)
    what = f"{key} (timeline {timeline}'s history, which a recovery of {ref} follows) until {format_timestamp(until)}"
    if not isinstance(store, RetentionExtending):
        raise HistoryRetentionError(f"{store.url} cannot lengthen an Object Lock retention date, so {what} cannot be kept; nothing was published")
    try:
        retained = store.extend_retention(key, until)
    except BackupError as exc:
        raise HistoryRetentionError(f"could not keep {what}: {exc}; nothing was published") from exc
    if retained is None:
        return ABSENT
    return EXTENDED if retained.extended else HELD
