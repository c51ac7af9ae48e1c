"""The WAL worker's batch: SQS messages carrying S3 "object created" events under `wal-staging/`.

Each message's body is one S3 event notification (its `Records`: bucket,
URL-encoded key, version id when the bucket is versioned) or S3's test
event (ignored). Every record is processed (braid.ops.wal_pack_process); a
message any of whose records failed is reported in `batchItemFailures`
(the event source mapping's ReportBatchItemFailures), so SQS redelivers
only it after its visibility timeout and, after maxReceiveCount
deliveries, moves it to the dead-letter queue, whose alarm a person
answers. The staged object stays until processed: nothing is lost.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from braid.errors import BackupError
from braid.format.layout import WAL_STAGING, wal_staged_bundle, wal_staged_file
from braid.format.wal import WalFile
from braid.ops.wal_process import Processed

log = logging.getLogger("braid.wal")


@dataclass(frozen=True)
class StagedRecord:
    """One S3 event record: the repository prefix, the archive's name, the file and the version created; for a staged
    bundle (`bundle`), `file` is its slot's first segment (braid.format.wal_bundle)."""

    prefix: str
    name: str
    file: WalFile
    version: str | None
    bundle: bool = False


def staged_record(s3_key: str, version: str | None) -> StagedRecord | None:
    """The record an S3 key under `[PREFIX/]wal-staging/NAME/FILE` (or `.../SLOT.bundle`) names, or None for any other key."""
    at = s3_key.rfind(WAL_STAGING)
    if at < 0 or (at > 0 and s3_key[at - 1] != "/"):
        return None
    bundle = wal_staged_bundle(s3_key[at:])
    found = bundle or wal_staged_file(s3_key[at:])
    if found is None:
        return None
    return StagedRecord(s3_key[: max(at - 1, 0)], found[0], found[1], version or None, bundle is not None)


def records_of(body: str) -> Iterator[StagedRecord]:
    """The staged WAL files an SQS message's S3 event names; ValueError for a body that is not an S3 event."""
    event = json.loads(body)
    if not isinstance(event, Mapping):
        raise ValueError("the message is not an S3 event notification")
    if event.get("Event") == "s3:TestEvent":
        return
    for record in event.get("Records") or []:
        if not str(record.get("eventName", "")).startswith("ObjectCreated"):
            continue
        obj = record["s3"]["object"]
        found = staged_record(unquote_plus(str(obj["key"])), obj.get("versionId"))
        if found is None:
            log.warning("ignored an event for %s: not a staged WAL file", obj.get("key"))
            continue
        yield found


Batch = tuple[dict[str, list[dict[str, str]]], list[Processed]]


def process_batch(event: Mapping[str, Any], process: Callable[[list[StagedRecord]], list[Processed | BackupError]]) -> Batch:
    """Process every message's records at once (`process`: one result per record); the SQS partial batch response and what was done."""
    failures = {str(m.get("messageId", "")): False for m in event.get("Records") or []}  # in order: whether it failed
    records: list[tuple[str, StagedRecord]] = []
    for message in event.get("Records") or []:
        try:
            records += [(str(message.get("messageId", "")), record) for record in records_of(str(message.get("body", "")))]
        except (ValueError, KeyError, TypeError) as exc:
            log.error("message %s failed and is retried: %s: %s", message.get("messageId"), type(exc).__name__, exc)
            failures[str(message.get("messageId", ""))] = True
    results = process([record for _m, record in records])
    for (message_id, record), result in zip(records, results, strict=True):
        if isinstance(result, BackupError):
            log.error("message %s failed and is retried: %s: %s: %s", message_id, record.file.name, type(result).__name__, result)
            failures[message_id] = True
    return {"batchItemFailures": [{"itemIdentifier": m} for m, failed in failures.items() if failed]}, [r for r in results if isinstance(r, Processed)]
