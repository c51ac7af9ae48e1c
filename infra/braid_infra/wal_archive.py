"""WalArchive: the cloud path of `wal-push`, batched (docs/design/wal-archive.md, "On AWS").

A host PUTs the raw WAL file to `wal-staging/NAME/FILE` (its exit 0: S3
acknowledged it). S3 notifies the WAL queue of every object created under
`wal-staging/`; the WAL worker Lambda takes up to BATCH_SIZE messages at
once, waiting at most BATCH_WINDOW for a batch to fill, and for each file
compresses and encrypts it under its own KMS data key, stores it
create-only under `wal/`, and deletes the staged version by its id
(braid.ops.wal_process). A message whose file failed is reported in the
batch response and delivered again after the queue's visibility timeout;
after MAX_RECEIVES deliveries it goes to the dead-letter queue, whose alarm
(and the queue's oldest-message age) reaches the stack's alarm topic.
The staged object stays until processed: nothing is lost.

Least privilege: the worker reads and deletes (by version) `wal-staging/` only, reads the
repository config and `wal/`, writes only `wal/` (create-only for every
principal: the bucket policy's ConditionalWal; under Object Lock with
retention, which the bucket policy's LockedWal requires), and uses KMS only under an
encryption context naming a WAL file (`braid:backup` = `NAME@wal/FILE`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from braid import contract
from braid.format import layout
from braid_infra.functions import FunctionSpec, PipelineFunctions
from braid_infra.keys import Keys
from braid_infra.storage import CONFIG, WAL_FILE_OBJECTS, WAL_HISTORY_OBJECTS, Storage

if TYPE_CHECKING:
    from braid_infra.stack import BraidStack

WAL_OBJECTS = f"{layout.WAL}*"  # archived WAL files and each archive's archive.json
WAL_STAGING_OBJECTS = f"{layout.WAL_STAGING}*"  # raw pushed WAL files, until the worker stored them
WAL_CONTEXT = "*@wal/*"  # braid.format.wal.wal_context_name: NAME@wal/FILE (a backup's is NAME@ID: no "/")

FUNCTION = "walarchive"
# braid.contract: the figures scripts/bench_lib/wal_model.py prices (its cost per TiB and p99 seconds to the final form).
MEMORY_MB = contract.WAL_MEMORY_MB
TIMEOUT = Duration.seconds(contract.WAL_TIMEOUT_SECONDS)
BATCH_SIZE = contract.WAL_BATCH_SIZE
BATCH_WINDOW = Duration.seconds(contract.WAL_BATCH_WINDOW_SECONDS)
# AWS: a queue's visibility timeout at least 6x the function's timeout (Lambda, "Using Lambda with Amazon SQS").
VISIBILITY = Duration.seconds(6 * contract.WAL_TIMEOUT_SECONDS)
MAX_RECEIVES = 5
RETENTION = Duration.days(14)  # SQS's maximum: a message outlives any outage a person answers within
OLDEST_MESSAGE_ALARM = Duration.minutes(5)  # a pushed file not in its final form this long after its PUT


class WalArchive(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, storage: Storage, keys: Keys, functions: PipelineFunctions) -> None:
        super().__init__(scope, construct_id)
        self.storage = storage
        self.dead_letters = sqs.Queue(
            self, "DeadLetters", retention_period=RETENTION, encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            visibility_timeout=VISIBILITY,
            retention_period=RETENTION,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.dead_letters, max_receive_count=MAX_RECEIVES),
        )
        spec = FunctionSpec(FUNCTION, MEMORY_MB, TIMEOUT, "Braid WAL worker: compress, encrypt and archive staged WAL files")
        self.function, self.role = functions.add(spec, {})
        self.function.add_event_source(
            sources.SqsEventSource(self.queue, batch_size=BATCH_SIZE, max_batching_window=BATCH_WINDOW, report_batch_item_failures=True)
        )
        self._notify(storage)
        self._grant(keys)
        self.alarms = [
            cloudwatch.Alarm(
                self,
                "DeadLettersAlarm",
                metric=self.dead_letters.metric_approximate_number_of_messages_visible(period=Duration.minutes(1), statistic="Maximum"),
                threshold=1,
                evaluation_periods=1,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                alarm_description="Braid: a staged WAL file failed to archive after every retry; it is still in wal-staging/ (docs/cloud.md, WAL on AWS)",
            ),
            cloudwatch.Alarm(
                self,
                "BacklogAlarm",
                metric=self.queue.metric_approximate_age_of_oldest_message(period=Duration.minutes(1), statistic="Maximum"),
                threshold=OLDEST_MESSAGE_ALARM.to_seconds(),
                evaluation_periods=3,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                alarm_description="Braid: pushed WAL waits more than 5 minutes for the WAL worker",
            ),
            cloudwatch.Alarm(
                self,
                "ConflictsAlarm",
                metric=cloudwatch.Metric(
                    namespace=contract.METRICS_NAMESPACE, metric_name="WalConflicts", dimensions_map={"service": contract.SERVICE_NAME},
                    period=Duration.minutes(5), statistic="Sum",
                ),
                threshold=1,
                evaluation_periods=1,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                alarm_description="Braid: the WAL worker refused a pushed WAL file whose name is archived with other bytes (a packed file;"
                " the archive kept its copy): a second cluster pushing under the same name? (docs/format.md, policy wal-pack)",
            ),
        ]

    def _notify(self, storage: Storage) -> None:
        """The bucket's own NotificationConfiguration (CloudFormation's, not CDK's custom resource, which adds a
        deploy-time Lambda): every object created under wal-staging/ to the queue. The queue lets S3 send only for
        this account's buckets (aws:SourceAccount: the bucket's ARN would make a dependency cycle), and the bucket
        is created after that permission, as S3 checks it when the configuration is set."""
        stack = Stack.of(self)
        policy = self.queue.add_to_resource_policy(
            iam.PolicyStatement(
                sid="S3NotifiesStagedWal",
                principals=[iam.ServicePrincipal("s3.amazonaws.com")],
                actions=["sqs:SendMessage"],
                resources=[self.queue.queue_arn],
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            )
        )
        bucket = storage.bucket.node.default_child
        assert isinstance(bucket, s3.CfnBucket) and policy.policy_dependable is not None
        bucket.notification_configuration = s3.CfnBucket.NotificationConfigurationProperty(
            queue_configurations=[
                s3.CfnBucket.QueueConfigurationProperty(
                    event="s3:ObjectCreated:*",
                    queue=self.queue.queue_arn,
                    filter=s3.CfnBucket.NotificationFilterProperty(
                        s3_key=s3.CfnBucket.S3KeyFilterProperty(
                            rules=[s3.CfnBucket.FilterRuleProperty(name="prefix", value=storage.prefix_pattern(layout.WAL_STAGING))]
                        )
                    ),
                )
            ]
        )
        storage.bucket.node.add_dependency(policy.policy_dependable)

    def _s3(self, actions: list[str], *patterns: str) -> None:
        self.role.add_to_policy(iam.PolicyStatement(actions=actions, resources=[self.storage.arn(p) for p in patterns]))

    def _grant(self, keys: Keys) -> None:
        # Read a staged file (the version its event names), and delete that version by its id once stored (staged keys
        # are create-only for every principal, the bucket policy's CreateOnlyWalStaging: one version per key at a time).
        self._s3(["s3:GetObject", "s3:GetObjectVersion"], WAL_STAGING_OBJECTS)
        self._s3(["s3:DeleteObjectVersion"], WAL_STAGING_OBJECTS)
        bucket = self.storage.bucket.bucket_arn
        # Without s3:ListBucket S3 answers 403, not 404, for a missing key (a file processed by an earlier delivery).
        self.role.add_to_policy(iam.PolicyStatement(actions=["s3:ListBucket"], resources=[bucket]))
        # The repository's id (the encryption context), the archive's identity record and archived files (duplicates).
        self._s3(["s3:GetObject"], CONFIG, WAL_OBJECTS)
        self._s3(["s3:PutObject"], WAL_OBJECTS)
        if self.storage.object_lock is not None:
            # Under Object Lock each archived file, pack and history file is PUT with retention (braid.format.lock): that
            # PUT also takes s3:PutObjectRetention, on those keys only (archive.json stays unlocked).
            self._s3(["s3:PutObjectRetention"], WAL_FILE_OBJECTS, WAL_HISTORY_OBJECTS)
        keys.allow_for_context(self.role, "WalDataKeys", ["kms:GenerateDataKey", "kms:Decrypt"], WAL_CONTEXT)



def acknowledge_wal_findings(stack: BraidStack) -> None:
    """cdk-nag's findings on the WAL path, each acknowledged with its reason (braid_infra.nag's rules)."""
    from braid_infra.access import OWN_WAL, OWN_WAL_STAGING
    from braid_infra.nag import LOG_STREAMS, XRAY, _ref, acknowledge, wildcard

    bucket = f"<{_ref(stack, stack.storage.bucket)}.Arn>"
    policy = stack.wal.role.node.find_child("DefaultPolicy")
    acknowledge(policy, wildcard("*"), XRAY)
    acknowledge(policy, wildcard(f"<{_ref(stack, stack.functions.node.find_child('WalarchiveLogs'))}.Arn>:*"), LOG_STREAMS)
    acknowledge(policy, wildcard(f"{bucket}/{WAL_STAGING_OBJECTS}"), "Staged WAL files are named per backup name and WAL file at run time; confined to wal-staging/.")
    acknowledge(policy, wildcard(f"{bucket}/{WAL_OBJECTS}"), "Archived WAL files are named per backup name and WAL file at run time; confined to wal/ (create-only).")
    if stack.storage.object_lock is not None:
        for pattern in (WAL_FILE_OBJECTS, WAL_HISTORY_OBJECTS):
            acknowledge(policy, wildcard(f"{bucket}/{pattern}"), "Under Object Lock each archived WAL file is PUT with retention; named at run time, confined to wal/.")
    agent = stack.access.agent_policy
    for own in (OWN_WAL_STAGING, OWN_WAL):
        printed = own.replace("${", "<").replace("}", ">")  # as cdk-nag prints the policy variable
        acknowledge(agent, wildcard(f"{bucket}/{printed}"), "A host stages and checks WAL files (named per file at run time) only of the name it is tagged with.")
    restore = stack.access.restore_role.node.find_child("DefaultPolicy")
    for pattern in (WAL_OBJECTS, WAL_STAGING_OBJECTS):
        acknowledge(restore, wildcard(f"{bucket}/{pattern}"), "wal-fetch reads WAL files, named per backup name and file at run time (read-only).")
