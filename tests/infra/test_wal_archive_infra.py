"""The WAL path in the synthesized stack (braid_infra.wal_archive): queue, batches, retries, alarms, grants.

The exact S3 grants of the hosts and the WAL worker are in test_stack.py's
least-privilege table (WAL_AGENT, WAL_RESTORE, WAL_ROLES).
"""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template
from test_stack import actions, resources_of, s3_grants, statements_of

from braid_infra import wal_archive
from braid_infra.stack import BraidStack
from support.moto_stack import cdk_context


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    app = cdk.App(context=cdk_context(), outdir=str(tmp_path_factory.mktemp("cdk.out")))
    return Template.from_stack(BraidStack(app, "Braid"))


def only(template: Template, kind: str, prefix: str) -> dict[str, Any]:
    (found,) = [r for lid, r in resources_of(template.to_json(), kind).items() if lid.startswith(prefix)]
    return found


def test_the_wal_queue_retries_a_failed_file_then_dead_letters_it(template: Template) -> None:
    queue = only(template, "AWS::SQS::Queue", "WalArchiveQueue")["Properties"]
    dead = only(template, "AWS::SQS::Queue", "WalArchiveDeadLetters")["Properties"]
    function = only(template, "AWS::Lambda::Function", "FunctionsWalarchive")["Properties"]
    # AWS: a visibility timeout of at least six times the function's timeout, so a running batch is never delivered twice.
    assert queue["VisibilityTimeout"] >= 6 * function["Timeout"]
    assert queue["RedrivePolicy"]["maxReceiveCount"] == wal_archive.MAX_RECEIVES
    assert queue["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0].startswith("WalArchiveDeadLetters")
    for props in (queue, dead):
        assert props["SqsManagedSseEnabled"] is True and props["MessageRetentionPeriod"] == 14 * 86400
    for policy in resources_of(template.to_json(), "AWS::SQS::QueuePolicy").values():  # TLS only, as the bucket
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in statements)


def test_the_worker_takes_batches_and_reports_failures_per_message(template: Template) -> None:
    mapping = only(template, "AWS::Lambda::EventSourceMapping", "FunctionsWalarchive")["Properties"]
    assert mapping["BatchSize"] == 10 and mapping["MaximumBatchingWindowInSeconds"] == 5
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["EventSourceArn"]["Fn::GetAtt"][0].startswith("WalArchiveQueue")


