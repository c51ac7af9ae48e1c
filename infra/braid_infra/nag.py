"""cdk-nag (AWS Solutions) and the findings Braid accepts.

Each acknowledgement names one construct and one exact finding (cdk-nag v3
acknowledges findings individually, e.g. one wildcard resource), with the
reason it is the least privilege that works. Anything new fails synth.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from aws_cdk import Acknowledgment, CfnElement, Stack, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

from braid_infra.access import OWN_STAGING, STAGING_RECORDS
from braid_infra.storage import (
    CATALOG_INDEX_OBJECTS,
    CATALOG_LOG_OBJECTS,
    CATALOG_OBJECTS,
    DATA_OBJECTS,
    FAILURE_OBJECTS,
    MANIFEST_OBJECTS,
    METADATA_OBJECTS,
    PLAN_OBJECTS,
    POLICY_OBJECTS,
    PRUNE_OBJECTS,
    REKEY_OBJECTS,
    RESULT_OBJECTS,
    STAGING_OBJECTS,
    STORAGE_OBJECTS,
    SUMMARY_OBJECTS,
    VERIFY_OBJECTS,
    VERIFY_RUN_OBJECTS,
    WAKE_OBJECTS,
    WAL_FILE_OBJECTS,
    WAL_HISTORY_OBJECTS,
    WAL_RECORDS,
)
from braid_infra.verify_pipeline import MAP_LABEL as VERIFY_MAP_LABEL

if TYPE_CHECKING:
    from aws_cdk.aws_stepfunctions import StateMachine

    from braid_infra.stack import BraidStack

XRAY = "X-Ray's PutTraceSegments/PutTelemetryRecords support no resource-level permissions (Resource: *); tracing is required."
LOG_STREAMS = "Log streams are created at run time inside the function's own log group; the wildcard covers only that group's streams."
OBJECTS = {
    STAGING_OBJECTS: "Staging objects are named per backup at run time (NAME/ID/...); access is confined to the staging prefix.",
    DATA_OBJECTS: "Chunks are named per backup and index at run time; access is confined to the data prefix.",
    METADATA_OBJECTS: "A backup's metadata objects are named per backup at run time (data/NAME/ID/metadata/KIND); confined to them.",
    MANIFEST_OBJECTS: "Manifests are named per backup at run time; access is confined to the manifests prefix.",
    POLICY_OBJECTS: "Retention policies are named per backup name (policies/NAME.json); read-only, confined to the policies prefix.",
    CATALOG_OBJECTS: "Catalog summaries, log markers and snapshots are named per backup and time at run time; confined to the catalog prefix.",
    REKEY_OBJECTS: "braid rekey's verified manifest copies are named per backup; the scheduled prune only deletes them, confined to rekey/.",
    VERIFY_OBJECTS: "Verify records are named per backup and time at run time (verify/NAME/ID/STAMP~MODE~OUTCOME.json); confined to verify/.",
    VERIFY_RUN_OBJECTS: "A verify run's plan, items and exported map results are named per run at run time; confined to verify-runs/.",
    SUMMARY_OBJECTS: "Catalog summaries are named per backup; the prune deletes those of backups it removes, confined to catalog/summaries/.",
    CATALOG_LOG_OBJECTS: "Catalog log markers are named per time and backup at run time; confined to catalog/log/.",
    CATALOG_INDEX_OBJECTS: "Catalog snapshots are named per time at run time; confined to catalog/index/.",
    STORAGE_OBJECTS: "Storage class records are named per backup and time at run time (storage/NAME/ID/STAMP~CLASS); confined to storage/.",
    RESULT_OBJECTS: "A map item's result record is named per backup and first chunk at run time (staging/NAME/ID/results/N.json).",
    FAILURE_OBJECTS: "A map item's failure record is named per backup and first chunk at run time (staging/NAME/ID/failures/N.json).",
    WAL_FILE_OBJECTS: "Archived WAL files and packs are named per backup name, timeline and segment at run time; the prune deletes only those in segment directories.",
    WAL_HISTORY_OBJECTS: "Timeline history files are named per backup name and timeline at run time; Finalize only reads and lengthens their retention.",
    WAL_RECORDS: "Each WAL archive's record is named per backup name (wal/NAME/archive.json); the prune only reads it.",
    PRUNE_OBJECTS: "A prune run's plan, items, results and report are named per run at run time; confined to prune/.",
}


def add_nag_checks(scope: IConstruct) -> None:
    Validations.of(scope).add_plugins(AwsSolutionsChecks(scope))


def acknowledge(construct: IConstruct, finding: str, reason: str) -> None:
    Validations.of(construct).acknowledge(Acknowledgment(id=finding, reason=reason))


def _ref(stack: Stack, element: IConstruct) -> str:
    child = element.node.default_child if not isinstance(element, CfnElement) else element
    assert isinstance(child, CfnElement)
    return stack.get_logical_id(child)


def wildcard(resource: str) -> str:
    return f"AwsSolutions-IAM5[Resource::{resource}]"


def suppress_findings(stack: BraidStack) -> None:
    bucket = f"<{_ref(stack, stack.storage.bucket)}.Arn>"
    functions = stack.functions
    uses = {
        "prepare": [STAGING_OBJECTS, MANIFEST_OBJECTS, METADATA_OBJECTS],
        "plan": [STAGING_OBJECTS],
        "worker": [STAGING_OBJECTS, DATA_OBJECTS, RESULT_OBJECTS, FAILURE_OBJECTS],
        "finalize": [STAGING_OBJECTS, DATA_OBJECTS, MANIFEST_OBJECTS, CATALOG_OBJECTS, METADATA_OBJECTS],
        "cleanup": [STAGING_OBJECTS, DATA_OBJECTS, MANIFEST_OBJECTS],
        "verify": [],  # the scheduled maintenance only starts the prune run
        "verifyplan": [MANIFEST_OBJECTS, DATA_OBJECTS, VERIFY_OBJECTS, VERIFY_RUN_OBJECTS],
        "verifyworker": [MANIFEST_OBJECTS, DATA_OBJECTS],
        "verifyrecord": [VERIFY_OBJECTS, VERIFY_RUN_OBJECTS],
        "prune": [
            MANIFEST_OBJECTS, CATALOG_OBJECTS, POLICY_OBJECTS, CATALOG_LOG_OBJECTS, PRUNE_OBJECTS, REKEY_OBJECTS, SUMMARY_OBJECTS, VERIFY_OBJECTS, STORAGE_OBJECTS,
            WAL_FILE_OBJECTS, WAL_RECORDS,
        ],
        "sweep": [MANIFEST_OBJECTS, DATA_OBJECTS, STAGING_OBJECTS, SUMMARY_OBJECTS, PRUNE_OBJECTS],
        "tally": [MANIFEST_OBJECTS, CATALOG_OBJECTS, PRUNE_OBJECTS, CATALOG_INDEX_OBJECTS, CATALOG_LOG_OBJECTS, STORAGE_OBJECTS],
    }
    backup_steps = ("prepare", "plan", "worker", "finalize", "cleanup")
    prune_steps = ("prune", "sweep", "tally")
    if stack.storage.object_lock is not None:
        uses["finalize"].append(WAL_HISTORY_OBJECTS)  # under a lock, a published backup's history file is kept as long (braid.ops.wal_history_lock)
    for name, patterns in uses.items():
        policy = functions.roles[name].node.find_child("DefaultPolicy")
        acknowledge(policy, wildcard("*"), XRAY)
        log_group = functions.node.find_child(f"{name.capitalize()}Logs")
        acknowledge(policy, wildcard(f"<{_ref(stack, log_group)}.Arn>:*"), LOG_STREAMS)
        for pattern in patterns:
            acknowledge(policy, wildcard(f"{bucket}/{pattern}"), OBJECTS[pattern])

    machine = stack.pipeline.state_machine
    machine_id = _ref(stack, machine)
    machine_policy = machine.role.node.find_child("DefaultPolicy")
    _machine(stack, machine, backup_steps, "chunks", bucket)
    acknowledge(
        machine_policy, wildcard(f"{bucket}/{PLAN_OBJECTS}"),
        "The map's ItemReader reads plan rounds (staging/NAME/ID/plans/*), named per backup and round at run time; no staged byte.",
    )
    acknowledge(
        machine_policy, wildcard(f"{bucket}/{WAKE_OBJECTS}"), "SleepUntilWoken writes each backup's wake record (staging/NAME/ID/wake), named per backup.",
    )
    prune = stack.prune.state_machine
    _machine(stack, prune, prune_steps, "sweep", bucket)
    acknowledge(prune.role.node.find_child("DefaultPolicy"), wildcard(f"{bucket}/{PRUNE_OBJECTS}"), "The map's ItemReader reads the run's items under prune/.")

    verify = stack.verify.state_machine
    verify_id = _ref(stack, verify)
    _machine(stack, verify, ("verifyplan", "verifyworker", "verifyrecord"), VERIFY_MAP_LABEL, bucket)
    acknowledge(
        verify.role.node.find_child("DefaultPolicy"), wildcard(f"{bucket}/{VERIFY_RUN_OBJECTS}"),
        "The map's ItemReader and ResultWriter: the run's items and results under verify-runs/.",
    )
    follow_verify = "DescribeExecution on the verify state machine's executions, which are named per run at run time (braid verify follows its own)."
    verify_executions = wildcard(f"arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:<{verify_id}.Name>:*")

    access = stack.access
    agent = access.agent_policy
    acknowledge(agent, verify_executions, follow_verify)
    acknowledge(agent, wildcard(f"{bucket}/{VERIFY_OBJECTS}"), OBJECTS[VERIFY_OBJECTS] + " The agent only reads them (braid list, show).")
    own = OWN_STAGING.replace("${", "<").replace("}", ">")  # as cdk-nag prints the policy variable
    acknowledge(
        agent,
        wildcard(f"{bucket}/{own}"),
        "A host writes and reads staging objects (named per backup at run time) only under the backup name it is tagged with.",
    )
    for record in STAGING_RECORDS:
        acknowledge(
            agent, wildcard(f"{bucket}/{record}"), "braid list --incomplete reads this small record (no database bytes) of every backup in staging."
        )
    acknowledge(agent, wildcard(f"{bucket}/{MANIFEST_OBJECTS}"), "The agent reads manifests to confirm a backup was published.")
    acknowledge(
        agent, wildcard("*"),
        "states:SendTaskSuccess only: a callback is authorized by its task token, not a resource; the agent reads its own backup's token.",
    )
    acknowledge(agent, wildcard(f"{bucket}/{CATALOG_OBJECTS}"), OBJECTS[CATALOG_OBJECTS] + " The agent only reads them (braid list).")
    acknowledge(
        agent,
        wildcard(f"arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:<{machine_id}.Name>:*"),
        "DescribeExecution on this state machine's executions, which are named per backup at run time.",
    )
    restore = access.restore_role.node.find_child("DefaultPolicy")
    acknowledge(restore, wildcard(f"{bucket}/{DATA_OBJECTS}"), OBJECTS[DATA_OBJECTS])
    acknowledge(restore, wildcard(f"{bucket}/{MANIFEST_OBJECTS}"), OBJECTS[MANIFEST_OBJECTS])
    acknowledge(restore, wildcard(f"{bucket}/{CATALOG_OBJECTS}"), OBJECTS[CATALOG_OBJECTS] + " Read-only (braid list).")
    operator = stack.operator.role.node.find_child("DefaultPolicy")
    acknowledge(operator, wildcard(f"{bucket}/{MANIFEST_OBJECTS}"), "braid rekey re-wraps every manifest (If-Match replacement only, by the bucket policy).")
    acknowledge(operator, wildcard(f"{bucket}/{REKEY_OBJECTS}"), "braid rekey's verified copies, named per backup, confined to rekey/.")
    for pattern in (WAL_FILE_OBJECTS, WAL_HISTORY_OBJECTS):
        acknowledge(operator, wildcard(f"{bucket}/{pattern}"), "braid rekey re-wraps every archived WAL object's key (If-Match replacement only, by the bucket policy).")
    acknowledge(restore, wildcard(f"{bucket}/{VERIFY_OBJECTS}"), OBJECTS[VERIFY_OBJECTS] + " Read, and created by braid verify --engine local.")
    acknowledge(restore, verify_executions, follow_verify)
    if stack.copy is not None:
        _copy(stack, bucket)


def _copy(stack: BraidStack, bucket: str) -> None:
    """The scheduled copy's role (braid_infra.copy_schedule): the objects of both repositories are named per backup."""
    assert stack.copy is not None
    policy = stack.copy.role.node.find_child("DefaultPolicy")
    acknowledge(policy, wildcard("*"), XRAY)
    acknowledge(policy, wildcard(f"<{_ref(stack, stack.functions.node.find_child('CopyLogs'))}.Arn>:*"), LOG_STREAMS)
    setting = stack.copy.setting
    second = f"arn:<AWS::Partition>:s3:::{setting.bucket}/{setting.prefix + '/' if setting.prefix else ''}"
    for pattern in (DATA_OBJECTS, MANIFEST_OBJECTS):
        acknowledge(policy, wildcard(f"{bucket}/{pattern}"), OBJECTS[pattern] + " Read-only: the copy's source.")
    for pattern in (DATA_OBJECTS, MANIFEST_OBJECTS, CATALOG_OBJECTS):
        acknowledge(policy, wildcard(f"{second}{pattern}"), OBJECTS[pattern] + " In the second repository, where the copy writes.")


