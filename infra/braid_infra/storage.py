"""Storage: the repository bucket.

Encryption at rest is SSE-KMS with the AWS-managed S3 key (plus a bucket
key): S3 encrypts every object without any principal needing KMS
permissions, so the host agent stays KMS-free. The customer-managed key
(keys.py) is reserved for Braid's own envelope encryption of chunks, which
is what decides who can read a backup.

Staging holds raw, unencrypted database bytes for the life of a backup, so
its leftovers are short-lived, but never shorter than a live backup: staging
objects expire, and incomplete multipart uploads are aborted, after
STAGING_LIFETIME (8 days, longer than the state machine's 7-day
EXECUTION_TIMEOUT, so a long backup never loses session.json or its key).
The bucket is versioned, so deletes keep old versions: noncurrent staging
versions expire after 1 day, and so do noncurrent chunks under data/ (what
prune and Cleanup delete stops being billed a day later, not 30); delete
markers left with no version behind them are removed. Other noncurrent
versions (manifests, config) are kept 30 days.

Chunks are written once: the bucket policy denies, to every principal, a
PutObject or CompleteMultipartUpload under data/ that does not carry
`If-None-Match: *` (S3 "Enforce conditional writes": condition key
`s3:if-none-match` absent, and `s3:ObjectCreationOperation` true so that
CreateMultipartUpload and UploadPart, which take no conditional header,
are not caught). Manifests are created the same way, and may be replaced
only with `If-Match: ETAG` of the version the writer read (`braid rekey`
re-wraps a backup's data key so): no role, compromised host or late worker
can replace a stored chunk, nor a manifest it has not read as it stands. Deletes are not touched by it: retention (the
scheduled Verify), Cleanup and Finalize's withdrawal still delete, within
their roles' grants.

Old backups' chunks may move to a cheaper storage class (STANDARD_IA or
GLACIER_IR; braid:storageClass and per-name policies, braid.ops.storage_class):
the scheduled prune's Sweep copies each chunk onto itself with the new
StorageClass. Such a copy carries no If-None-Match, so the create-only
statement leaves copies out (`s3:x-amz-copy-source` present), and two more
deny every copy under data/ that does anything else: one that names no
movable class, or that does not keep the object's metadata
(MetadataDirective COPY). A copy cannot change a chunk's bytes without
detection either: a chunk copied over another fails authentication at
restore (its index is in its associated data, braid.format.chunk). The
copy is a new version; the Standard one it replaces is noncurrent and
expires a day later, as pruned chunks do (under Object Lock: once its
retention date passed).

Object Lock (optional: the `object_lock` prop or the CDK context
`braid:objectLock`, `{"mode": "GOVERNANCE"|"COMPLIANCE", "days": N}`): the
bucket is created with Object Lock enabled and no default retention, since
staging, leases, catalog records, policies and rekey's copies must stay
deletable. Retention is set per object, on chunks, manifests and archived WAL only,
by whoever writes them (braid.format.lock: the backup's start plus the
days; a WAL object's write plus the days), and the bucket policy refuses a
manifest or archived WAL PUT that carries none, so no backup or WAL is
stored unlocked by a writer that missed the setting. What
S3 does under it: a DELETE without a version id still succeeds (a delete
marker; the locked version stays, still billed, until its date), a delete
of a locked version is refused (GOVERNANCE: unless the caller has
s3:BypassGovernanceRetention and asks; COMPLIANCE: by everyone), lifecycle
never expires a locked version (the noncurrent-version rules below act
once its date passed), and a PUT over a locked key (rekey's If-Match
manifest) makes a new version with its own retention while the old one
stays until its date. Object Lock is enabled when the bucket is created:
turning it on for a deployed bucket is S3's PutObjectLockConfiguration,
outside this stack.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from braid import contract
from braid.errors import UsageError
from braid.format import layout
from braid.format.lock import ObjectLock
from braid.format.staging import keys as staging_keys
from braid.format.storage_class import MOVABLE, StoragePolicy
from braid.format.wal import HISTORY

# Repository-relative key patterns for IAM resources and conditions, from the
# package's one repository layout (braid.format.layout), never retyped here.
CONFIG = layout.CONFIG
STAGING_OBJECTS = f"{layout.STAGING}*"
PLAN_OBJECTS = f"{layout.STAGING}*/plans/*"  # the planner's rounds and re-plans: what the backup map's ItemReader reads
RESULT_OBJECTS = f"{layout.STAGING}*/{staging_keys.RESULTS}*"  # workers' item results (braid.format.staging.results)
FAILURE_OBJECTS = f"{layout.STAGING}*/{staging_keys.FAILURES}*"  # workers' failure records (ItemFailure)
WAKE_OBJECTS = f"{layout.STAGING}*/{staging_keys.WAKE}"  # the sleeping pipeline's wake records (braid.format.staging.wake)
DATA_OBJECTS = f"{layout.DATA}*"
METADATA_OBJECTS = f"{layout.DATA}*/metadata/*"  # a backup's encrypted metadata (braid.format.metadata): Finalize writes, Prepare reads a parent's
MANIFEST_OBJECTS = f"{layout.MANIFESTS}*"
POLICY_OBJECTS = f"{layout.POLICIES}*"  # stored retention policies, read by the scheduled prune
CATALOG_OBJECTS = f"{layout.CATALOG}*"  # what `list` reads: summaries, log markers, snapshots (braid.ops.catalog)
PRICES = layout.PRICES  # the repository's price table, which `show` and `list` price each backup's usage with
STORAGE_OBJECTS = f"{layout.STORAGE}*"  # storage class records: TallyPrune writes one per backup moved, PlanPrune removes a pruned backup's
# Archived WAL files and packs in their segment directories (wal/NAME/TTTTTTTTXXXXXXXX/FILE): what the scheduled prune
# may delete. The 16 `?` and the slashes around them match no `wal/NAME/archive.json` and no `wal/NAME/history/` key.
WAL_FILE_OBJECTS = f"{layout.WAL}*/{'?' * 16}/*"
WAL_RECORDS = f"{layout.WAL}*/archive.json"  # each archive's record (its segment size), which the prune reads
WAL_HISTORY_OBJECTS = f"{layout.WAL}*/{HISTORY}/*"  # timeline history files (never pruned; re-wrapped by rekey)
VERIFY_OBJECTS = f"{layout.VERIFICATIONS}*"  # verify records, one per verification of a backup (braid.format.verification)
VERIFY_RUN_OBJECTS = f"{layout.VERIFY_RUNS}*"  # the cloud verify's work: its plan, map items and the map's exported results
VERIFY_RUN_LIFETIME = Duration.days(8)  # a run's recorder deletes its work; what a failed run left expires
REKEY_OBJECTS = f"{layout.REKEY}*"  # braid rekey's verified copies; the scheduled prune removes a pruned backup's
SUMMARY_OBJECTS = f"{layout.SUMMARIES}*"  # catalog summaries: the prune drops a pruned backup's, the sweep a leftover's
CATALOG_LOG_OBJECTS = f"{layout.CATALOG_LOG}*"  # catalog log markers: the prune writes `removed` ones, and collects old days
CATALOG_INDEX_OBJECTS = f"{layout.CATALOG_INDEX}*"  # catalog snapshots: the prune run writes one and collects superseded ones
PRUNE_OBJECTS = f"{layout.PRUNE}*"  # scheduled prune runs' plans, map items, results and reports (braid.pipeline.prune_plan)
# Prune run reports are kept this long (working files go at the end of each run; a failed run's expire too).
PRUNE_RECORDS = Duration.days(90)

# The longest a backup's execution may run (the state machine's timeout), and
# how long staging lives: longer, so the lifecycle never expires a live backup.
EXECUTION_TIMEOUT = Duration.days(7)
STAGING_LIFETIME = Duration.days(8)
# Noncurrent chunk versions (pruned, or discarded by Cleanup) and staging versions.
NONCURRENT_DATA = Duration.days(1)
# Chunks are written once, by every principal (the bucket policy's CreateOnlyChunks statement).
# Copies (a chunk onto itself in another storage class) are held by the two conditions below instead.
CREATE_ONLY_CONDITION = {"Null": {"s3:if-none-match": "true", "s3:x-amz-copy-source": "true"}, "Bool": {"s3:ObjectCreationOperation": "true"}}
# A copy under data/ moves a chunk to a movable class (braid.format.storage_class.MOVABLE), nothing else.
COPY_CLASS_CONDITION = {"Null": {"s3:x-amz-copy-source": "false"}, "StringNotEquals": {"s3:x-amz-storage-class": list(MOVABLE)}}
COPY_METADATA_CONDITION = {"Null": {"s3:x-amz-copy-source": "false"}, "StringNotEquals": {"s3:x-amz-metadata-directive": "COPY"}}
# Manifests are created once, or replaced only as the exact version the writer read (rekey: If-Match).
CONDITIONAL_CONDITION = {"Null": {"s3:if-none-match": "true", "s3:if-match": "true"}, "Bool": {"s3:ObjectCreationOperation": "true"}}
# Under Object Lock, a manifest is written with a retention mode or not at all.
UNLOCKED_CONDITION = {"Null": {"s3:object-lock-mode": "true"}, "Bool": {"s3:ObjectCreationOperation": "true"}}


OBJECT_LOCK_CONTEXT = "braid:objectLock"


def object_lock_setting(value: Any) -> ObjectLock | None:
    """The stack's Object Lock from a prop or context value: {"mode", "days"}, its JSON text, or "MODE:DAYS"; a bad value fails synth."""
    if value is None or value == "":
        return None
    try:
        if isinstance(value, ObjectLock):
            return value
        if isinstance(value, str):
            text = value.strip()
            return ObjectLock.from_json(json.loads(text)) if text.startswith("{") else ObjectLock.parse(text)
        return ObjectLock.from_json(dict(value))
    except (ValueError, TypeError, UsageError) as exc:
        raise ValueError(f"{OBJECT_LOCK_CONTEXT}: not an Object Lock setting ({exc}); e.g. {{\"mode\": \"GOVERNANCE\", \"days\": 30}}") from None


