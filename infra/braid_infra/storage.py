"""Storage: the repository bucket.

Encryption at rest is SSE-KMS with the AWS-managed S3 key (plus a bucket
key): S3 encrypts every object without any principal needing KMS
permissions, so the host agent stays KMS-free. The customer-managed key
(keys.py) is reserved for Braid's own envelope encryption of chunks, which
is what decides who can read a backup.

Staging holds raw, unencrypted database bytes for the life of a backup, so
its leftovers are short-lived: incomplete multipart uploads are aborted after
1 day, staging objects expire after 2, and (the bucket is versioned, so
deletes keep old versions) noncurrent staging versions expire after 1.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_s3 as s3
from constructs import Construct

from braid.format import layout

# Repository-relative key patterns for IAM resources and conditions, from the
# package's one repository layout (braid.format.layout), never retyped here.
CONFIG = layout.CONFIG
STAGING_OBJECTS = f"{layout.STAGING}*"
DATA_OBJECTS = f"{layout.DATA}*"
MANIFEST_OBJECTS = f"{layout.MANIFESTS}*"


def key_prefix(repository_prefix: str) -> str:
    """`prefix/` for a repository under a prefix, "" for one at the bucket root."""
    cleaned = repository_prefix.strip("/")
    return f"{cleaned}/" if cleaned else ""


class Storage(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, repository_prefix: str = "") -> None:
        super().__init__(scope, construct_id)
        self.repository_prefix = repository_prefix.strip("/")
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
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="repository/",
            lifecycle_rules=[
                s3.LifecycleRule(id="abort-incomplete-uploads", abort_incomplete_multipart_upload_after=Duration.days(1)),
                s3.LifecycleRule(
                    id="expire-staging",
                    prefix=f"{base}{layout.STAGING}",
                    expiration=Duration.days(2),
                    noncurrent_version_expiration=Duration.days(1),
                ),
                s3.LifecycleRule(id="expire-old-versions", noncurrent_version_expiration=Duration.days(30)),
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )

    def arn(self, relative: str) -> str:
        """ARN of a repository-relative key pattern, e.g. `staging/*`."""
        return f"{self.bucket.bucket_arn}/{key_prefix(self.repository_prefix)}{relative}"

    def prefix_pattern(self, relative: str) -> str:
        """A key prefix pattern for s3:prefix conditions on ListBucket."""
        return f"{key_prefix(self.repository_prefix)}{relative}"
