"""The stack's Object Lock option (`braid:objectLock`, or the `object_lock` prop).

Synthesized with cdk-nag on (an unacknowledged finding fails synth) and
checked by cfn-lint, as the default stack is in test_stack.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "infra"))

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402
from test_stack import Placeholders, s3_grants, statements_of  # noqa: E402

from braid import contract  # noqa: E402
from braid_infra.nag import add_nag_checks  # noqa: E402
from braid_infra.stack import BraidStack  # noqa: E402
from support.moto_stack import braid_functions, cdk_context, resources_of  # noqa: E402


def synth(tmp_path: Path, context: dict[str, Any] | None = None, **props: Any) -> dict[str, Any]:
    app = cdk.App(context={**cdk_context(), **(context or {})}, outdir=str(tmp_path))
    stack = BraidStack(app, "Braid", **props)
    add_nag_checks(app)
    app.synth()
    return Template.from_stack(stack).to_json()


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return synth(tmp_path_factory.mktemp("cdk.out"), {"braid:objectLock": '{"mode": "COMPLIANCE", "days": 30}'})


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return synth(tmp_path_factory.mktemp("cdk.out"))


def repository_bucket(template: dict[str, Any]) -> dict[str, Any]:
    (bucket,) = [r for lid, r in resources_of(template, "AWS::S3::Bucket").items() if lid.startswith("StorageRepository")]
    return dict(bucket["Properties"])


def retention_grants(template: dict[str, Any]) -> set[tuple[str, str]]:
    grants = set()
    for lid in resources_of(template, "AWS::IAM::Role"):
        prefix = lid[:-8]  # without CDK's hash: the role's policies share the prefix
        grants |= {(prefix, resource) for action, resource in s3_grants(Template.from_json(template), prefix) if action == "s3:PutObjectRetention"}
    return grants


def test_the_bucket_has_object_lock_and_no_default_retention(locked: dict[str, Any]) -> None:
    bucket = repository_bucket(locked)
    assert bucket["ObjectLockEnabled"] is True
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    # No bucket-default retention: staging, leases, catalog records, policies and held.json must stay deletable.
    assert "Rule" not in bucket.get("ObjectLockConfiguration", {})
    # The lifecycle still expires noncurrent chunk versions a day after they are deleted: S3 never expires a
    # locked version, so the rule acts once the retention date has passed.
    rules = {r["Id"]: r for r in bucket["LifecycleConfiguration"]["Rules"]}
    assert rules["expire-deleted-chunks"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}


def test_without_the_option_nothing_of_it_is_there(plain: dict[str, Any]) -> None:
    assert "ObjectLockEnabled" not in repository_bucket(plain)
    assert contract.OUTPUT_OBJECT_LOCK not in plain["Outputs"]
    functions = braid_functions(plain).values()
    assert not any(contract.ENV_OBJECT_LOCK in f["Properties"]["Environment"]["Variables"] for f in functions)
    assert retention_grants(plain) == set()
    assert "LockedManifests" not in json.dumps(resources_of(plain, "AWS::S3::BucketPolicy"))
    assert "LockedWal" not in json.dumps(resources_of(plain, "AWS::S3::BucketPolicy"))


def test_writers_learn_the_setting_and_may_set_retention_exactly_where_they_write(locked: dict[str, Any]) -> None:
    assert locked["Outputs"][contract.OUTPUT_OBJECT_LOCK]["Value"] == "COMPLIANCE:30"
    functions = braid_functions(locked).values()
    assert all(f["Properties"]["Environment"]["Variables"][contract.ENV_OBJECT_LOCK] == "COMPLIANCE:30" for f in functions)
    assert {(role.rstrip("0123456789ABCDEF"), resource) for role, resource in retention_grants(locked)} == {
        ("FunctionsWorkerRole", "data/*"),
        ("FunctionsSweepRole", "data/*"),  # a moved chunk's new version gets its original's retention
        ("FunctionsFinalizeRole", "manifests/*"),
        ("FunctionsFinalizeRole", "data/*/metadata/*"),  # a cloud backup's sealed metadata (backup_manifest), locked as its chunks
        ("FunctionsFinalizeRole", "wal/*/history/*"),  # a published backup's timeline history file, kept as long as the backup
        ("OperatorOperatorRole", "manifests/*"),
        # Archived WAL (files, packs, history files), written locked by the WAL worker and re-written by rekey; never archive.json.
        ("FunctionsWalarchiveRole", "wal/*/????????????????/*"),
        ("FunctionsWalarchiveRole", "wal/*/history/*"),
        ("OperatorOperatorRole", "wal/*/????????????????/*"),
        ("OperatorOperatorRole", "wal/*/history/*"),
    }
    for role in ("AccessAgentPolicy", "AccessRestoreRole", "FunctionsVerifyRole", "FunctionsCleanupRole"):
        granted = {a for s in statements_of(Template.from_json(locked), role) for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
        assert not granted & {"s3:PutObjectRetention", "s3:BypassGovernanceRetention", "s3:DeleteObjectVersion"} - (
            {"s3:DeleteObjectVersion"} if role == "FunctionsCleanupRole" else set()
        ), role


def test_under_a_lock_the_prune_reads_wal_retention_before_deleting_and_never_bypasses_it(locked: dict[str, Any], plain: dict[str, Any]) -> None:
    """The scheduled prune HEADs each archived WAL object it would delete (its retain-until date needs
    s3:GetObjectRetention) so a locked one is reported, not hidden behind a delete marker; it may never shorten or
    bypass a retention, nor delete a version. Without a lock it gets neither the read nor the retention grant."""
    wal_files = "wal/*/????????????????/*"

    def grants(template: dict[str, Any]) -> set[tuple[str, str]]:
        return {(a, r) for a, r in s3_grants(Template.from_json(template), "FunctionsPruneRole") if r.startswith("wal/")}

    assert grants(locked) == {("s3:GetObject", "wal/*/archive.json"), ("s3:DeleteObject", wal_files), ("s3:GetObject", wal_files),
                              ("s3:GetObjectRetention", wal_files)}
    assert grants(plain) == {("s3:GetObject", "wal/*/archive.json"), ("s3:DeleteObject", wal_files)}
    actions = {a for s in statements_of(Template.from_json(locked), "FunctionsPruneRole") for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert not actions & {"s3:PutObjectRetention", "s3:BypassGovernanceRetention", "s3:DeleteObjectVersion"}


def test_under_a_lock_the_sweep_reads_a_chunks_retention_before_moving_it(locked: dict[str, Any], plain: dict[str, Any]) -> None:
    """A storage-class move gives the new version the original's date, which HEAD returns only with
    s3:GetObjectRetention (braid.adapters.aws.s3); without a lock there is nothing to read."""

    def reads(template: dict[str, Any]) -> set[str]:
        return {r for a, r in s3_grants(Template.from_json(template), "FunctionsSweepRole") if a == "s3:GetObjectRetention"}

    assert reads(locked) == {"data/*"}
    assert reads(plain) == set()


def test_under_a_lock_finalize_may_lengthen_a_history_files_retention_and_nothing_else_of_the_wal(locked: dict[str, Any], plain: dict[str, Any]) -> None:
    """Before publishing a backup on a timeline after the first, Finalize reads the date of that timeline's history file
    (HEAD: s3:GetObject, with s3:GetObjectRetention for the date) and lengthens it (s3:PutObjectRetention), on history files
    only (braid.ops.wal_history_lock): never a segment, pack or archive.json, never a bypass, never a version's removal.
    Without a lock it has no grant under wal/ at all."""
    history = "wal/*/history/*"

    def grants(template: dict[str, Any]) -> set[tuple[str, str]]:
        return {(a, r) for a, r in s3_grants(Template.from_json(template), "FunctionsFinalizeRole") if r.startswith("wal")}

    assert grants(locked) == {("s3:GetObject", history), ("s3:GetObjectRetention", history), ("s3:PutObjectRetention", history)}
    assert grants(plain) == set()
    actions = {a for s in statements_of(Template.from_json(locked), "FunctionsFinalizeRole") for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert not actions & {"s3:BypassGovernanceRetention", "s3:PutObjectLegalHold"}
    assert {r for a, r in s3_grants(Template.from_json(locked), "FunctionsFinalizeRole") if a in ("s3:GetObjectRetention", "s3:PutObjectRetention")} <= {
        history, "manifests/*", "data/*/metadata/*"}


def test_the_bucket_policy_refuses_a_manifest_without_retention(locked: dict[str, Any]) -> None:
    """Evaluated as IAM does: a writer that missed the setting cannot publish an unlocked backup."""
    from support.iam_policy import ALLOW, DENY, Request, evaluate

    (policy,) = [p for p in resources_of(locked, "AWS::S3::BucketPolicy").values() if p["Properties"]["Bucket"]["Ref"].startswith("StorageRepository")]
    bucket_policy = Placeholders().render(policy["Properties"]["PolicyDocument"])["Statement"]
    (bucket,) = {r.partition(".Arn>")[0] + ".Arn>" for s in bucket_policy for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])}
    admin = [{"Effect": "Allow", "Action": "s3:PutObject", "Resource": "*"}]

    def put(key: str, **headers: str) -> str:
        context = {"s3:ObjectCreationOperation": "true", **{f"s3:{name.replace('_', '-')}": value for name, value in headers.items()}}
        return evaluate(Request("arn:aws:iam::123456789012:role/admin", "s3:PutObject", f"{bucket}/{key}", context), admin, bucket_policy)

    manifest = "manifests/db/20261123T000000.000Z-1a2b3c4d.json"
    assert put(manifest, if_none_match="*") == DENY
    assert put(manifest, if_none_match="*", object_lock_mode="COMPLIANCE") == ALLOW
    assert put(manifest, if_match='"etag"', object_lock_mode="COMPLIANCE") == ALLOW  # rekey
    assert put(manifest, object_lock_mode="COMPLIANCE") == DENY  # still create-only or If-Match
    assert put("data/db/20261123T000000.000Z-1a2b3c4d/0000000000", if_none_match="*", object_lock_mode="COMPLIANCE") == ALLOW
    assert put("staging/db/20261123T000000.000Z-1a2b3c4d/session.json") == ALLOW  # staging stays unlocked


def test_the_operator_may_rekey_with_the_stacks_key_only_and_within_braids_context(locked: dict[str, Any]) -> None:
    (key,) = [r for lid, r in resources_of(locked, "AWS::KMS::Key").items() if lid.startswith("Keys")]
    statements = {s["Sid"]: s for s in key["Properties"]["KeyPolicy"]["Statement"]}
    (sid,) = [sid for sid in statements if sid.startswith("RekeyDataKeys")]
    rekey = statements[sid]
    assert sorted(rekey["Action"]) == ["kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo"]
    assert rekey["Condition"] == {"Null": {"kms:EncryptionContext:braid:backup": "false"}}
    (role,) = [lid for lid in resources_of(locked, "AWS::IAM::Role") if lid.startswith("OperatorOperatorRole")]
    trust = resources_of(locked, "AWS::IAM::Role")[role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [s["Principal"] for s in trust] == [{"AWS": {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":iam::", {"Ref": "AWS::AccountId"}, ":root"]]}}]
    kms = [s for s in statements_of(Template.from_json(locked), "OperatorOperatorRole") if "kms:" in json.dumps(s["Action"])]
    assert all(Placeholders().render(s["Resource"]).startswith("<Keys") for s in kms)  # the stack's key, nothing else


@pytest.mark.parametrize("value", ["GOVERNANCE:7", '{"mode": "governance", "days": 7}'])
def test_the_context_takes_the_object_or_mode_days(tmp_path: Path, value: str) -> None:
    template = synth(tmp_path, {"braid:objectLock": value})
    assert template["Outputs"][contract.OUTPUT_OBJECT_LOCK]["Value"] == "GOVERNANCE:7"


@pytest.mark.parametrize(
    ("value", "message"),
    [('{"mode": "GOVERNANCE"}', "expected"), ("GOVERNANCE:0", "from 1 to 36500"), ('{"mode": "LEGAL", "days": 1}', "GOVERNANCE or COMPLIANCE")],
)
def test_a_bad_setting_fails_the_synth_naming_the_context_key(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=rf"braid:objectLock: not an Object Lock setting \(.*{message}"):
        synth(tmp_path, {"braid:objectLock": value})


def test_the_prop_wins_over_the_context(tmp_path: Path) -> None:
    template = synth(tmp_path, {"braid:objectLock": "COMPLIANCE:99"}, object_lock={"mode": "GOVERNANCE", "days": 3})
    assert template["Outputs"][contract.OUTPUT_OBJECT_LOCK]["Value"] == "GOVERNANCE:3"


def test_cfn_lint_accepts_the_locked_template(locked: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "Braid.template.json"
    path.write_text(json.dumps(locked))
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "cfn-lint"), "--format", "parseable", str(path)], capture_output=True, text=True)
    errors = [line for line in done.stdout.splitlines() if line.split(":")[5:6] and line.split(":")[5].startswith("E")]
    assert done.returncode in (0, 4, 8), done.stdout + done.stderr
    assert not errors, done.stdout