def storage_class_setting(value: Any) -> StoragePolicy | None:
    """The stack's storage class policy from the `braid:storageClass` context: "CLASS:DAYS" or {"class", "after_days"}; a bad value fails synth."""
    if value is None or value == "":
        return None
    try:
        if isinstance(value, str):
            text = value.strip()
            return StoragePolicy.from_json(json.loads(text)) if text.startswith("{") else StoragePolicy.parse(text)
        return StoragePolicy.from_json(dict(value))
    except (ValueError, TypeError, UsageError) as exc:
        raise ValueError(f"{contract.CONTEXT_STORAGE_CLASS}: not a storage class policy ({exc}); e.g. STANDARD_IA:30 or GLACIER_IR:90") from None


def key_prefix(repository_prefix: str) -> str:
    """`prefix/` for a repository under a prefix, "" for one at the bucket root."""
    cleaned = repository_prefix.strip("/")
    return f"{cleaned}/" if cleaned else ""


class Storage(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, repository_prefix: str = "", object_lock: ObjectLock | None = None) -> None:
        super().__init__(scope, construct_id)
        self.repository_prefix = repository_prefix.strip("/")
        self.object_lock = object_lock
        base = key_prefix(repository_prefix)
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
            lifecycle_rules=[s3.LifecycleRule(id="expire-access-logs", expiration=Duration.days(90))],
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.bucket = s3.Bucket(
            self,
            "Repository",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.KMS_MANAGED,
            bucket_key_enabled=True,
            enforce_ssl=True,
            versioned=True,
            object_lock_enabled=True if object_lock is not None else None,  # and no object_lock_default_retention: see above
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="repository/",
            lifecycle_rules=[
                s3.LifecycleRule(id="abort-incomplete-uploads", abort_incomplete_multipart_upload_after=STAGING_LIFETIME),
                s3.LifecycleRule(
                    id="expire-staging",
                    prefix=f"{base}{layout.STAGING}",
                    expiration=STAGING_LIFETIME,
                    noncurrent_version_expiration=NONCURRENT_DATA,
                ),
                s3.LifecycleRule(id="expire-verify-runs", prefix=f"{base}{layout.VERIFY_RUNS}", expiration=VERIFY_RUN_LIFETIME),
                s3.LifecycleRule(
                    id="expire-deleted-chunks",
                    prefix=f"{base}{layout.DATA}",
                    noncurrent_version_expiration=NONCURRENT_DATA,
                    expired_object_delete_marker=True,
                ),
                # Raw pushed WAL (braid_infra.wal_archive): the WAL worker purges every version it stored; this is the
                # backstop for a version left behind. Current objects never expire: an unprocessed file is WAL not archived yet.
                s3.LifecycleRule(
                    id="expire-wal-staging-versions",
                    prefix=f"{base}{layout.WAL_STAGING}",
                    noncurrent_version_expiration=NONCURRENT_DATA,
                    expired_object_delete_marker=True,
                ),
                s3.LifecycleRule(id="expire-prune-runs", prefix=f"{base}{layout.PRUNE}", expiration=PRUNE_RECORDS),
                s3.LifecycleRule(
                    id="expire-old-versions", noncurrent_version_expiration=Duration.days(30), expired_object_delete_marker=True
                ),
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        denials = [
            ("CreateOnlyChunks", DATA_OBJECTS, CREATE_ONLY_CONDITION),
            ("ChunkCopiesOnlyMoveClass", DATA_OBJECTS, COPY_CLASS_CONDITION),
            ("ChunkCopiesKeepMetadata", DATA_OBJECTS, COPY_METADATA_CONDITION),
            ("ConditionalManifests", MANIFEST_OBJECTS, CONDITIONAL_CONDITION),
            # Archived WAL is created once (braid.ops.wal_push, wal_process), or replaced only as the exact version its writer
            # read (If-Match: `braid rekey` re-wraps each object's key in its head, braid.ops.wal_rekey), never blindly.
            ("ConditionalWal", f"{layout.WAL}*", CONDITIONAL_CONDITION),
            # A staged WAL key holds one version at a time (the worker deletes it by id): braid.ops.wal_stage.
            ("CreateOnlyWalStaging", f"{layout.WAL_STAGING}*", CREATE_ONLY_CONDITION),
        ]
        if object_lock is not None:
            denials.append(("LockedManifests", MANIFEST_OBJECTS, UNLOCKED_CONDITION))
            # ...and so is archived WAL (each file, pack and history file; archive.json stays unlocked): braid.format.lock.
            denials.extend([("LockedWal", WAL_FILE_OBJECTS, UNLOCKED_CONDITION), ("LockedWalHistory", WAL_HISTORY_OBJECTS, UNLOCKED_CONDITION)])
        for sid, pattern, condition in denials:
            self.bucket.add_to_resource_policy(
                iam.PolicyStatement(
                    sid=sid,
                    effect=iam.Effect.DENY,
                    principals=[iam.AnyPrincipal()],
                    actions=["s3:PutObject"],
                    resources=[self.arn(pattern)],
                    conditions=condition,
                )
            )

    def arn(self, relative: str) -> str:
        """ARN of a repository-relative key pattern, e.g. `staging/*`."""
        return f"{self.bucket.bucket_arn}/{key_prefix(self.repository_prefix)}{relative}"

    def prefix_pattern(self, relative: str) -> str:
        """A key prefix pattern for s3:prefix conditions on ListBucket."""
        return f"{key_prefix(self.repository_prefix)}{relative}"
