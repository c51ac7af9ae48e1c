"""Scheduled copy Lambda (CDK context braid:copyTo): copy the backups the second repository is missing.

Event (from the EventBridge schedule): {"prefix": ""}, the stack's
repository prefix. The second repository and its KMS key come from the
function's environment (BRAID_COPY_TO, BRAID_COPY_KMS_KEY). What is
pending, and how a run stops before Lambda's deadline and the next one
resumes, is braid.ops.copy_pending's.
Returns: {"target", "copied", "already", "failed": [{"backup", "error"}],
"objects_copied", "bytes_copied", "ok", "pending", "interrupted",
"remaining"}; the BackupsCopied and CopyFailures metrics. A run in which
a backup failed ends in CopyFailedError (the function's Errors alarm),
after copying what it could; the next scheduled run is the retry.
"""

from __future__ import annotations

from typing import Any

from braid import contract
from braid.adapters.aws.lambda_env import copy_target, key_service, repository_store
from braid.errors import BackupError
from braid.format.repository import Repository
from braid.ops.copy_pending import copy_pending
from braid.pipeline.observability import LambdaContext, MetricUnit, add_metrics, logger, pipeline_handler


class CopyFailedError(BackupError):
    """Some backups were not copied: each one and its error is in the message (and the function's log)."""


@pipeline_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    event = event or {}
    source = Repository.open(repository_store(str(event.get("prefix", ""))))
    target = copy_target()
    logger.append_keys(repository=source.url, target=target.repository.url)

    def stop() -> bool:
        return context.get_remaining_time_in_millis() < contract.COPY_STOP_SECONDS * 1000

    run = copy_pending(source, key_service(), target, stop=stop)
    add_metrics(
        {
            contract.METRIC_BACKUPS_COPIED: (MetricUnit.Count, len(run.report.copied)),
            contract.METRIC_COPY_FAILURES: (MetricUnit.Count, len(run.report.failed)),
        }
    )
    result = run.to_json()
    logger.info("copy run", extra={k: result[k] for k in ("copied", "failed", "pending", "interrupted", "remaining")})
    if not run.ok:
        failed = "; ".join(f"{backup}: {error}" for backup, error in run.report.failed)
        raise CopyFailedError(f"{len(run.report.failed)} backup(s) not copied to {target.repository.url}: {failed}")
    return result
