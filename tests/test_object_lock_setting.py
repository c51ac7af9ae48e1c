"""The Object Lock setting: its forms, its one date per backup, the keys it covers, where it is recorded."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from braid.adapters.local.store import LocalStore
from braid.errors import RepositoryError, UsageError
from braid.format.ids import BackupRef
from braid.format.layout import (
    CONFIG,
    chunk_key,
    lease_key,
    log_marker_key,
    manifest_key,
    policy_key,
    rekey_key,
    staging_prefix,
    summary_key,
)
from braid.format.lock import MIN_REMAINING, ObjectLock, locked_ref
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import utc_now
from conftest import run_braid

REF = BackupRef("db", "20261101T020304.567Z-1a2b3c4d")


def test_the_forms_of_the_setting_agree() -> None:
    assert ObjectLock.parse("GOVERNANCE:30") == ObjectLock.parse(" governance : 30 ") == ObjectLock("GOVERNANCE", 30)
    assert ObjectLock.from_json({"mode": "compliance", "days": 7}) == ObjectLock("COMPLIANCE", 7)
    lock = ObjectLock("COMPLIANCE", 3650)
    assert ObjectLock.parse(str(lock)) == ObjectLock.from_json(lock.to_json()) == lock


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("GOVERNANCE", "expected MODE:DAYS"),
        ("LEGAL:30", "expected GOVERNANCE or COMPLIANCE"),
        ("GOVERNANCE:0", "from 1 to 36500"),
        ("GOVERNANCE:36501", "from 1 to 36500"),
        ("GOVERNANCE:-3", "expected MODE:DAYS"),
        ("GOVERNANCE:1.5", "expected MODE:DAYS"),
    ],
)
def test_a_bad_setting_is_a_usage_error_naming_the_form(value: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ObjectLock.parse(value)


@pytest.mark.parametrize("doc", [{"mode": "GOVERNANCE"}, {"mode": "GOVERNANCE", "days": "30"}, {"mode": "GOVERNANCE", "days": True},
                                 {"mode": "GOVERNANCE", "days": 30, "years": 1}, ["GOVERNANCE", 30]])
def test_a_malformed_json_setting_is_refused(doc: object) -> None:
    with pytest.raises(UsageError):
        ObjectLock.from_json(doc)


def test_one_date_per_backup_its_start_plus_the_days_to_the_second() -> None:
    lock = ObjectLock("GOVERNANCE", 30)
    assert lock.until(REF) == datetime(2026, 12, 1, 2, 3, 4, tzinfo=UTC)
    written = REF.started + timedelta(hours=3)
    assert lock.retain_until(REF, written) == lock.until(REF)  # chunks, manifest and a later rekey: the same date
    assert lock.holds(REF, lock.until(REF) - timedelta(seconds=1)) and not lock.holds(REF, lock.until(REF))


def test_a_write_near_or_after_the_date_is_retained_a_day_from_now_as_s3_refuses_past_dates() -> None:
    lock = ObjectLock("COMPLIANCE", 1)
    late = REF.started + timedelta(days=3)
    assert lock.retain_until(REF, late) == (late + MIN_REMAINING).replace(microsecond=0)
    assert lock.retain_until(REF, late) > late


def test_only_what_a_restore_needs_is_locked() -> None:
    assert locked_ref(chunk_key(REF, 0)) == REF and locked_ref(chunk_key(REF, 12345)) == REF
    assert locked_ref(manifest_key(REF)) == REF
    assert locked_ref(f"data/{REF.name}/{REF.id}/pack-0000000001") == REF  # any stored data object of the backup
    for deletable in (
        lease_key(REF), f"{staging_prefix(REF)}session.json", f"{staging_prefix(REF)}in0/seg0", summary_key(REF), rekey_key(REF),
        log_marker_key("20261101T020304.567890Z", REF, "published"), policy_key("db"), CONFIG, "data/db/not-an-id/0000000000",
    ):
        assert locked_ref(deletable) is None, deletable


def test_the_config_records_the_lock_and_a_config_without_one_is_unchanged() -> None:
    plain = RepositoryConfig.new({"type": "kms", "key_id": "arn:k"}, utc_now())
    assert b"object_lock" not in plain.to_bytes()
    assert RepositoryConfig.from_bytes(plain.to_bytes(), "x").object_lock is None
    locked = RepositoryConfig.new({"type": "kms", "key_id": "arn:k"}, utc_now(), object_lock=ObjectLock("GOVERNANCE", 30))
    assert json.loads(locked.to_bytes())["object_lock"] == {"mode": "GOVERNANCE", "days": 30}
    assert RepositoryConfig.from_bytes(locked.to_bytes(), "x") == locked


def test_a_config_with_a_bad_lock_is_an_unreadable_repository() -> None:
    doc = json.loads(RepositoryConfig.new({"type": "kms", "key_id": "arn:k"}, utc_now()).to_bytes())
    doc["object_lock"] = {"mode": "FOREVER", "days": 30}
    with pytest.raises(RepositoryError, match="not a valid Braid repository config: object lock mode 'FOREVER'"):
        RepositoryConfig.from_bytes(json.dumps(doc).encode(), "s3://b/config.json")


def test_a_directory_repository_that_asks_for_a_lock_is_refused_when_opened(tmp_path: Path) -> None:
    """A directory cannot keep anything immutable: saying so beats a retention nobody enforces."""
    store = LocalStore(tmp_path)
    config = RepositoryConfig.new({"type": "local", "key_id": "local:x"}, utc_now(), object_lock=ObjectLock("GOVERNANCE", 30))
    store.put(CONFIG, config.to_bytes())
    with pytest.raises(RepositoryError, match=r"asks for Object Lock retention \(GOVERNANCE:30\), which only an s3:// repository can give"):
        Repository.open(store)


def test_init_takes_object_lock_only_for_an_s3_repository_without_a_stack(tmp_path: Path) -> None:
    result = run_braid("init", "--repo", str(tmp_path / "repo"), "--object-lock", "GOVERNANCE:30")
    assert result.code == 2
    assert "--object-lock is for 'braid init --repo s3://... --engine local'" in result.stderr
    assert not (tmp_path / "repo").exists()
