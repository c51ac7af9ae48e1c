"""An S3 object's Object Lock retention, read and lengthened in place (braid.ports.store.RetentionExtending).

The current version's mode and date come from a HEAD (S3 returns them only
to a caller with s3:GetObjectRetention, besides the HEAD's s3:GetObject);
moto answers no GetObjectRetention, and the HEAD also says whether the
object exists. PutObjectRetention is sent only for a later date, on the
version the HEAD saw, in that version's own mode: S3 refuses a shorter date
in COMPLIANCE to everyone and in GOVERNANCE without
x-amz-bypass-governance-retention, which is never sent here. Were the date
withheld (no s3:GetObjectRetention), a request for a shorter date would be
refused, never applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from braid.adapters.aws.errors import error_code, http_status
from braid.errors import StorageError
from braid.ports.store import Retained

if TYPE_CHECKING:
    from braid.adapters.aws.s3 import S3Store

READ_PERMISSION = "s3:GetObject and s3:GetObjectRetention"


def lock_head(store: S3Store, key: str) -> Mapping[str, Any] | None:
    """The HEAD of the current version of `key` (its ObjectLockMode, ObjectLockRetainUntilDate, VersionId), None when missing."""
    from braid.adapters.aws.s3 import NOT_FOUND_CODES

    try:
        return store.client.head_object(Bucket=store.bucket, Key=store.object_key(key))
    except ClientError as exc:
        if error_code(exc) in NOT_FOUND_CODES or http_status(exc) == 404:
            return None
        raise store.error(exc, "reading the retention of", key, READ_PERMISSION) from None
    except BotoCoreError as exc:
        raise store.error(exc, "reading the retention of", key, READ_PERMISSION) from None


def extend_retention(store: S3Store, key: str, until: datetime) -> Retained | None:
    """braid.ports.store.RetentionExtending.extend_retention on S3: a HEAD, then PutObjectRetention only for a later date."""
    head = lock_head(store, key)
    if head is None:
        return None
    before = head.get("ObjectLockRetainUntilDate")
    if before is not None and before >= until:
        return Retained(key, before, before)
    mode: Any = head.get("ObjectLockMode") or (store.object_lock.mode if store.object_lock is not None else None)
    if mode is None:
        raise StorageError(f"{store.url}: no Object Lock mode to retain {key} with: the repository has no Object Lock setting")
    params: dict[str, Any] = {"Bucket": store.bucket, "Key": store.object_key(key), "Retention": {"Mode": mode, "RetainUntilDate": until}}
    if head.get("VersionId") and head["VersionId"] != "null":
        params["VersionId"] = head["VersionId"]  # the version whose date was read, not one written since
    try:
        store.client.put_object_retention(**params)
    except (ClientError, BotoCoreError) as exc:
        raise store.error(exc, "extending the Object Lock retention of", key, "s3:PutObjectRetention") from None
    return Retained(key, before, until)