def _machine(
    stack: BraidStack,
    machine: StateMachine,
    steps: Sequence[str],
    label: str,
    bucket: str,
    *,
    reader: str | None = None,
) -> None:
    """What CDK itself adds to a state machine with a Distributed Map, and Lambda steps. `reader`: why CDK's grant on
    every object of the bucket stays (the verify machine's ResultWriter); Braid's item readers (braid_infra.steps.
    ScopedJsonItemReader) grant only the objects they map, acknowledged by the caller."""
    machine_id = _ref(stack, machine)
    policy = machine.role.node.find_child("DefaultPolicy")
    acknowledge(policy, wildcard("*"), XRAY + " (state machine tracing)")
    if reader is not None:
        acknowledge(policy, wildcard(f"arn:<AWS::Partition>:s3:::<{_ref(stack, stack.storage.bucket)}>/*"), reader)
    for name in steps:
        acknowledge(
            policy,
            wildcard(f"<{_ref(stack, stack.functions[name])}.Arn>:*"),
            "Added by CDK's LambdaInvoke: invoking the function's versions and aliases as well as $LATEST.",
        )
    map_policy = machine.node.find_child("DistributedMapPolicy")
    execution = f'arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:{{"Fn::Select":[6,{{"Fn::Split":[":",{{"Ref":"{machine_id}"}}]}}]}}'
    reason = "Added by CDK's DistributedMap: the state machine manages its own map runs, whose ids are made at run time."
    acknowledge(map_policy, wildcard(f"{execution}:*"), reason)
    acknowledge(map_policy, wildcard(f"{execution}/{label}:*"), reason)
