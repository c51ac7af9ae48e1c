"""The stack with Object Lock on: the synthesized state machine writes locked chunks and manifest, and the
operator role allows exactly what `braid rekey` calls.

The stack is synthesized with `object_lock={"mode": "GOVERNANCE", "days": 2}`
and deployed into moto (its bucket made with Object Lock, as CloudFormation
would), the handlers run in-process with the environment the template gives
them. The operator's grants are evaluated as IAM does (support.iam_policy via
support.emulated_iam) against every S3 and KMS request a real rekey made.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from aws_cdk import Duration
from botocore.config import Config
from test_state_machine import REGION, Cloud, in_process_cloud, pattern

import braid.adapters.aws.s3 as s3_adapter
from braid import contract
from braid.adapters.aws.kms import KmsKeyService, KmsRewrap
from braid.adapters.aws.s3 import S3Store
from braid.format.ids import BackupRef
from braid.format.layout import CONFIG, data_prefix, manifest_key, staging_prefix, wal_key
from braid.format.lock import ObjectLock, retention_until
from braid.format.repository import Repository
from braid.format.staging import StagingArea
from braid.format.stored import stored_objects
from braid.format.wal import WalFile
from braid.ops.rekey import rekey_repository
from support.emulated_cloud import stack_iam
from support.emulated_iam import OPERATOR_KEY, StackIam, json_authorizations, s3_authorizations
from support.iam_policy import ALLOW
from support.moto_stack import SynthesizedStack, braid_functions, synthesize

pytestmark = pytest.mark.cloud

LOCK = ObjectLock("GOVERNANCE", 2)


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> SynthesizedStack:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "infra"))
    from braid_infra.pipeline import RetryPolicy

    fast = RetryPolicy(interval=Duration.seconds(1), max_attempts=3, backoff_rate=1.0, max_delay=Duration.seconds(1))
    return synthesize(tmp_path_factory.mktemp("cdk.out"), worker_retry=fast, step_retry=fast, object_lock=LOCK.to_json())


@pytest.fixture
def cloud(synthesized: SynthesizedStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    with in_process_cloud(synthesized, monkeypatch) as cloud:
        # What `braid init --stack` writes from the stack's ObjectLock output (braid.adapters.aws.stack_outputs).
        config = replace(cloud.repository.config, object_lock=LOCK)
        cloud.store.put(CONFIG, config.to_bytes())
        cloud.repository = Repository.open(cloud.store)
        yield cloud


def retention(cloud: Cloud, key: str) -> tuple[Any, Any]:
    head = cloud.s3.head_object(Bucket=cloud.deployed.bucket, Key=key)
    return head.get("ObjectLockMode"), head.get("ObjectLockRetainUntilDate")


def publish(cloud: Cloud, inputs: list[bytes]) -> BackupRef:
    ref = BackupRef.new("db")
    cloud.stage_backup(ref, inputs, segment_chunks=2)
    arn = cloud.start(ref, max_concurrency=2)
    assert cloud.wait(arn)["status"] == "SUCCEEDED", cloud.failures(arn)
    return ref


def test_the_pipeline_writes_every_chunk_and_the_manifest_locked_and_leaves_no_staging(cloud: Cloud, synthesized: SynthesizedStack) -> None:
    functions = list(braid_functions(synthesized.template).values())
    assert functions and all(f["Properties"]["Environment"]["Variables"][contract.ENV_OBJECT_LOCK] == "GOVERNANCE:2" for f in functions)
    inputs = [pattern(4096 * 5 + 77, 1), pattern(4096 * 2, 2)]

    ref = publish(cloud, inputs)

    chunks = cloud.keys_under(data_prefix(ref))
    packs = stored_objects(cloud.repository.load(ref).manifest)  # items of a segment's 2 chunks: one pack each
    assert sum(len(p.chunks) for p in packs) == 8 and chunks == [p.key for p in packs]
    for key in [*chunks, manifest_key(ref)]:
        assert retention(cloud, key) == ("GOVERNANCE", LOCK.until(ref)), key
    assert cloud.restore(ref) == inputs
    # Staging (raw bytes) carries no retention, so Finalize removed it and its old versions as before.
    assert cloud.keys_under(staging_prefix(ref)) == [] and cloud.staging_versions(staging_prefix(ref)) == []


# --- the operator role, against what rekey really calls -------------------------------


class Recorder:
    """Every S3 and KMS request a client sends, as (action, resource, context) IAM checks (support.emulated_iam)."""

    def __init__(self, iam: StackIam) -> None:
        self.iam = iam
        self.checks: list[tuple[str, str, dict[str, Any]]] = []

    def attach(self, client: Any) -> Any:
        client.meta.events.register("before-sign", self.record)
        return client

    def record(self, request: Any, **kwargs: Any) -> None:
        url = urlsplit(request.url)
        headers = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        body = request.body if isinstance(request.body, bytes) else (request.body or b"")
        if isinstance(body, str):
            body = body.encode()
        if "x-amz-target" in headers:
            self.checks.extend(json_authorizations("kms", headers["x-amz-target"].rpartition(".")[2], json.loads(body or b"{}"), self.iam))
        elif hasattr(body, "read"):  # a streamed PUT body: only its headers matter here
            self.checks.extend(s3_authorizations(request.method, url.path, parse_qs(url.query, keep_blank_values=True), headers, b""))
        else:
            self.checks.extend(s3_authorizations(request.method, url.path, parse_qs(url.query, keep_blank_values=True), headers, body))


def new_key_policy(iam: StackIam) -> list[dict[str, Any]]:
    """What docs/cloud.md ("Deploy on AWS") tells an operator to put in the policy of a key to re-wrap to."""
    assert iam.operator_role is not None
    operator = iam.roles[iam.operator_role].arn
    return [
        {"Effect": "Allow", "Principal": {"AWS": operator}, "Action": ["kms:ReEncryptTo", "kms:Decrypt"], "Resource": "*",
         "Condition": {"Null": {"kms:EncryptionContext:braid:backup": "false"}}},
        {"Effect": "Allow", "Principal": {"AWS": operator}, "Action": "kms:DescribeKey", "Resource": "*"},
    ]


def archive_wal(cloud: Cloud, tmp_path: Path) -> dict[str, bytes]:
    """A segment and a history file archived under `pg` with the stack's key, as the WAL worker stores a file alone."""
    from tests.wal_segments import write_segment

    from braid.ops.wal_push import push_wal

    keys = KmsKeyService(cloud.session.client("kms"), cloud.repository.config.key["key_id"])
    history = tmp_path / "00000002.history"
    history.write_bytes(b"1\t0/3000000\tno recovery target specified\n")
    paths = [write_segment(tmp_path, "000000010000000000000003"), history]
    for path in paths:
        push_wal(cloud.repository, keys, "pg", path)
    return {path.name: path.read_bytes() for path in paths}


