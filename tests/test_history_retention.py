"""braid.ops.wal_history_lock without S3: when nothing is asked, and a locked store that cannot lengthen a date.

The S3 side (the dates, the requests, the CLI's exit 7) is tests/cloud/test_wal_history_lock.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from braid.adapters.local.store import LocalStore
from braid.format.ids import BackupRef
from braid.format.lock import ObjectLock
from braid.format.pg_backup import WalInfo
from braid.ops.wal_history_lock import ABSENT, EXTENDED, HELD, HistoryRetentionError, retain_history
from braid.ports.store import Retained, RetainingStore, RetentionExtending

LOCK = ObjectLock("COMPLIANCE", 7)
NOW = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
REF = BackupRef.new("pg", now=NOW)


class LockedOnly(LocalStore):
    """A store with a lock that cannot lengthen a date (RetainingStore without RetentionExtending)."""

    object_lock: ObjectLock | None = LOCK

    def use_object_lock(self, lock: ObjectLock) -> None:
        self.object_lock = lock


class Extending(LockedOnly):
    """Records each request and answers as a store whose history file carries `held` (None: no such file)."""

    def __init__(self, root: Path, held: datetime | None, present: bool = True) -> None:
        super().__init__(root)
        self.held, self.present = held, present
        self.asked: list[tuple[str, datetime]] = []

    def extend_retention(self, key: str, until: datetime) -> Retained | None:
        self.asked.append((key, until))
        if not self.present:
            return None
        if self.held is not None and self.held >= until:
            return Retained(key, self.held, self.held)
        return Retained(key, self.held, until)


def test_nothing_is_asked_without_a_lock_on_timeline_1_or_without_a_timeline(tmp_path: Path) -> None:
    store = Extending(tmp_path, None)
    assert isinstance(store, RetainingStore) and isinstance(store, RetentionExtending)
    for wal in (None, WalInfo({}), WalInfo({"timeline": 1}), WalInfo({"timeline": "2"})):
        assert retain_history(store, REF, wal, NOW) is None
    assert retain_history(LocalStore(tmp_path), REF, WalInfo({"timeline": 2}), NOW) is None  # no lock: a directory store
    store.object_lock = None
    assert retain_history(store, REF, WalInfo({"timeline": 2}), NOW) is None
    assert store.asked == []


def test_the_history_file_of_the_backups_own_timeline_is_asked_for_the_backups_date(tmp_path: Path) -> None:
    store = Extending(tmp_path, NOW + timedelta(days=1))
    assert retain_history(store, REF, WalInfo({"timeline": 0x1A}), NOW) == EXTENDED
    assert store.asked == [("wal/pg/history/0000001A.history", LOCK.until(REF))]
    assert retain_history(Extending(tmp_path, NOW + timedelta(days=30)), REF, WalInfo({"timeline": 2}), NOW) == HELD
    assert retain_history(Extending(tmp_path, None, present=False), REF, WalInfo({"timeline": 2}), NOW) == ABSENT


def test_a_locked_store_that_cannot_lengthen_a_date_fails_the_backup_saying_so(tmp_path: Path) -> None:
    store = LockedOnly(tmp_path)
    assert isinstance(store, RetainingStore) and not isinstance(store, RetentionExtending)
    with pytest.raises(HistoryRetentionError) as raised:
        retain_history(store, REF, WalInfo({"timeline": 2}), NOW)
    assert raised.value.exit_code == 7
    assert str(raised.value) == (
        f"{store.url} cannot lengthen an Object Lock retention date, so wal/pg/history/00000002.history (timeline 2's history,"
        f" which a recovery of {REF} follows) until 2026-12-06T04:00:00.000000Z cannot be kept; nothing was published"
    )
