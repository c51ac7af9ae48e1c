"""BraidStack: one stack composed of one construct per concern.

Its outputs are what `braid init --repo s3://... --stack NAME` reads to
write the repository config, so nobody copies ARNs by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from braid.contract import (
    CONTEXT_STORAGE_CLASS,
    OUTPUT_AGENT_INSTANCE_PROFILE,
    OUTPUT_AGENT_POLICY,
    OUTPUT_AGENT_ROLE,
    OUTPUT_BUCKET,
    OUTPUT_COPY_ROLE,
    OUTPUT_KEY,
    OUTPUT_OBJECT_LOCK,
    OUTPUT_OPERATOR_ROLE,
    OUTPUT_PRUNE_STATE_MACHINE,
    OUTPUT_REPOSITORY,
    OUTPUT_RESTORE_INSTANCE_PROFILE,
    OUTPUT_RESTORE_ROLE,
    OUTPUT_STATE_MACHINE,
    OUTPUT_VERIFY_STATE_MACHINE,
)
from braid_infra.access import HostAccess
from braid_infra.backup_schedules import BackupSchedules
from braid_infra.copy_schedule import add_copy_schedule
from braid_infra.functions import PipelineFunctions
from braid_infra.keys import Keys
from braid_infra.layer import BraidLayer
from braid_infra.monitoring import Monitoring
from braid_infra.nag import suppress_findings
from braid_infra.operator import OperatorAccess
from braid_infra.pipeline import STEP_RETRY, WORKER_RETRY, BackupPipeline, RetryPolicy
from braid_infra.prune_pipeline import SWEEP_RETRY, PrunePipeline
from braid_infra.schedules import Schedules
from braid_infra.storage import OBJECT_LOCK_CONTEXT, Storage, object_lock_setting, storage_class_setting
from braid_infra.timeouts import TimedOutCleanup
from braid_infra.verify_pipeline import VerifyPipeline
from braid_infra.wal_archive import WalArchive, acknowledge_wal_findings

WORKER_CONCURRENCY_CONTEXT = "braid:worker-concurrency"


def worker_reservation(value: Any) -> int | None:
    """The worker's reserved concurrency from CDK context: opt-in (None, unset: no reservation, never a deploy blocker)."""
    if value is None or value == "":
        return None
    try:
        reserved = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{WORKER_CONCURRENCY_CONTEXT} must be a whole number of executions, not {value!r}") from None
    if reserved < 1 or isinstance(value, bool):
        raise ValueError(f"{WORKER_CONCURRENCY_CONTEXT} must be at least 1, not {value!r}")
    return reserved


class BraidStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        repository_prefix: str = "",
        layer_dir: Path | None = None,
        worker_retry: RetryPolicy = WORKER_RETRY,
        step_retry: RetryPolicy = STEP_RETRY,
        sweep_retry: RetryPolicy = SWEEP_RETRY,
        retention: Mapping[str, Any] | None = None,
        backup_schedules: Any = None,
        worker_concurrency: int | None = None,
        object_lock: Any = None,
        verify_schedule: Any = None,
        storage_class: Any = None,
        copy_to: Any = None,
        **kwargs,  # type: ignore[no-untyped-def]
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        prefix = repository_prefix.strip("/")
        lock = object_lock_setting(object_lock if object_lock is not None else self.node.try_get_context(OBJECT_LOCK_CONTEXT))
        self.storage = Storage(self, "Storage", repository_prefix=prefix, object_lock=lock)
        self.keys = Keys(self, "Keys", alias=f"alias/braid/{construct_id}")
        self.layer = BraidLayer(self, "Layer", asset_dir=layer_dir)
        if worker_concurrency is None:
            worker_concurrency = worker_reservation(self.node.try_get_context(WORKER_CONCURRENCY_CONTEXT))
        moves = storage_class_setting(storage_class if storage_class is not None else self.node.try_get_context(CONTEXT_STORAGE_CLASS))
        self.functions = PipelineFunctions(
            self, "Functions", storage=self.storage, keys=self.keys, layer=self.layer.layer, worker_concurrency=worker_concurrency, storage_class=moves
        )
        self.pipeline = BackupPipeline(
            self, "Pipeline", storage=self.storage, functions=self.functions, worker_retry=worker_retry, step_retry=step_retry
        )
        self.timed_out = TimedOutCleanup(self, "TimedOutCleanup", state_machine=self.pipeline.state_machine, cleanup=self.functions.pinned("cleanup"))
        self.verify = VerifyPipeline(
            self,
            "VerifyPipeline",
            storage=self.storage,
            functions=self.functions,
            repository_prefix=prefix,
            worker_retry=worker_retry,
            step_retry=step_retry,
            schedule=verify_schedule,
        )
        self.prune = PrunePipeline(
            self, "PrunePipeline", storage=self.storage, functions=self.functions, sweep_retry=sweep_retry, step_retry=step_retry
        )
        self.schedules = Schedules(
            self, "Schedules", verify=self.functions["verify"], prune=self.prune.state_machine, repository_prefix=prefix, retention=retention
        )
        self.backup_schedules = BackupSchedules(self, "BackupSchedules", schedules=backup_schedules)
        # Before Monitoring: the copy function gets its Errors alarm with the others.
        self.copy = add_copy_schedule(
            self, value=copy_to, storage=self.storage, keys=self.keys, functions=self.functions, repository_prefix=prefix
        )
        # Before Monitoring: the WAL worker gets its Errors alarm with the others, and its queues' alarms join them.
        self.wal = WalArchive(self, "WalArchive", storage=self.storage, keys=self.keys, functions=self.functions)
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            state_machine=self.pipeline.state_machine,
            verify_state_machine=self.verify.state_machine,
            prune_state_machine=self.prune.state_machine,
            functions=self.functions.functions,
            extra_alarms=[*([self.backup_schedules.alarm] if self.backup_schedules.alarm else []), *self.wal.alarms],
            scheduled_backups={s.name: s.expected_hours() for s in self.backup_schedules.schedules},
        )
        self.access = HostAccess(
            self, "Access", storage=self.storage, keys=self.keys, state_machine=self.pipeline.state_machine,
            verify_state_machine=self.verify.state_machine,
        )
        self.operator = OperatorAccess(self, "Operator", storage=self.storage, keys=self.keys)

        bucket = self.storage.bucket.bucket_name
        CfnOutput(self, OUTPUT_BUCKET, value=bucket, description="Repository bucket")
        CfnOutput(self, OUTPUT_REPOSITORY, value=f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}", description="braid --repo")
        CfnOutput(self, OUTPUT_KEY, value=self.keys.key.key_arn, description="KMS key wrapping data keys")
        CfnOutput(self, OUTPUT_STATE_MACHINE, value=self.pipeline.state_machine.state_machine_arn, description="Backup state machine")
        CfnOutput(
            self, OUTPUT_VERIFY_STATE_MACHINE, value=self.verify.state_machine.state_machine_arn, description="Verify state machine (braid verify)"
        )
        CfnOutput(
            self, OUTPUT_PRUNE_STATE_MACHINE, value=self.prune.state_machine.state_machine_arn,
            description="Prune state machine (the daily maintenance starts it; input: retention rules, see docs/cloud.md)",
        )
        CfnOutput(self, OUTPUT_AGENT_POLICY, value=self.access.agent_policy.managed_policy_arn, description="Attach to database hosts")
        CfnOutput(self, OUTPUT_AGENT_ROLE, value=self.access.agent_role.role_arn, description="Role for database hosts")
        CfnOutput(self, OUTPUT_RESTORE_ROLE, value=self.access.restore_role.role_arn, description="Role for restore hosts")
        CfnOutput(
            self, OUTPUT_AGENT_INSTANCE_PROFILE, value=self.access.agent_instance_profile.instance_profile_name,
            description="Instance profile for EC2 database hosts (the agent role)",
        )
        CfnOutput(
            self, OUTPUT_RESTORE_INSTANCE_PROFILE, value=self.access.restore_instance_profile.instance_profile_name,
            description="Instance profile for EC2 restore hosts (the restore role)",
        )
        CfnOutput(self, OUTPUT_OPERATOR_ROLE, value=self.operator.role.role_arn, description="Role an operator assumes for braid init and rekey")
        if self.copy is not None:
            CfnOutput(
                self, OUTPUT_COPY_ROLE, value=self.copy.role.role_arn,
                description="The scheduled copy's role: grant it in the second repository's key policy (and bucket policy, in another account)",
            )
        if lock is not None:
            CfnOutput(self, OUTPUT_OBJECT_LOCK, value=str(lock), description="Object Lock retention of chunks and manifests (MODE:DAYS)")
        suppress_findings(self)
        acknowledge_wal_findings(self)
