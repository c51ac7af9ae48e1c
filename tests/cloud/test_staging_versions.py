"""Staging leaves no bytes behind in a versioned bucket: the planner's early removal deletes by version id (moto S3)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC

import pytest
from moto import mock_aws

from braid.adapters.aws.clients import s3_client
from braid.adapters.aws.lambda_env import S3StagingJanitor
from braid.adapters.aws.retries import RetrySettings
from braid.adapters.aws.s3 import S3Store
from braid.format.ids import BackupRef
from braid.format.layout import staging_prefix
from braid.format.staging import StagingArea, segment_key

BUCKET = "braid-versioned-staging"


@pytest.fixture
def store(aws_env: None) -> Iterator[S3Store]:
    with mock_aws():
        client = s3_client(region="us-east-1", retries=RetrySettings("standard", 2))
        client.create_bucket(Bucket=BUCKET)
        client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        yield S3Store(client, BUCKET, "repo")


def versions_under(store: S3Store, prefix: str) -> list[str]:
    """Every version and delete marker under `prefix`, by key."""
    found = store.client.list_object_versions(Bucket=BUCKET, Prefix=store.object_key(prefix))
    return sorted(v["Key"].removeprefix("repo/") for v in found.get("Versions", []) + found.get("DeleteMarkers", []))


def test_purged_segments_leave_no_version_or_marker_and_only_exactly_them_go(store: S3Store) -> None:
    ref = BackupRef.new("db")
    area = StagingArea(store, ref)
    done, sibling = segment_key(ref, 0, 1), segment_key(ref, 0, 1) + "0"  # seg00001 and seg000010 (100,000+ segments)
    for key in (done, done, sibling):  # the finished segment twice: a retried upload left a noncurrent version
        store.put(key, b"raw database bytes")
    janitor = S3StagingJanitor(store)

    area.remove_segments([done], purge=lambda key: janitor.purge_versions(key, exact=True))

    assert versions_under(store, staging_prefix(ref)) == [sibling]


def test_a_plain_delete_would_keep_the_raw_bytes_as_a_noncurrent_version(store: S3Store) -> None:
    """Why the planner purges: on a versioned bucket a delete only adds a marker (what review 3's H1 found)."""
    ref = BackupRef.new("db")
    area = StagingArea(store, ref)
    store.put(segment_key(ref, 0, 0), b"raw database bytes")

    area.remove_segments([segment_key(ref, 0, 0)])

    assert versions_under(store, staging_prefix(ref)) == [segment_key(ref, 0, 0)] * 2  # the bytes and a delete marker


def _staged_leftover(store: S3Store) -> BackupRef:
    """A backup staged long ago whose agent and pipeline died: two versions of a segment, an open upload, no manifest."""
    ref = BackupRef("db", "20200101T000000.000Z-0badc0de")
    for _ in range(2):
        store.put(segment_key(ref, 0, 0), b"raw database bytes")
    store.client.create_multipart_upload(Bucket=BUCKET, Key=store.object_key(segment_key(ref, 0, 1)))
    return ref


def test_the_prune_sweep_removes_a_leftovers_staging_versions_and_uploads(store: S3Store) -> None:
    from datetime import datetime, timedelta

    from braid.pipeline.prune_plan import LEFTOVER, SweepItem
    from braid.pipeline.sweep import COLLECTED, sweep_item

    ref = _staged_leftover(store)
    item = SweepItem(0, LEFTOVER, str(ref), "", "")
    now = datetime.now(UTC) + timedelta(days=2)  # judged well after its last activity

    result = sweep_item(store, S3StagingJanitor(store), item, run="r1", now=now, grace=timedelta(hours=1))

    assert result.outcome == COLLECTED
    assert versions_under(store, staging_prefix(ref)) == []
    assert store.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_the_last_slice_of_a_pruned_backup_removes_its_staging_versions_too(store: S3Store) -> None:
    from datetime import datetime, timedelta

    from braid.pipeline.prune_plan import BACKUP, SweepItem
    from braid.pipeline.sweep import DELETED, sweep_item

    ref = _staged_leftover(store)
    result = sweep_item(store, S3StagingJanitor(store), SweepItem(0, BACKUP, str(ref), "", ""), run="r1", now=datetime.now(UTC), grace=timedelta(hours=1))

    assert result.outcome == DELETED
    assert versions_under(store, staging_prefix(ref)) == []
    assert store.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_a_backups_budget_registrations_leave_no_version_whether_its_planner_released_them_or_its_staging_went(store: S3Store) -> None:
    from braid.format.staging.keys import running_prefix
    from braid.pipeline.account_budget import REFRESH_SECONDS, release, share

    janitor = S3StagingJanitor(store)
    purge = lambda key: janitor.purge_versions(key, exact=True)  # noqa: E731 - as functions/plan/app.py passes it
    done, failed = BackupRef.new("db"), BackupRef.new("other")
    for now in (1_800_000_000.0, 1_800_000_000.0 + REFRESH_SECONDS):  # renewed once: the old registration goes by version id
        share(store, done, budget=500, requested=500, now=now, purge=purge)
        share(store, failed, budget=500, requested=500, now=now, purge=purge)
    assert len(versions_under(store, running_prefix(done))) == 1
    release(store, done, purge)
    store.put(segment_key(failed, 0, 0), b"raw database bytes")
    StagingArea(store, failed).remove(janitor)  # Finalize's, Cleanup's or the sweep's removal of a backup that never ended "done"
    assert versions_under(store, running_prefix()) == []