def test_the_operator_role_allows_every_call_of_a_rekey_under_lock_and_nothing_else(cloud: Cloud, synthesized: SynthesizedStack, tmp_path: Path) -> None:
    ref = publish(cloud, [pattern(4096 * 3, 3)])
    wal = archive_wal(cloud, tmp_path)  # each WAL object's wrapped key is in its head: rekey replaces the objects
    iam = stack_iam(synthesized, cloud.deployed)
    assert iam.operator_role is not None
    operator = iam.principal_for(OPERATOR_KEY)
    assert operator is not None
    target = cloud.session.client("kms").create_key(Description="the key rekey moves to")["KeyMetadata"]["Arn"]
    iam.other_key_policies[target] = new_key_policy(iam)
    recorder = Recorder(iam)
    s3 = recorder.attach(cloud.session.client("s3", config=Config(s3={"addressing_style": "path"})))
    kms = recorder.attach(cloud.session.client("kms"))
    repository = Repository.open(S3Store(s3, cloud.deployed.bucket, ""))
    unwrap = KmsKeyService.for_unwrap(kms)

    report = rekey_repository(repository, unwrap, unwrap, KmsRewrap.to_key(kms, target), {"type": "kms", "key_id": target})

    assert report.rewrapped == [str(ref)] and not report.failed
    assert (report.wal.rewrapped, report.wal.failed) == (2, [])
    from braid.ops.wal_fetch import fetch_wal_bytes

    for name, data in wal.items():
        assert bytes(fetch_wal_bytes(repository, unwrap, "pg", name)) == data
    assert retention(cloud, manifest_key(ref)) == ("GOVERNANCE", LOCK.until(ref))  # the new version keeps the backup's date
    actions = {action for action, _, _ in recorder.checks}
    assert {"s3:PutObject", "s3:PutObjectRetention", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:Decrypt", "kms:DescribeKey"} <= actions
    refused = [(a, r) for a, r, c in recorder.checks if iam.decide(operator, a, r, c) != ALLOW]
    assert refused == []

    bucket = f"arn:aws:s3:::{cloud.deployed.bucket}"
    chunk = f"{bucket}/{data_prefix(ref)}0000000000"
    creating = {"s3:ObjectCreationOperation": "true"}
    for action, resource, context in [
        ("s3:GetObject", chunk, {}),  # backup data: never
        ("s3:PutObject", chunk, {**creating, "s3:if-none-match": "*"}),
        ("s3:DeleteObject", chunk, {}),
        ("s3:DeleteObjectVersion", f"{bucket}/{manifest_key(ref)}", {}),
        ("s3:BypassGovernanceRetention", f"{bucket}/{manifest_key(ref)}", {}),
        ("s3:PutObject", f"{bucket}/{manifest_key(ref)}", {**creating, "s3:object-lock-mode": "GOVERNANCE"}),  # no If-Match: denied
        ("s3:PutObject", f"{bucket}/{manifest_key(ref)}", {**creating, "s3:if-match": '"etag"'}),  # no retention: denied
        ("s3:PutObject", f"{bucket}/{staging_prefix(ref)}session.json", creating),
        ("s3:PutObject", f"{bucket}/wal/pg/0000000100000000/000000010000000000000003", creating),  # WAL: If-Match only
        ("s3:PutObject", f"{bucket}/wal/pg/archive.json", {**creating, "s3:if-match": '"etag"'}),
        ("s3:GetObject", f"{bucket}/wal-staging/pg/000000010000000000000004", {}),
        ("s3:DeleteObject", f"{bucket}/wal/pg/0000000100000000/000000010000000000000003", {}),
        ("s3:GetObject", f"{bucket}/{staging_prefix(ref)}in0/seg0", {}),
        ("s3:PutObject", f"{bucket}/catalog/summaries/db/x.json", creating),
        ("s3:PutObject", f"{bucket}/policies/db.json", creating),
        ("kms:GenerateDataKey", iam.key_arn, {"kms:EncryptionContext:braid:backup": str(ref)}),
        ("kms:Decrypt", iam.key_arn, {}),  # without the Braid encryption context
        ("kms:ScheduleKeyDeletion", iam.key_arn, {}),
    ]:
        assert iam.decide(operator, action, resource, context) != ALLOW, (action, resource, context)


def test_a_host_agent_may_not_write_a_locked_object_or_bypass_a_lock(synthesized: SynthesizedStack, cloud: Cloud) -> None:
    iam = stack_iam(synthesized, cloud.deployed)
    restore = iam.principal_for("host-restore")
    agent = iam.principal_for("host-agent-db")
    assert restore is not None and agent is not None
    manifest = f"arn:aws:s3:::{cloud.deployed.bucket}/manifests/db/20261123T000000.000Z-1a2b3c4d.json"
    for principal in (restore, agent):
        assert iam.decide(principal, "s3:PutObjectRetention", manifest, {}) != ALLOW
        assert iam.decide(principal, "s3:BypassGovernanceRetention", manifest, {}) != ALLOW


def test_stack_outputs_give_init_the_lock(synthesized: SynthesizedStack, cloud: Cloud) -> None:
    outputs = synthesized.template["Outputs"]
    assert outputs[contract.OUTPUT_OBJECT_LOCK]["Value"] == "GOVERNANCE:2"
    from braid.adapters.aws.stack_outputs import config_from_outputs

    store = S3Store(cloud.s3, cloud.deployed.bucket, "")
    config = config_from_outputs(
        "Braid",
        {contract.OUTPUT_BUCKET: cloud.deployed.bucket, contract.OUTPUT_KEY: cloud.deployed.key_arn,
         contract.OUTPUT_STATE_MACHINE: cloud.deployed.state_machine_arn, contract.OUTPUT_OBJECT_LOCK: "GOVERNANCE:2"},
        store, "2026-11-23T00:00:00.000000Z", REGION,
    )
    assert config.object_lock == LOCK


def test_the_wal_worker_puts_archived_wal_locked_and_may_lock_nothing_else(synthesized: SynthesizedStack, cloud: Cloud) -> None:
    """Under Object Lock the WAL worker's PUT of a file, pack or history file carries retention (s3:PutObjectRetention,
    granted on those keys only); the bucket policy refuses one without; no host may lock or bypass a lock on WAL."""
    iam = stack_iam(synthesized, cloud.deployed)
    (role,) = [lid for lid in iam.roles if "WalarchiveRole" in lid]
    worker, operator = iam.roles[role], iam.principal_for(OPERATOR_KEY)
    agent, restore = iam.principal_for("host-agent-pg"), iam.principal_for("host-restore")
    assert operator is not None and agent is not None and restore is not None
    bucket = f"arn:aws:s3:::{cloud.deployed.bucket}"
    archived = [f"{bucket}/wal/pg/0000000100000000/000000010000000000000003", f"{bucket}/wal/pg/0000000100000000/pack-00000004-00000005",
                f"{bucket}/wal/pg/history/00000002.history"]
    lock = {"s3:object-lock-mode": "GOVERNANCE", "s3:object-lock-retain-until-date": "2026-12-01T00:00:00Z"}
    create = {"s3:ObjectCreationOperation": "true", "s3:if-none-match": "*"}
    for key in archived:
        assert iam.decide(worker, "s3:PutObject", key, {**create, **lock}) == ALLOW, key
        assert iam.decide(worker, "s3:PutObjectRetention", key, {**create, **lock}) == ALLOW, key
        assert iam.decide(worker, "s3:PutObject", key, create) != ALLOW, key  # LockedWal: never archived unlocked
        rekey = {"s3:ObjectCreationOperation": "true", "s3:if-match": '"etag"', **lock}
        assert iam.decide(operator, "s3:PutObject", key, rekey) == ALLOW and iam.decide(operator, "s3:PutObjectRetention", key, rekey) == ALLOW
        assert iam.decide(operator, "s3:GetObjectRetention", key, {}) == ALLOW  # the replaced version's date, which HEAD returns only so
        for principal in (worker, operator, agent, restore):
            assert iam.decide(principal, "s3:BypassGovernanceRetention", key, {}) != ALLOW, (principal.role_id, key)
            assert iam.decide(principal, "s3:DeleteObjectVersion", key, {}) != ALLOW, (principal.role_id, key)
        for principal in (agent, restore):
            assert iam.decide(principal, "s3:PutObjectRetention", key, lock) != ALLOW, (principal.role_id, key)
    for key in (f"{bucket}/wal/pg/archive.json", f"{bucket}/wal-staging/pg/000000010000000000000003", f"{bucket}/{data_prefix(BackupRef.new('db'))}0000000000",
                f"{bucket}/manifests/db/20261123T000000.000Z-1a2b3c4d.json"):
        assert iam.decide(worker, "s3:PutObjectRetention", key, {**create, **lock}) != ALLOW, key
    assert iam.decide(worker, "s3:PutObject", f"{bucket}/wal/pg/archive.json", create) == ALLOW  # the archive's record stays unlocked


# --- a backup's timeline history file, kept as long as the backup by Finalize (braid.ops.wal_history_lock) --------


def archive_history(cloud: Cloud, tmp_path: Path, written: datetime, monkeypatch: pytest.MonkeyPatch) -> str:
    """00000002.history archived under `pg` with the stack's key, as a push at `written` would have: locked until then plus the days."""
    from braid.ops.wal_push import push_wal

    keys = KmsKeyService(cloud.session.client("kms"), cloud.repository.config.key["key_id"])
    history = tmp_path / "00000002.history"
    history.write_bytes(b"1\t0/3000000\tno recovery target specified\n")
    with monkeypatch.context() as patched:
        patched.setattr(s3_adapter, "retention_until", lambda lock, key, now=None: retention_until(lock, key, written))
        push_wal(cloud.repository, keys, "pg", history)
    return wal_key("pg", WalFile.parse(history.name))


def test_finalize_keeps_the_history_file_of_a_timeline_2_backup_as_long_as_the_backup(
    cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Finalize Lambda (its environment's lock, its own store) lengthens the file's date before it publishes. Refused
    (the role lacks the grant), Finalize fails before publishing: the backup is held, naming the error, as any Finalize
    failure; `--resume` once it is granted publishes it."""
    import io
    import tarfile

    from moto.s3.exceptions import S3AccessDeniedError
    from moto.s3.responses import S3Response
    from test_state_machine import wait_for_hold
    from tests.test_wal_retention import label_tar

    from braid.format.staging import ResumeRequest

    def denied(self: Any) -> Any:
        raise S3AccessDeniedError

    key = archive_history(cloud, tmp_path, datetime.now(UTC) - timedelta(days=1), monkeypatch)  # 1 of the 2 days left
    ref = BackupRef.new("pg")
    stream = label_tar(2, 3)
    with tarfile.open(fileobj=io.BytesIO(stream)) as archive:  # what the agent captures from a base backup's tar and stages
        members = {member.name: archive.extractfile(member).read() for member in archive}  # type: ignore[union-attr]
    cloud.stage_session(ref, 1, 2)
    StagingArea(cloud.store, ref).write_captured(members)
    cloud.stage_input(ref, 0, stream, 2)
    cloud.stage_end(ref, [stream], 2)
    with monkeypatch.context() as refused:
        refused.setattr(S3Response, "put_object_retention", denied)
        arn = cloud.start(ref, max_concurrency=2)
        hold = wait_for_hold(cloud, ref, arn)
    assert hold.cause.startswith(f"Finalize failed: HistoryRetentionError: could not keep {key} (timeline 2's history, which a recovery of {ref} follows)")
    assert "s3:PutObjectRetention" in hold.cause and hold.cause.endswith("; nothing was published"), hold.cause
    assert cloud.store.head(manifest_key(ref)) is None

    StagingArea(cloud.store, ref).write_resume_request(ResumeRequest("resume-1"))  # what `braid backup --resume` writes
    assert cloud.wait(arn)["status"] == "SUCCEEDED", cloud.failures(arn)

    manifest = cloud.repository.load(ref).manifest
    assert manifest.wal is not None and manifest.wal.timeline == 2 and manifest.stats["wal_history_lock"] == "extended"
    assert retention(cloud, key) == ("GOVERNANCE", LOCK.until(ref)) == retention(cloud, manifest_key(ref))


def test_the_finalize_role_allows_every_call_of_keeping_a_history_file_and_nothing_more_of_the_wal(
    cloud: Cloud, synthesized: SynthesizedStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What retain_history really sends (a HEAD, a PutObjectRetention), evaluated against the stack's Finalize role."""
    from braid.format.pg_backup import WalInfo
    from braid.ops.wal_history_lock import EXTENDED, retain_history

    key = archive_history(cloud, tmp_path, datetime.now(UTC) - timedelta(days=1), monkeypatch)
    iam = stack_iam(synthesized, cloud.deployed)
    (role,) = [lid for lid in iam.roles if "FinalizeRole" in lid]
    finalize = iam.roles[role]
    recorder = Recorder(iam)
    s3 = recorder.attach(cloud.session.client("s3", config=Config(s3={"addressing_style": "path"})))
    ref = BackupRef.new("pg")

    assert retain_history(S3Store(s3, cloud.deployed.bucket, "", object_lock=LOCK), ref, WalInfo({"timeline": 2})) == EXTENDED

    assert retention(cloud, key) == ("GOVERNANCE", LOCK.until(ref))
    assert {action for action, _, _ in recorder.checks} == {"s3:GetObject", "s3:PutObjectRetention"}
    assert [(a, r) for a, r, c in recorder.checks if iam.decide(finalize, a, r, c) != ALLOW] == []
    bucket = f"arn:aws:s3:::{cloud.deployed.bucket}"
    assert iam.decide(finalize, "s3:GetObjectRetention", f"{bucket}/{key}", {}) == ALLOW  # the date HEAD returns on AWS only so
    for action, resource in [
        ("s3:BypassGovernanceRetention", f"{bucket}/{key}"),
        ("s3:DeleteObjectVersion", f"{bucket}/{key}"),
        ("s3:DeleteObject", f"{bucket}/{key}"),
        ("s3:PutObject", f"{bucket}/{key}"),
        ("s3:PutObjectRetention", f"{bucket}/wal/pg/0000000100000000/000000010000000000000003"),
        ("s3:PutObjectRetention", f"{bucket}/wal/pg/archive.json"),
        ("s3:GetObject", f"{bucket}/wal/pg/0000000100000000/000000010000000000000003"),
    ]:
        assert iam.decide(finalize, action, resource, {"s3:ObjectCreationOperation": "true"} if action == "s3:PutObject" else {}) != ALLOW, action
