"""Storage classes for old backups: the policy, the minimum-duration arithmetic, moto's S3, and a directory repository's refusal.

The early-deletion charge is computed here independently (GB x monthly
price x days short of the minimum / 30, the S3 pricing page's pro rata) and
checked at the boundaries: STANDARD_IA at 29/30/31 days, GLACIER_IR at
89/90 days. The S3 adapter's class change runs against moto: the class is
what head_object says, the bytes are the same, and under Object Lock the
new version keeps the original's retention while the old version stays.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from moto import mock_aws

from braid.adapters.aws.clients import s3_client
from braid.adapters.aws.s3 import S3Store
from braid.adapters.local.store import LocalStore
from braid.errors import IntegrityError, NotFoundError, UsageError
from braid.format.ids import BackupRef
from braid.format.layout import chunk_key, manifest_key, storage_record_key
from braid.format.lock import ObjectLock
from braid.format.policy import KeepRules, parse_policy, parse_storage, policy_bytes
from braid.format.prices import DEFAULT
from braid.format.storage_class import (
    GLACIER_IR,
    STANDARD,
    STANDARD_IA,
    Placement,
    StorageClassError,
    StoragePolicy,
    early_deletion_charge,
    remaining_days,
)
from braid.format.summary import catalog_stamp
from braid.ops.storage_class import early_deletions, move_objects, placement_of, placements, plan_moves, record_move
from braid.ports.store import StorageClasses
from conftest import run_braid

GB = 2**30
MOVED = datetime(2026, 1, 1, tzinfo=UTC)
IA_PRICE = 0.0125  # us-east-1 list price per GB-month, Standard-IA (docs/design/2026-11-28-storage-classes.md)
GIR_PRICE = 0.004  # Glacier Instant Retrieval


def expected_charge(gb: float, monthly: float, minimum: int, age_days: float) -> float:
    """The reference: the storage of the days still short of the minimum, at 1/30 of a month per day."""
    return gb * monthly * max(0.0, minimum - age_days) / 30


# --- the arithmetic -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("storage_class", "price", "minimum", "age", "short"),
    [
        (STANDARD_IA, IA_PRICE, 30, 29, 1),
        (STANDARD_IA, IA_PRICE, 30, 30, 0),
        (STANDARD_IA, IA_PRICE, 30, 31, 0),
        (GLACIER_IR, GIR_PRICE, 90, 89, 1),
        (GLACIER_IR, GIR_PRICE, 90, 90, 0),
        (GLACIER_IR, GIR_PRICE, 90, 29, 61),
    ],
)
def test_early_deletion_charge_at_the_minimum_duration_boundaries(storage_class: str, price: float, minimum: int, age: int, short: int) -> None:
    now = MOVED + timedelta(days=age)
    placement = Placement(storage_class, MOVED)
    assert remaining_days(storage_class, MOVED, now) == short
    charge = early_deletion_charge(100 * GB, placement, now, DEFAULT.prices)
    assert charge == pytest.approx(expected_charge(100, price, minimum, age))
    assert (charge > 0) == (short > 0)
    if short == 1:  # one day of 100 GB: 100 x price / 30
        assert charge == pytest.approx(100 * price / 30)


def test_a_fraction_of_a_day_short_is_charged_pro_rata_and_standard_never() -> None:
    now = MOVED + timedelta(days=29, hours=12)
    assert remaining_days(STANDARD_IA, MOVED, now) == pytest.approx(0.5)
    assert early_deletion_charge(30 * GB, Placement(STANDARD_IA, MOVED), now, DEFAULT.prices) == pytest.approx(30 * IA_PRICE * 0.5 / 30)
    assert early_deletion_charge(30 * GB, Placement(STANDARD), MOVED, DEFAULT.prices) == 0


def test_early_deletions_lists_only_removed_backups_short_of_their_minimum() -> None:
    young = BackupRef.parse("pg@20260101T000000.000Z-00000001")
    served = BackupRef.parse("pg@20251001T000000.000Z-00000002")
    standard = BackupRef.parse("pg@20251201T000000.000Z-00000003")
    known = {young: Placement(GLACIER_IR, MOVED), served: Placement(STANDARD_IA, MOVED - timedelta(days=40))}
    now = MOVED + timedelta(days=10)
    found = early_deletions([young, served, standard], {young: 2 * GB, served: GB, standard: GB}, known, now, DEFAULT)
    assert [entry.ref for entry in found] == [young]
    assert found[0].charge == pytest.approx(expected_charge(2, GIR_PRICE, 90, 10))
    doc = found[0].to_json()
    assert doc["storage_class"] == GLACIER_IR and doc["remaining_days"] == 80 and doc["currency"] == "USD"


def test_moves_plan_the_kept_backups_that_are_due_and_not_moved_yet() -> None:
    now = datetime(2026, 3, 1, tzinfo=UTC)
    old = BackupRef.parse("pg@20260101T000000.000Z-00000001")
    due = BackupRef.parse("pg@20260130T000000.000Z-00000002")
    young = BackupRef.parse("pg@20260220T000000.000Z-00000003")
    other = BackupRef.parse("db@20260101T000000.000Z-00000004")
    known = {old: Placement(STANDARD_IA, MOVED)}
    moves = plan_moves([young, due, old, other], {"pg": StoragePolicy(STANDARD_IA, 30)}, None, known, now)
    assert [(m.ref, m.storage_class) for m in moves] == [(due, STANDARD_IA)]
    # The stack's default applies to names with no policy of their own.
    moves = plan_moves([other, young], {"pg": StoragePolicy(STANDARD_IA, 30)}, StoragePolicy(GLACIER_IR, 7), known, now)
    assert [(m.ref, m.storage_class) for m in moves] == [(other, GLACIER_IR)]


# --- the policy -------------------------------------------------------------------------


def test_storage_policy_parses_class_and_days_and_refuses_the_rest() -> None:
    assert StoragePolicy.parse("glacier_ir:30") == StoragePolicy(GLACIER_IR, 30)
    assert str(StoragePolicy.parse("STANDARD_IA:0")) == "STANDARD_IA:0"
    for bad, message in [
        ("STANDARD_IA", "CLASS:DAYS"),
        ("GLACIER:30", "one of STANDARD_IA, GLACIER_IR"),
        ("STANDARD:30", "one of STANDARD_IA, GLACIER_IR"),
        ("DEEP_ARCHIVE:30", "restorable without a restore request"),
        ("STANDARD_IA:-1", "CLASS:DAYS"),
        ("STANDARD_IA:99999", "from 0 to 36500"),
    ]:
        with pytest.raises(UsageError, match=message):
            StoragePolicy.parse(bad)


def test_a_stored_policy_keeps_its_rules_and_may_carry_a_storage_class() -> None:
    rules = KeepRules(keep_daily=30, keep_monthly=12)
    plain = policy_bytes("pg", rules)
    assert parse_policy(plain, "pg", "x") == rules and parse_storage(plain, "pg", "x") is None
    assert "storage" not in json.loads(plain)  # policies without one are written as before
    moved = policy_bytes("pg", rules, StoragePolicy(GLACIER_IR, 30))
    assert json.loads(moved)["storage"] == {"class": "GLACIER_IR", "after_days": 30}
    assert parse_policy(moved, "pg", "x") == rules and parse_storage(moved, "pg", "x") == StoragePolicy(GLACIER_IR, 30)
    doc = json.loads(moved)
    for bad in [{"class": "GLACIER", "after_days": 30}, {"class": "GLACIER_IR"}, {"class": "GLACIER_IR", "after_days": "30"}, "GLACIER_IR:30"]:
        raw = json.dumps({**doc, "storage": bad}).encode()
        with pytest.raises(IntegrityError, match="stored retention policy x is not valid.*nothing was pruned"):
            parse_storage(raw, "pg", "x")
        with pytest.raises(IntegrityError):
            parse_policy(raw, "pg", "x")


# --- S3 (moto) ------------------------------------------------------------------------

BUCKET = "braid-classes"
REF = BackupRef.parse("pg@20260101T000000.000Z-0000abcd")


@pytest.fixture
def s3(aws_env: None) -> Iterator[S3Store]:
    with mock_aws():
        client = s3_client(region="us-east-1")
        client.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
        yield S3Store(client, BUCKET, "repo")


def head_class(store: S3Store, key: str) -> str:
    return str(store.client.head_object(Bucket=BUCKET, Key=store.object_key(key)).get("StorageClass", STANDARD))


def test_s3_moves_an_object_in_place_and_head_object_shows_its_class(s3: S3Store) -> None:
    assert isinstance(s3, StorageClasses)
    key = chunk_key(REF, 0)
    s3.put(key, b"chunk bytes" * 100, create_only=True)
    before = s3.head(key)
    assert before is not None and before.storage_class == STANDARD and head_class(s3, key) == STANDARD
    s3.set_storage_class(key, STANDARD_IA)
    assert head_class(s3, key) == STANDARD_IA
    after = s3.head(key)
    assert after is not None and after.storage_class == STANDARD_IA and after.checksum == before.checksum
    assert s3.get(key) == b"chunk bytes" * 100
    assert [info.storage_class for info in s3.list("data/")] == [STANDARD_IA]
    s3.set_storage_class(key, GLACIER_IR)
    assert head_class(s3, key) == GLACIER_IR


def test_s3_moving_a_missing_object_is_not_found(s3: S3Store) -> None:
    with pytest.raises(NotFoundError, match="not found"):
        s3.set_storage_class(chunk_key(REF, 9), STANDARD_IA)


def test_move_objects_moves_the_data_prefix_only_and_skips_what_is_there(s3: S3Store) -> None:
    for index in range(3):
        s3.put(chunk_key(REF, index), bytes([index]) * 10)
    s3.put(manifest_key(REF), b"{}")
    assert move_objects(s3, REF, GLACIER_IR, until=chunk_key(REF, 1)) == 2  # a slice: (start, chunk 1]
    assert move_objects(s3, REF, GLACIER_IR) == 1  # the rest; what moved already is skipped
    assert move_objects(s3, REF, GLACIER_IR) == 0
    assert [head_class(s3, chunk_key(REF, i)) for i in range(3)] == [GLACIER_IR] * 3
    assert head_class(s3, manifest_key(REF)) == STANDARD  # manifests never move
    record_move(s3, REF, GLACIER_IR, MOVED)
    assert s3.head(storage_record_key(REF, catalog_stamp(MOVED), GLACIER_IR)) is not None
    assert placements(s3) == {REF: Placement(GLACIER_IR, MOVED)}
    assert placement_of(s3, REF, placements(s3, REF)) == Placement(GLACIER_IR, MOVED)


def test_under_object_lock_the_moved_version_keeps_the_retention_and_the_old_version_stays(s3: S3Store) -> None:
    lock = ObjectLock("GOVERNANCE", 10)
    s3.use_object_lock(lock)
    key = chunk_key(REF, 0)
    earliest = lock.retain_until(REF).replace(microsecond=0)  # the date the write carries lies between these two
    s3.put(key, b"locked chunk", create_only=True)
    latest = lock.retain_until(REF).replace(microsecond=0)
    while lock.retain_until(REF).replace(microsecond=0) == latest:  # a move in a later second than the write
        time.sleep(0.05)
    s3.set_storage_class(key, STANDARD_IA)
    full = s3.object_key(key)
    versions = s3.client.list_object_versions(Bucket=BUCKET, Prefix=full)["Versions"]
    assert len(versions) == 2  # the copy is a new version; the original stays (billed in Standard) until its date
    by_latest = {v["IsLatest"]: v for v in versions}
    assert by_latest[True]["StorageClass"] == STANDARD_IA and by_latest[False]["StorageClass"] == STANDARD
    dates = []
    for version in versions:
        head = s3.client.head_object(Bucket=BUCKET, Key=full, VersionId=version["VersionId"])
        assert head.get("ObjectLockMode") == "GOVERNANCE", version
        dates.append(head["ObjectLockRetainUntilDate"].replace(microsecond=0))
    assert dates[0] == dates[1]  # the moved version keeps the original's date, not one computed when it moved
    assert earliest <= dates[0] <= latest, (earliest, dates, latest)


# --- a directory repository -----------------------------------------------------------


def test_a_directory_store_has_no_storage_classes(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    assert not isinstance(store, StorageClasses)
    assert placement_of(store, REF, {}).storage_class == "local"
    with pytest.raises(StorageClassError, match="directory repository, which has no storage classes") as caught:
        move_objects(store, REF, STANDARD_IA)
    assert caught.value.exit_code == 2


def test_cli_refuses_a_storage_class_for_a_directory_repository(repo: Path) -> None:
    saved = run_braid("prune", "--repo", str(repo), "--name", "pg", "--keep-daily", "7", "--storage-class", "GLACIER_IR:30", "--save-policy")
    assert saved.code == 2
    assert saved.stderr.strip() == (
        f"braid: error: --storage-class GLACIER_IR:30: {repo} is a directory repository, which has no storage classes (S3 only);"
        " its chunks stay where they are: leave the storage class out for it"
    )
    assert "storage" not in json.loads(run_braid("prune", "--repo", str(repo), "--show-policy", "--json").out)  # nothing was saved
    alone = run_braid("prune", "--repo", str(repo), "--name", "pg", "--keep-daily", "7", "--storage-class", "GLACIER_IR:30")
    assert alone.code == 2 and "--storage-class is part of a stored policy" in alone.stderr and "--save-policy" in alone.stderr
    bad = run_braid("prune", "--repo", str(repo), "--name", "pg", "--keep-daily", "7", "--storage-class", "GLACIER:30", "--save-policy")
    assert bad.code == 2 and "storage class must be one of STANDARD_IA, GLACIER_IR" in bad.stderr
    form = run_braid("prune", "--repo", str(repo), "--name", "pg", "--keep-daily", "7", "--storage-class", "30", "--save-policy")
    assert form.code == 2 and "CLASS:DAYS" in form.stderr


def test_list_and_show_say_local_and_price_storage_only_with_a_stored_table(repo: Path) -> None:
    assert run_braid("backup", "--repo", str(repo), "--name", "pg", stdin=b"x" * 5000).code == 0
    (row,) = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert row["storage"] == {"class": "local", "since": None, "per_month": None, "currency": None}
    shown = run_braid("show", "--repo", str(repo), "pg@latest")
    assert "storage     local (a directory repository has no storage classes)" in shown.out
    assert json.loads(run_braid("show", "--repo", str(repo), "pg@latest", "--json").out)["storage"]["class"] == "local"
    assert run_braid("--repo", str(repo), "prices", "set", "s3_storage_gb_month=1").code == 0
    (row,) = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert row["storage"]["per_month"] == pytest.approx(row["stored_bytes"] / GB) and row["storage"]["currency"] == "USD"


def test_a_stored_policy_with_a_malformed_storage_class_stops_the_prune(repo: Path) -> None:
    assert run_braid("backup", "--repo", str(repo), "--name", "pg", stdin=b"x" * 5000).code == 0
    bad = {"version": 1, "name": "pg", "rules": {"keep_last": 1}, "storage": {"class": "GLACIER", "after_days": 30}}
    (repo / "policies").mkdir(exist_ok=True)
    (repo / "policies" / "pg.json").write_text(json.dumps(bad))
    pruned = run_braid("prune", "--repo", str(repo))
    assert pruned.code == 6
    assert pruned.stderr.startswith(f"braid: error: stored retention policy {repo}/policies/pg.json is not valid (storage class must be one of")
    assert "nothing was pruned" in pruned.stderr


def test_an_s3_refusal_of_the_copy_names_the_permissions(s3: S3Store) -> None:
    from botocore.stub import Stubber

    from braid.errors import StorageError

    key = chunk_key(REF, 0)
    with Stubber(s3.client) as stub:
        stub.add_client_error("copy_object", service_error_code="AccessDenied", service_message="Access Denied", http_status_code=403)
        with pytest.raises(StorageError) as caught:
            s3.set_storage_class(key, GLACIER_IR)
    assert caught.value.exit_code == 7
    assert "moving to GLACIER_IR" in caught.value.message and "s3:GetObject and s3:PutObject" in caught.value.message, caught.value.message
