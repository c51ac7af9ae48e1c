"""WAL worker Lambda: staged raw WAL files to their archived form, in batches from the WAL queue.

Event: an SQS batch (the event source mapping on the stack's WAL queue, with
ReportBatchItemFailures), each message an S3 "object created" notification
for `wal-staging/NAME/FILE` (braid_infra.wal_archive). Each file is
compressed and encrypted under its own KMS data key, stored create-only
under `wal/`, and its staged version deleted by id (braid.ops.wal_process).
Returns the partial batch response: the messages to deliver again.
"""

from __future__ import annotations

from typing import Any

from braid.adapters.aws.lambda_env import key_service, repository_store
from braid.adapters.aws.wal_staging import S3WalStaging
from braid.format.repository import Repository
from braid.ops.wal import ArchiveInfo
from braid.ops.wal_process import CONFLICT, STORED, Processed, process_staged
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler
from braid.pipeline.wal_batch import StagedRecord, process_batch

_repositories: dict[str, tuple[Repository, S3WalStaging]] = {}  # per container: config.json read once per repository prefix
_known: dict[tuple[str, str], ArchiveInfo] = {}  # per container: each archive's identity record (never changes once written)


def _process(record: StagedRecord) -> Processed:
    if record.prefix not in _repositories:
        store = repository_store(record.prefix)
        _repositories[record.prefix] = (Repository.open(store), S3WalStaging(store))
    repository, staging = _repositories[record.prefix]
    known = {name: info for (prefix, name), info in _known.items() if prefix == record.prefix}
    done = process_staged(repository, key_service(), staging, record.name, record.file, record.version, known=known)
    for name, info in known.items():
        _known[(record.prefix, name)] = info
    logger.info("WAL file processed", extra={"name": done.name, "file": done.file, "outcome": done.outcome})
    if done.outcome == CONFLICT:
        logger.error("a push with other bytes was refused; the archive keeps its copy", extra={"detail": done.detail})
    return done


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, list[dict[str, str]]]:
    response, done = process_batch(event, _process)
    add_metrics(
        {
            "WalFilesArchived": (MetricUnit.Count, sum(1 for d in done if d.outcome == STORED)),
            "WalBytesArchived": (MetricUnit.Bytes, sum(d.size for d in done if d.outcome == STORED)),
            "WalConflicts": (MetricUnit.Count, sum(1 for d in done if d.outcome == CONFLICT)),
            "WalBatchFailures": (MetricUnit.Count, len(response["batchItemFailures"])),
        }
    )
    return response
