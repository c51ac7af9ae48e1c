"""The pipeline Lambdas' ports, built from the function's environment.

The stack gives every pipeline function the same environment:

    BRAID_BUCKET        the repository bucket
    BRAID_KMS_KEY_ID    the customer-managed key (ARN)
    BRAID_EVENT_BUS     EventBridge bus for outcome events ("default")
    BRAID_WORKER_LANES  chunks a worker processes at once (worker only)
    BRAID_OBJECT_LOCK   MODE:DAYS when the bucket has Object Lock: every chunk
                        and manifest the functions write carries that retention
    BRAID_COPY_TO, BRAID_COPY_KMS_KEY
                        the scheduled copy's second repository and its KMS key
                        (the copy function only: CDK context braid:copyTo)

Clients are created once per container and shared by threads (boto3 clients
are thread-safe), with the pipeline's retry budget (braid.adapters.aws.clients
PIPELINE: the state machine retries on top); each retry is logged. The store
is per repository prefix, which comes with each execution's input.
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from braid import contract
from braid.adapters.aws.clients import PIPELINE, PIPELINE_KMS, events_client, kms_client, s3_client, stepfunctions_client
from braid.adapters.aws.events import EventBridgePublisher
from braid.adapters.aws.kms import KmsCopy, KmsKeyService, _same_key
from braid.adapters.aws.s3 import S3Store, parse_s3_url
from braid.adapters.aws.s3_multipart import S3Multipart
from braid.adapters.aws.stepfunctions import StepFunctionsPruneRuns
from braid.errors import UsageError
from braid.format.lock import ObjectLock
from braid.format.repository import Repository
from braid.format.storage_class import StoragePolicy
from braid.ops.copy import CopyTarget
from braid.ports.pipeline import MultipartJanitor
from braid.ports.progress_relay import ProgressRelay

if TYPE_CHECKING:  # the stubs are a development dependency: the Lambda layer does not ship them
    from types_boto3_events.client import EventBridgeClient
    from types_boto3_kms.client import KMSClient
    from types_boto3_s3.client import S3Client

log = logging.getLogger("braid.aws")

__all__ = ["EventBridgePublisher", "S3StagingJanitor", "copy_target", "event_publisher", "key_service", "prune_runs", "repository_store", "setting", "worker_concurrency", "worker_lanes"]


def setting(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise UsageError(f"the function's environment lacks {name}; deploy it with the Braid stack")
    return value


def worker_concurrency() -> int:
    """The worker's reserved concurrency, which bounds every map's MaxConcurrency (the stack sets it)."""
    return int(setting(contract.ENV_WORKER_CONCURRENCY, str(contract.DEFAULT_WORKER_CONCURRENCY)))


def worker_lanes() -> int:
    """Chunks a worker processes at once (the stack sets it; the default matches)."""
    return int(setting(contract.ENV_WORKER_LANES, str(contract.DEFAULT_WORKER_LANES)))


def _log_retry(event: dict[str, Any]) -> None:
    """Retries go to the function's log: a slow run in CloudWatch shows what it waited for."""
    log.info("%s %s: %s", event.get("service"), event.get("operation"), event.get("message"))


_retries = ProgressRelay()  # the clients' retries and S3Store's 409 retries alike
_retries.send_to(_log_retry)


@lru_cache(maxsize=1)
def _s3() -> S3Client:
    return s3_client(concurrency=worker_lanes() + 2, retries=PIPELINE, on_retry=_retries)


@lru_cache(maxsize=1)
def _kms() -> KMSClient:
    return kms_client(retries=PIPELINE_KMS, on_retry=_retries)


@lru_cache(maxsize=1)
def _events() -> EventBridgeClient:
    return events_client(retries=PIPELINE, on_retry=_retries)


def object_lock() -> ObjectLock | None:
    """The stack's Object Lock retention (None when the stack configures none)."""
    value = os.environ.get(contract.ENV_OBJECT_LOCK, "")
    return ObjectLock.parse(value) if value else None


def storage_default() -> StoragePolicy | None:
    """The stack's storage class policy (`braid:storageClass`), None when the stack sets none."""
    value = os.environ.get(contract.ENV_STORAGE_CLASS, "")
    return StoragePolicy.parse(value) if value else None


def repository_store(prefix: str) -> S3Store:
    return S3Store(_s3(), setting(contract.ENV_BUCKET), prefix, retries=_retries, object_lock=object_lock())


def key_service() -> KmsKeyService:
    return KmsKeyService(_kms(), setting(contract.ENV_KMS_KEY_ID))


class S3StagingJanitor(MultipartJanitor):
    """The StagingJanitor of a repository on S3: aborts its open uploads and purges old versions."""

    def __init__(self, store: S3Store) -> None:
        super().__init__(S3Multipart(store))


def event_publisher() -> EventBridgePublisher:
    return EventBridgePublisher(_events(), setting(contract.ENV_EVENT_BUS, contract.DEFAULT_EVENT_BUS))


def prune_runs() -> StepFunctionsPruneRuns:
    """The stack's prune state machine (the scheduled maintenance starts it)."""
    return StepFunctionsPruneRuns(stepfunctions_client(retries=PIPELINE, on_retry=_retries), setting(contract.ENV_PRUNE_STATE_MACHINE))


def _key_region(key_arn: str) -> str | None:
    """The region of a key ARN (arn:PARTITION:kms:REGION:ACCOUNT:key/ID); None for a bare id."""
    parts = key_arn.split(":")
    return parts[3] if len(parts) > 5 and parts[0] == "arn" else None


def copy_target() -> CopyTarget:
    """The scheduled copy's second repository (BRAID_COPY_TO) and its KMS key (BRAID_COPY_KMS_KEY).

    The key must be the one the repository's config.json names. In this
    function's region the data key is re-encrypted inside KMS (ReEncrypt);
    a key in another region (KMS keys are regional) gets it by Decrypt here
    and Encrypt there, so the data key is in this function's memory briefly.
    """
    from braid.adapters.local.keys import KeyCopy

    url, key = setting(contract.ENV_COPY_TO), setting(contract.ENV_COPY_KMS_KEY)
    bucket, prefix = parse_s3_url(url)
    repository = Repository.open(S3Store(_s3(), bucket, prefix, retries=_retries))
    recorded = repository.config.key
    if recorded.get("type") != "kms" or not _same_key(str(recorded.get("key_id", "")), key):
        named = f"KMS key {recorded['key_id']}" if recorded.get("type") == "kms" and recorded.get("key_id") else "a master-key file"
        raise UsageError(
            f"{contract.COPY_CONTEXT} names the KMS key {key}, but {repository.url} uses {named}:"
            " give the second repository's own KMS key (braid init --repo URL --kms-key ARN makes one that uses it)"
        )
    region = _key_region(key)
    if region is None or region == _kms().meta.region_name:
        return CopyTarget(repository, KmsKeyService(_kms(), key), KmsCopy(_kms(), key))
    there = KmsKeyService(kms_client(retries=PIPELINE_KMS, on_retry=_retries, region=region), key)
    return CopyTarget(repository, there, KeyCopy(key_service(), there))