def test_s3_notifies_the_queue_of_every_staged_wal_file_and_nothing_else(template: Template) -> None:
    bucket = only(template, "AWS::S3::Bucket", "StorageRepository")
    (queue,) = bucket["Properties"]["NotificationConfiguration"]["QueueConfigurations"]
    assert queue["Event"] == "s3:ObjectCreated:*"
    assert queue["Filter"] == {"S3Key": {"Rules": [{"Name": "prefix", "Value": "wal-staging/"}]}}
    assert queue["Queue"]["Fn::GetAtt"][0].startswith("WalArchiveQueue")
    assert set(bucket["Properties"]["NotificationConfiguration"]) == {"QueueConfigurations"}
    # CloudFormation's own configuration: no deploy-time Lambda of CDK's; S3 may send only from this account, and the
    # bucket is made after that permission (S3 checks it when the configuration is set).
    assert not resources_of(template.to_json(), "Custom::S3BucketNotifications")
    assert any(d.startswith("WalArchiveQueuePolicy") for d in bucket["DependsOn"])
    policy = only(template, "AWS::SQS::QueuePolicy", "WalArchiveQueuePolicy")["Properties"]["PolicyDocument"]["Statement"]
    (sending,) = [s for s in policy if s.get("Sid") == "S3NotifiesStagedWal"]
    assert sending["Principal"] == {"Service": "s3.amazonaws.com"} and sending["Action"] == "sqs:SendMessage"
    assert sending["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}


def test_a_dead_lettered_file_and_a_backlog_page_someone(template: Template) -> None:
    alarms = {lid: r["Properties"] for lid, r in resources_of(template.to_json(), "AWS::CloudWatch::Alarm").items() if lid.startswith("WalArchive")}
    dead = next(p for lid, p in alarms.items() if lid.startswith("WalArchiveDeadLettersAlarm"))
    backlog = next(p for lid, p in alarms.items() if lid.startswith("WalArchiveBacklogAlarm"))
    assert dead["MetricName"] == "ApproximateNumberOfMessagesVisible" and dead["Threshold"] == 1
    assert backlog["MetricName"] == "ApproximateAgeOfOldestMessage" and backlog["Threshold"] == 300
    conflicts = next(p for lid, p in alarms.items() if lid.startswith("WalArchiveConflictsAlarm"))  # policy wal-pack: the worker refuses
    assert (conflicts["MetricName"], conflicts["Namespace"], conflicts["Threshold"]) == ("WalConflicts", "Braid", 1)
    for props in (dead, backlog, conflicts):
        assert props["AlarmActions"] and "MonitoringAlarms" in json.dumps(props["AlarmActions"])
    errors = [lid for lid in resources_of(template.to_json(), "AWS::CloudWatch::Alarm") if lid.startswith("MonitoringWalarchiveErrors")]
    assert errors, "the WAL worker's Errors alarm, as every function's"


def test_archived_wal_is_create_only_and_raw_versions_expire(template: Template) -> None:
    bucket = only(template, "AWS::S3::Bucket", "StorageRepository")["Properties"]
    (rule,) = [r for r in bucket["LifecycleConfiguration"]["Rules"] if r["Id"] == "expire-wal-staging-versions"]
    assert rule["Prefix"] == "wal-staging/" and rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}
    assert "ExpirationInDays" not in rule, "an unprocessed file is WAL not archived yet: never expired"
    policy = only(template, "AWS::S3::BucketPolicy", "StorageRepositoryPolicy")["Properties"]["PolicyDocument"]["Statement"]
    for sid, prefix in (("ConditionalWal", "/wal/*"), ("CreateOnlyWalStaging", "/wal-staging/*")):
        (create_only,) = [s for s in policy if s.get("Sid") == sid]
        assert create_only["Effect"] == "Deny" and create_only["Principal"] == {"AWS": "*"} and create_only["Action"] == "s3:PutObject"
        assert json.dumps(create_only["Resource"]).endswith(f'{prefix}"]]}}')
        assert create_only["Condition"]["Null"]["s3:if-none-match"] == "true"
    # Archived WAL may also be replaced as the exact version read (braid rekey re-wraps each object's key: If-Match), never blindly;
    # staged WAL is create-only, one version per key.
    (wal,) = [s for s in policy if s.get("Sid") == "ConditionalWal"]
    assert wal["Condition"]["Null"] == {"s3:if-none-match": "true", "s3:if-match": "true"}
    (staged,) = [s for s in policy if s.get("Sid") == "CreateOnlyWalStaging"]
    assert staged["Condition"]["Null"] == {"s3:if-none-match": "true", "s3:x-amz-copy-source": "true"}


def test_the_worker_uses_kms_only_for_wal_files_and_hosts_not_at_all(template: Template) -> None:
    worker = statements_of(template, "FunctionsWalarchiveRole")
    kms = [s for s in worker if any(a.startswith("kms:") for a in actions([s]))]
    assert len(kms) == 1 and actions(kms) == {"kms:GenerateDataKey", "kms:Decrypt"}
    assert kms[0]["Condition"] == {"StringLike": {"kms:EncryptionContext:braid:backup": "*@wal/*"}}
    assert not any(a.startswith("kms:") for a in actions(statements_of(template, "AccessAgentPolicy")))
    # Nothing but the staged WAL is ever deleted, and only by version (no delete marker hides a raw version).
    deletes = {(a, r) for a, r in s3_grants(template, "FunctionsWalarchiveRole") if a.startswith("s3:Delete")}
    assert deletes == {("s3:DeleteObjectVersion", "wal-staging/*")}
    assert "s3:ListBucketVersions" not in actions(worker), "one version per staged key: deleted by the id it was read with"


def test_a_packs_key_context_is_within_the_worker_s_kms_grant_and_a_backup_s_is_not() -> None:
    from fnmatch import fnmatchcase

    from braid.format.wal_pack import pack_context_name
    
    bound = pack_context_name("pg", "0000000100000000", "pack-00000004-00000005")
    assert bound == "pg@wal/0000000100000000/pack-00000004-00000005" and fnmatchcase(bound, wal_archive.WAL_CONTEXT)  # IAM StringLike: * spans "/"
    assert not fnmatchcase("pg@20261128T080000.000Z-00000001", wal_archive.WAL_CONTEXT)
