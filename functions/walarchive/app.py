"""WAL worker Lambda: staged raw WAL files to their archived form, in batches from the WAL queue.

Event: an SQS batch (the event source mapping on the stack's WAL queue, with
ReportBatchItemFailures), each message an S3 "object created" notification
for `wal-staging/NAME/FILE` (braid_infra.wal_archive). The batch's files
are compressed and encrypted under KMS data keys and stored create-only
under `wal/`: whole segments of one directory as one pack per batch (policy
`wal-pack`, off with BRAID_WAL_PACK=off; each pack's next file read during
the codec: `worker-overlap`, off with BRAID_WAL_OVERLAP=off), other files one object each; each
staged version is then deleted by id (braid.ops.wal_pack_process). A staged bundle's members
(`wal-push` at a backlog) become one pack, and the bundle is deleted once all of them
are in their final form (braid.ops.wal_bundle_process); the batch's bundles share one LIST per
directory (`worker-list-once`, off with BRAID_WAL_LIST_ONCE=off).
Returns the partial batch response: the messages to deliver again.
"""

from __future__ import annotations

import os
from typing import Any

from braid import contract
from braid.adapters.aws.lambda_env import key_service, repository_store
from braid.adapters.aws.wal_staging import S3WalStaging
from braid.errors import BackupError
from braid.format.repository import Repository
from braid.ops.wal import ArchiveInfo
from braid.ops.wal_bundle_process import process_bundle
from braid.ops.wal_pack_process import Batch, process_staged_files
from braid.ops.wal_process import CONFLICT, STORED, Processed
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler
from braid.pipeline.wal_batch import StagedRecord, process_batch

_repositories: dict[str, tuple[Repository, S3WalStaging]] = {}  # per container: config.json read once per repository prefix
_known: dict[str, dict[str, ArchiveInfo]] = {}  # per container and prefix: each archive's identity record (never changes)


def _process(records: list[StagedRecord]) -> list[Processed | BackupError]:
    pack_files = 1 if os.environ.get(contract.ENV_WAL_PACK, "on") == "off" else contract.WAL_PACK_FILES
    overlap = os.environ.get(contract.ENV_WAL_OVERLAP, "on") != "off"
    list_once = os.environ.get(contract.ENV_WAL_LIST_ONCE, "on") != "off"
    results: dict[int, Processed | BackupError] = {}
    groups: dict[tuple[str, str], list[int]] = {}
    for i, record in enumerate(records):
        groups.setdefault((record.prefix, record.name), []).append(i)
    for (prefix, name), members in groups.items():
        if prefix not in _repositories:
            store = repository_store(prefix)
            _repositories[prefix] = (Repository.open(store), S3WalStaging(store))
        repository, staging = _repositories[prefix]
        known, keys = _known.setdefault(prefix, {}), key_service()
        files = [i for i in members if not records[i].bundle]
        done = process_staged_files(
            repository, keys, staging, name, [(records[i].file, records[i].version) for i in files], pack_files=pack_files,
            overlap=overlap, known=known,
        ) if files else []
        results.update(zip(files, done, strict=True))
        batch = Batch(repository, keys, staging, name, known=known, listings={} if list_once else None)  # after the single files
        for i in members:
            if records[i].bundle:  # a staged bundle (wal-push --async at a backlog): its members as one pack
                results[i] = process_bundle(batch, records[i].file, records[i].version, pack_files=pack_files, overlap=overlap)
    for result in results.values():
        if isinstance(result, Processed):
            for file in result.files():
                logger.info("WAL file processed", extra={"archive": file.name, "file": file.file, "outcome": file.outcome})
                if file.outcome == CONFLICT:
                    logger.error("a push with other bytes was refused; the archive keeps its copy", extra={"detail": file.detail})
    return [results[i] for i in range(len(records))]


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, list[dict[str, str]]]:
    response, done = process_batch(event, _process)
    files = [file for d in done for file in d.files()]
    add_metrics(
        {
            "WalFilesArchived": (MetricUnit.Count, sum(1 for d in files if d.outcome == STORED)),
            "WalBytesArchived": (MetricUnit.Bytes, sum(d.size for d in files if d.outcome == STORED)),
            "WalConflicts": (MetricUnit.Count, sum(1 for d in files if d.outcome == CONFLICT)),
            "WalBatchFailures": (MetricUnit.Count, len(response["batchItemFailures"])),
        }
    )
    return response
