"""boto3 glue for the pipeline Lambdas: ports built from the function's environment.

The stack gives every pipeline function the same environment:

    BRAID_BUCKET        the repository bucket
    BRAID_KMS_KEY_ID    the customer-managed key (ARN)
    BRAID_EVENT_BUS     EventBridge bus for outcome events ("default")
    BRAID_WORKER_LANES  chunks a worker processes at once (worker only)

Clients are created once per container and shared by threads (boto3 clients
are thread-safe); the store is per repository prefix, which comes with each
execution's input.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from braid import contract
from braid.adapters.aws.kms import KmsKeyService, kms_client
from braid.adapters.aws.s3 import S3Store, map_error, s3_client
from braid.errors import StorageError, UsageError


def setting(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise UsageError(f"the function's environment lacks {name}; deploy it with the Braid stack")
    return value


def worker_lanes() -> int:
    """Chunks a worker processes at once (the stack sets it; the default matches)."""
    return int(setting(contract.ENV_WORKER_LANES, str(contract.DEFAULT_WORKER_LANES)))


@lru_cache(maxsize=1)
def _s3() -> Any:
    return s3_client(concurrency=worker_lanes() + 2)


@lru_cache(maxsize=1)
def _kms() -> Any:
    return kms_client()


@lru_cache(maxsize=1)
def _events() -> Any:
    import boto3

    return boto3.client("events")


def repository_store(prefix: str) -> S3Store:
    return S3Store(_s3(), setting(contract.ENV_BUCKET), prefix)


def key_service() -> KmsKeyService:
    return KmsKeyService(_kms(), setting(contract.ENV_KMS_KEY_ID))


class S3StagingJanitor:
    """Aborts incomplete multipart uploads and purges object versions under a repository-relative prefix."""

    def __init__(self, store: S3Store) -> None:
        self.store = store

    def abort_uploads(self, prefix: str) -> int:
        client, bucket = self.store.client, self.store.bucket
        aborted = 0
        try:
            paginator = client.get_paginator("list_multipart_uploads")
            for page in paginator.paginate(Bucket=bucket, Prefix=self.store.object_key(prefix)):
                for upload in page.get("Uploads", []):
                    try:
                        client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                    except ClientError as exc:
                        if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
                            raise
                    aborted += 1
        except (ClientError, BotoCoreError) as exc:
            raise map_error(exc, action="aborting uploads under", bucket=bucket, key=self.store.object_key(prefix), permission="s3:ListBucketMultipartUploads and s3:AbortMultipartUpload") from None
        return aborted


    def purge_versions(self, prefix: str) -> int:
        client, bucket = self.store.client, self.store.bucket
        purged = 0
        try:
            paginator = client.get_paginator("list_object_versions")
            for page in paginator.paginate(Bucket=bucket, Prefix=self.store.object_key(prefix)):
                doomed = [
                    {"Key": v["Key"], "VersionId": v["VersionId"]}
                    for v in (page.get("Versions") or []) + (page.get("DeleteMarkers") or [])
                ]
                for start in range(0, len(doomed), 1000):
                    batch = doomed[start : start + 1000]
                    response = client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
                    if response.get("Errors"):
                        first = response["Errors"][0]
                        raise StorageError(
                            f"could not delete old versions of s3://{bucket}/{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                        )
                    purged += len(batch)
        except (ClientError, BotoCoreError) as exc:
            raise map_error(exc, action="purging old versions under", bucket=bucket, key=self.store.object_key(prefix), permission="s3:ListBucketVersions and s3:DeleteObjectVersion") from None
        return purged


class EventBridgePublisher:
    def __init__(self, client: Any, bus: str) -> None:
        self.client = client
        self.bus = bus

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None:
        try:
            response = self.client.put_events(
                Entries=[{"Source": contract.EVENT_SOURCE, "DetailType": detail_type, "Detail": json.dumps(dict(detail)), "EventBusName": self.bus}]
            )
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"cannot publish {detail_type!r} to EventBridge bus {self.bus}: {exc} (the role needs events:PutEvents)") from None
        if response.get("FailedEntryCount"):
            entry = response["Entries"][0]
            raise StorageError(f"EventBridge refused {detail_type!r}: {entry.get('ErrorCode')}: {entry.get('ErrorMessage')}")


def event_publisher() -> EventBridgePublisher:
    return EventBridgePublisher(_events(), setting(contract.ENV_EVENT_BUS, contract.DEFAULT_EVENT_BUS))
