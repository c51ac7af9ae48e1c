"""What matters in the synthesized stack: permissions, encryption, the pipeline's shape.

Synthesized offline with the Python API and cdk.json's context, cdk-nag
(AWS Solutions) on: synth fails on any unacknowledged finding.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "infra"))

import aws_cdk as cdk  # noqa: E402
from aws_cdk import aws_iam as iam  # noqa: E402
from aws_cdk.assertions import Match, Template  # noqa: E402

from braid import contract  # noqa: E402
from braid_infra.nag import add_nag_checks  # noqa: E402
from braid_infra.stack import BraidStack  # noqa: E402
from support.cfn_render import Resolver  # noqa: E402
from support.moto_stack import cdk_context, resources_of  # noqa: E402


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> BraidStack:
    app = cdk.App(context=cdk_context(), outdir=str(tmp_path_factory.mktemp("cdk.out")))
    built = BraidStack(app, "Braid")
    add_nag_checks(app)
    app.synth()  # raises if cdk-nag reports an unacknowledged finding
    return built


@pytest.fixture(scope="module")
def template(stack: BraidStack) -> Template:
    return Template.from_stack(stack)


def statements_of(template: Template, logical_prefix: str) -> list[dict[str, Any]]:
    found = []
    doc = template.to_json()["Resources"]
    for lid, resource in doc.items():
        if lid.startswith(logical_prefix) and resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            found.extend(resource["Properties"]["PolicyDocument"]["Statement"])
    return found


def actions(statements: list[dict[str, Any]]) -> set[str]:
    result: set[str] = set()
    for statement in statements:
        value = statement["Action"]
        result.update([value] if isinstance(value, str) else value)
    return result


def test_agent_may_stage_and_run_backups_but_holds_no_kms_permission(template: Template) -> None:
    agent = statements_of(template, "AccessAgentPolicy")
    granted = actions(agent)
    assert not any(a.startswith("kms:") for a in granted)
    assert granted == {
        "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts", "s3:GetObject",
        "s3:ListBucket", "s3:ListBucketMultipartUploads", "states:StartExecution", "states:DescribeExecution", "states:SendTaskSuccess",
    }
    # The wake (braid.format.staging.wake): a callback names no resource, so SendTaskSuccess alone is granted on "*".
    wake = [s for s in agent if s["Resource"] == "*"]
    assert [s["Action"] for s in wake] == ["states:SendTaskSuccess"]
    writes = [s for s in agent if "s3:PutObject" in s["Action"]]
    # Only under the staging of the backup name the host is tagged with.
    assert json.dumps(writes).count("/staging/${aws:PrincipalTag/braid-name}/*") == 1 and "/data/" not in json.dumps(writes)
    assert "/staging/*\"" not in json.dumps(agent)  # no untagged grant on all of staging


def s3_grants(template: Template, logical_prefix: str) -> set[tuple[str, str]]:
    """(action, repository-relative resource) of a role's S3 grants: "bucket" for the bucket itself."""
    grants = set()
    for statement in statements_of(template, logical_prefix):
        assert statement["Effect"] == "Allow" and "NotAction" not in statement and "NotResource" not in statement, statement
        for action in actions([statement]):
            if not action.startswith("s3:"):
                continue
            for resource in statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]:
                rendered = Placeholders().render(resource)
                relative = rendered.split(".Arn>", 1)[1].lstrip("/") if ".Arn>" in rendered else rendered.split(">", 1)[1].lstrip("/")
                grants.add((action, relative or "bucket"))
    return grants


OWN = "staging/${aws:PrincipalTag/braid-name}/*"
# WAL on AWS (braid_infra.wal_archive; more in test_wal_archive_infra.py): a host stages raw WAL of its own name only and
# reads that archive's objects (their SHA-256 metadata, archive.json), never other names'; restore hosts read both forms.
OWN_WAL_STAGING, OWN_WAL = "wal-staging/${aws:PrincipalTag/braid-name}/*", "wal/${aws:PrincipalTag/braid-name}/*"
WAL_AGENT = {("s3:PutObject", OWN_WAL_STAGING), ("s3:GetObject", OWN_WAL_STAGING), ("s3:GetObject", OWN_WAL)}
WAL_RESTORE = {("s3:GetObject", "wal/*"), ("s3:GetObject", "wal-staging/*")}
WAL_ROLES = {
    # The WAL worker: reads a staged file (its version), deletes that version by id, writes only wal/ (create-only by the bucket policy).
    "FunctionsWalarchiveRole": {("s3:GetObject", "wal-staging/*"), ("s3:GetObjectVersion", "wal-staging/*"), ("s3:DeleteObjectVersion", "wal-staging/*"),
                                ("s3:ListBucket", "bucket"), ("s3:GetObject", "config.json"),
                                ("s3:GetObject", "wal/*"), ("s3:PutObject", "wal/*")},
}
WAL_FILES = "wal/*/????????????????/*"  # archived WAL files and packs in their segment directories (braid_infra.storage)
RECORDS = {"staging/*/*/session.json", "staging/*/*/stream-end.json", "staging/*/*/lease"}
LEAST_PRIVILEGE = {
    "AccessAgentPolicy": {("s3:PutObject", OWN), ("s3:AbortMultipartUpload", OWN), ("s3:ListMultipartUploadParts", OWN), ("s3:GetObject", OWN),
                          ("s3:GetObject", "config.json"), ("s3:GetObject", "manifests/*"), *(("s3:GetObject", r) for r in RECORDS),
                          ("s3:GetObject", "catalog/*"), ("s3:GetObject", "verify/*"),
                          ("s3:GetObject", "prices.json"),  # show and list --json price each backup's usage
                          ("s3:ListBucket", "bucket"), ("s3:ListBucketMultipartUploads", "bucket")}
    | WAL_AGENT,  # wal-push with the stack (tests/infra/test_wal_archive_infra.py)
    # Restore hosts read verify records and write their own (braid verify --engine local); the cloud verify reads for them.
    "AccessRestoreRole": {("s3:GetObject", "config.json"), ("s3:GetObject", "manifests/*"), ("s3:GetObject", "data/*"), ("s3:GetObject", "catalog/*"),
                          ("s3:GetObject", "prices.json"),
                          ("s3:GetObject", "verify/*"), ("s3:PutObject", "verify/*"), ("s3:ListBucket", "bucket")}
    | WAL_RESTORE,  # wal-fetch: archived and staged WAL
    **WAL_ROLES,
    # ...and, for an incremental, the parent chain's manifests and the parent's metadata objects, never a chunk (braid.pipeline.parent).
    "FunctionsPrepareRole": {("s3:GetObject", "config.json"), ("s3:GetObject", "staging/*"), ("s3:PutObject", "staging/*"), ("s3:ListBucket", "bucket"),
                             ("s3:GetObject", "manifests/*"), ("s3:GetObject", "data/*/metadata/*")},
    # Plan deletes each segment's staging as soon as all its chunks are stored.
    "FunctionsPlanRole": {("s3:GetObject", "staging/*"), ("s3:PutObject", "staging/*"), ("s3:DeleteObject", "staging/*"), ("s3:ListBucket", "bucket"),
                          ("s3:DeleteObjectVersion", "staging/*"), ("s3:ListBucketVersions", "bucket")},  # finished segments go by version id
    # The worker writes in staging only its item's result or failure record (review 3, L4), never a segment or round.
    "FunctionsWorkerRole": {("s3:GetObject", "staging/*"), ("s3:GetObject", "data/*"), ("s3:PutObject", "data/*"),
                            ("s3:PutObject", "staging/*/results/*"), ("s3:PutObject", "staging/*/failures/*"), ("s3:ListBucket", "bucket")},
    "FunctionsFinalizeRole": {("s3:GetObject", p) for p in ("config.json", "staging/*", "data/*", "manifests/*")}
    | {("s3:PutObject", "manifests/*"), ("s3:PutObject", "data/*/metadata/*"), ("s3:DeleteObject", "staging/*"), ("s3:DeleteObject", "manifests/*"), ("s3:DeleteObjectVersion", "staging/*"),
       ("s3:AbortMultipartUpload", "staging/*"), ("s3:ListBucket", "bucket"), ("s3:ListBucketVersions", "bucket"),
       ("s3:ListBucketMultipartUploads", "bucket")}
    | {(a, "catalog/*") for a in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject")},  # the catalog summary and log marker, before the manifest
    "FunctionsCleanupRole": {("s3:GetObject", "manifests/*"), ("s3:GetObject", "staging/*"), ("s3:DeleteObject", "staging/*"), ("s3:DeleteObject", "data/*"),
                             ("s3:DeleteObjectVersion", "staging/*"), ("s3:AbortMultipartUpload", "staging/*"), ("s3:ListBucket", "bucket"),
                             ("s3:ListBucketVersions", "bucket"), ("s3:ListBucketMultipartUploads", "bucket")},
    # The scheduled maintenance starts the prune run and lists staging/'s prefixes: it reads no object.
    "FunctionsVerifyRole": {("s3:ListBucket", "bucket")},
    # PlanPrune: reads the catalog, policies and manifests; removes manifests (catalog marker and summary first). Never data.
    # It plans storage class moves too: prices.json prices early deletions; a pruned backup's storage records go with it.
    "FunctionsPruneRole": {("s3:GetObject", p) for p in ("config.json", "manifests/*", "catalog/*", "policies/*", "verify/*", "prices.json")}
    | {("s3:PutObject", "catalog/log/*"), ("s3:PutObject", "prune/*")}
    | {("s3:DeleteObject", p) for p in ("manifests/*", "rekey/*", "catalog/summaries/*", "verify/*", "storage/*")} | {("s3:ListBucket", "bucket")}
    # ...then the WAL no kept backup needs: each archive's record read; files and packs deleted in segment directories only
    # (the 16 `?`: never wal/NAME/archive.json, never wal/NAME/history/), and no WAL read (without Object Lock).
    | {("s3:GetObject", "wal/*/archive.json"), ("s3:DeleteObject", WAL_FILES)},
    # Sweep: deletes data and staging (and a leftover's summary), never a manifest; HEADs manifests and reads leases.
    # Staging goes as Cleanup removes it: open uploads aborted, versions and delete markers purged.
    "FunctionsSweepRole": {("s3:GetObject", p) for p in ("manifests/*", "data/*", "staging/*")}
    | {("s3:DeleteObject", p) for p in ("data/*", "staging/*", "catalog/summaries/*")} | {("s3:PutObject", "prune/*"), ("s3:ListBucket", "bucket")}
    | {("s3:DeleteObjectVersion", "staging/*"), ("s3:AbortMultipartUpload", "staging/*"), ("s3:ListBucketVersions", "bucket"),
       ("s3:ListBucketMultipartUploads", "bucket")}
    | {("s3:PutObject", "data/*")},  # a move item's CopyObject onto itself; the bucket policy lets only a class change through
    # TallyPrune: the run's records, and the catalog's snapshots and log days.
    "FunctionsTallyRole": {("s3:GetObject", p) for p in ("config.json", "manifests/*", "catalog/*", "prune/*")}
    | {(a, p) for a in ("s3:PutObject", "s3:DeleteObject") for p in ("catalog/index/*", "catalog/log/*", "prune/*")} | {("s3:ListBucket", "bucket")}
    | {("s3:PutObject", "storage/*")},  # a storage record per backup whose chunks all moved
    # The map's ItemReader reads the run's items only (braid_infra.steps.ScopedJsonItemReader, not CDK's whole-bucket grant).
    "PrunePipelinePruneRole": {("s3:GetObject", "prune/*")},
    # braid init --stack and braid rekey (braid_infra.operator): manifests replaced with If-Match, rekey's copies, the config.
    # ...and each archived WAL object, pack and history file, whose wrapped key is in its head (braid.ops.wal_rekey); never archive.json.
    "OperatorOperatorRole": {(a, p) for a in ("s3:GetObject", "s3:PutObject") for p in ("config.json", "manifests/*", "rekey/*", WAL_FILES, "wal/*/history/*")}
    | {("s3:DeleteObject", "manifests/*"), ("s3:DeleteObject", "rekey/*"), ("s3:ListBucket", "bucket")},
    # The map's ItemReader reads plan rounds only, never a staged byte (review 3, L1: CDK's reader would grant the whole bucket).
    # SleepUntilWoken writes only each backup's wake record (braid.format.staging.wake).
    "PipelineBackupRole": {("s3:GetObject", "staging/*/plans/*"), ("s3:PutObject", "staging/*/wake")},
    # The verify state machine (braid_infra.verify_pipeline): the planner reads manifests, chunks' metadata and
    # earlier records, and writes only the run's plan; the worker only reads; the recorder writes only records.
    "FunctionsVerifyplanRole": {("s3:GetObject", p) for p in ("config.json", "manifests/*", "data/*", "verify/*")}
    | {("s3:PutObject", "verify-runs/*"), ("s3:ListBucket", "bucket")},
    "FunctionsVerifyworkerRole": {("s3:GetObject", p) for p in ("config.json", "manifests/*", "data/*")} | {("s3:ListBucket", "bucket")},
    "FunctionsVerifyrecordRole": {("s3:GetObject", "verify-runs/*"), ("s3:DeleteObject", "verify-runs/*"), ("s3:PutObject", "verify/*"),
                                  ("s3:ListBucket", "bucket")},
    # The ItemReader reads the run's items, the ResultWriter exports beside them: under verify-runs/ only, not CDK's whole bucket.
    # (PutObject with its multipart companions: a large export is uploaded in parts.)
    "VerifyPipelineVerifyRole": {(a, "verify-runs/*") for a in ("s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts")},
}


@pytest.mark.parametrize("role", sorted(LEAST_PRIVILEGE))
def test_every_role_holds_exactly_the_s3_grants_its_code_needs(template: Template, role: str) -> None:
    """Least privilege, role by role: a grant added or widened anywhere fails here until it is reviewed."""
    assert s3_grants(template, role) == LEAST_PRIVILEGE[role]


def test_every_role_of_the_stack_is_in_the_least_privilege_table(template: Template) -> None:
    roles = {lid for lid in resources_of(template.to_json(), "AWS::IAM::Role")}
    covered = {lid for lid in roles if any(lid.startswith(prefix) for prefix in LEAST_PRIVILEGE)}
    # The AgentRole holds only the AgentPolicy (checked above); CDK's log-retention helper has no S3 grant.
    unchecked = {lid for lid in roles - covered if s3_grants(template, lid)}
    assert not unchecked, unchecked


def test_chunks_and_manifests_are_create_only_for_every_principal(template: Template) -> None:
    """S3 "Enforce conditional writes": deny PutObject/CompleteMultipartUpload without If-None-Match, not CreateMultipartUpload/UploadPart;
    a manifest may also be replaced as the exact version its writer read (If-Match: rekey), never blindly."""
    (policy,) = [p for p in resources_of(template.to_json(), "AWS::S3::BucketPolicy").values() if p["Properties"]["Bucket"]["Ref"].startswith("StorageRepository")]
    statements = {s.get("Sid"): s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    expected = {
        "CreateOnlyChunks": ("/data/*", {"Null": {"s3:if-none-match": "true", "s3:x-amz-copy-source": "true"}, "Bool": {"s3:ObjectCreationOperation": "true"}}),
        "ChunkCopiesOnlyMoveClass": (
            "/data/*",
            {"Null": {"s3:x-amz-copy-source": "false"}, "StringNotEquals": {"s3:x-amz-storage-class": ["STANDARD_IA", "GLACIER_IR"]}},
        ),
        "ChunkCopiesKeepMetadata": ("/data/*", {"Null": {"s3:x-amz-copy-source": "false"}, "StringNotEquals": {"s3:x-amz-metadata-directive": "COPY"}}),
        "ConditionalManifests": (
            "/manifests/*",
            {"Null": {"s3:if-none-match": "true", "s3:if-match": "true"}, "Bool": {"s3:ObjectCreationOperation": "true"}},
        ),
    }
    for sid, (objects, condition) in expected.items():
        statement = statements[sid]
        assert (statement["Effect"], statement["Principal"], statement["Action"], statement["Condition"]) == ("Deny", {"AWS": "*"}, "s3:PutObject", condition)
        resource = Placeholders().render(statement["Resource"])
        assert resource.startswith("<StorageRepository") and resource.partition(".Arn>")[2] == objects
    # Deletes are not the bucket policy's business: the roles that must delete still can.
    assert "s3:DeleteObject" not in json.dumps(policy)


def test_the_bucket_policy_lets_rekey_replace_a_manifest_it_read_and_nothing_else_through(template: Template) -> None:
    """Evaluated as IAM does (tests/support/iam_policy): even a principal allowed every PutObject
    cannot replace a chunk, nor a manifest without If-Match; rekey's If-Match PUT goes through."""
    from support.iam_policy import ALLOW, DENY, Request, evaluate

    (policy,) = [p for p in resources_of(template.to_json(), "AWS::S3::BucketPolicy").values() if p["Properties"]["Bucket"]["Ref"].startswith("StorageRepository")]
    bucket_policy = Placeholders().render(policy["Properties"]["PolicyDocument"])["Statement"]
    (bucket,) = {r.partition(".Arn>")[0] + ".Arn>" for s in bucket_policy for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])}
    admin = [{"Effect": "Allow", "Action": "s3:PutObject", "Resource": "*"}]
    creating = {"s3:ObjectCreationOperation": "true"}

    def put(key: str, **headers: str) -> str:
        context = {**creating, **{f"s3:{name.replace('_', '-')}": value for name, value in headers.items()}}
        return evaluate(Request("arn:aws:iam::123456789012:role/admin", "s3:PutObject", f"{bucket}/{key}", context), admin, bucket_policy)

    assert put("manifests/db/20261123T000000.000Z-1a2b3c4d.json") == DENY
    assert put("manifests/db/20261123T000000.000Z-1a2b3c4d.json", if_none_match="*") == ALLOW
    assert put("manifests/db/20261123T000000.000Z-1a2b3c4d.json", if_match='"etag"') == ALLOW  # rekey
    assert put("data/db/20261123T000000.000Z-1a2b3c4d/0000000000") == DENY
    assert put("data/db/20261123T000000.000Z-1a2b3c4d/0000000000", if_match='"etag"') == DENY  # a chunk is never replaced
    assert put("data/db/20261123T000000.000Z-1a2b3c4d/0000000000", if_none_match="*") == ALLOW
    assert put("catalog/summaries/db/x.json") == ALLOW
    # A chunk copied onto itself into a movable class (the prune's move), metadata kept: through; any other copy: denied.
    chunk = "data/db/20261123T000000.000Z-1a2b3c4d/0000000000"
    source = {"x_amz_copy_source": f"bucket/{chunk}", "x_amz_metadata_directive": "COPY"}
    assert put(chunk, **source, x_amz_storage_class="STANDARD_IA") == ALLOW
    assert put(chunk, **source, x_amz_storage_class="GLACIER_IR") == ALLOW
    assert put(chunk, **source, x_amz_storage_class="STANDARD") == DENY
    assert put(chunk, **source, x_amz_storage_class="DEEP_ARCHIVE") == DENY
    assert put(chunk, **source) == DENY  # no class named: a plain overwrite by copy
    assert put(chunk, x_amz_copy_source=f"bucket/{chunk}", x_amz_metadata_directive="REPLACE", x_amz_storage_class="STANDARD_IA") == DENY
    assert put(chunk, x_amz_copy_source=f"bucket/{chunk}", x_amz_storage_class="STANDARD_IA") == DENY  # the directive must be COPY
    assert put("manifests/db/20261123T000000.000Z-1a2b3c4d.json", **source, x_amz_storage_class="STANDARD_IA") == DENY  # manifests stay


def test_hosts_may_pass_only_their_own_tag_when_they_assume_the_agent_role(template: Template) -> None:
    """Review 3, M2: the session tag decides which staging a session may touch, so the trust lets a principal
    of the account pass only the braid-name it carries itself, and no other tag key."""
    from support.iam_policy import conditions_hold

    (agent_role,) = [r for lid, r in resources_of(template.to_json(), "AWS::IAM::Role").items() if lid.startswith("AccessAgentRole")]
    trusted = agent_role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    rendered = [{**s, "Principal": Placeholders().render(s["Principal"])} for s in trusted]
    assert rendered == [
        {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}},
        {
            "Action": ["sts:AssumeRole", "sts:TagSession"],
            "Condition": {
                "StringEquals": {"aws:RequestTag/braid-name": "${aws:PrincipalTag/braid-name}"},
                "ForAllValues:StringEquals": {"aws:TagKeys": ["braid-name"]},
            },
            "Effect": "Allow",
            "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
        },
    ]
    condition = trusted[1]["Condition"]

    def session(caller: str | None, **tags: str) -> bool:
        context: dict[str, str | list[str]] = {f"aws:RequestTag/{k.replace('_', '-')}": v for k, v in tags.items()}
        context["aws:TagKeys"] = [k.replace("_", "-") for k in tags]
        if caller is not None:
            context["aws:PrincipalTag/braid-name"] = caller
        return conditions_hold(condition, context)

    assert session("pg", braid_name="pg")  # a host tagged pg assumes the role as pg
    assert not session("pg", braid_name="mysql")  # ...and never as another name
    assert not session(None, braid_name="pg")  # an untagged caller names nothing
    assert not session("pg")  # nor a session without the tag (it could stage nothing anyway)
    assert not session("pg", braid_name="pg", team="x")  # no other tag key


def test_only_the_read_side_may_decrypt_and_only_prepare_may_generate(template: Template) -> None:
    # The data key (the alarm topic has a key of its own, which no role here may use).
    (key,) = [r for lid, r in resources_of(template.to_json(), "AWS::KMS::Key").items() if lid.startswith("Keys")]
    assert key["Properties"]["EnableKeyRotation"] is True
    policy = key["Properties"]["KeyPolicy"]["Statement"]
    admin = [s for s in policy if s.get("Sid") == "KeyAdministration"]
    assert admin and not any(a in admin[0]["Action"] for a in ("kms:Decrypt", "kms:GenerateDataKey", "kms:*"))
    decrypters = {s["Sid"] for s in policy if s["Action"] == "kms:Decrypt"}
    generators = {s["Sid"] for s in policy if s["Action"] == "kms:GenerateDataKey"}
    assert decrypters == {
        "DecryptDataKeysWorkerRole", "DecryptDataKeysFinalizeRole", "DecryptDataKeysPruneRole", "DecryptDataKeysRestoreRole",
        "DecryptDataKeysVerifyplanRole", "DecryptDataKeysVerifyworkerRole",  # the cloud verify authenticates manifests and decodes chunks
        "DecryptDataKeysPrepareRole",  # an incremental's parent chain (braid.pipeline.parent)
    }
    assert generators == {"GenerateDataKeysPrepareRole"}
    assert all(s["Condition"] == {"Null": {"kms:EncryptionContext:braid:backup": "false"}} for s in policy if s.get("Sid") not in ("KeyAdministration", "WalDataKeys"))
    # The WAL worker: only under a WAL file's context (NAME@wal/FILE), never a backup's (test_wal_archive_infra.py).
    (wal,) = [s for s in policy if s.get("Sid") == "WalDataKeys"]
    assert wal["Condition"] == {"StringLike": {"kms:EncryptionContext:braid:backup": "*@wal/*"}}
    for role in ("FunctionsPlanRole", "FunctionsCleanupRole", "PipelineBackupRole", "FunctionsVerifyrecordRole", "VerifyPipelineVerifyRole"):
        assert not any(a.startswith("kms:") for a in actions(statements_of(template, role))), role


def test_prepare_reads_a_parents_manifests_and_metadata_but_no_chunk_and_decrypts_only_under_a_backups_context(template: Template) -> None:
    mine = statements_of(template, "FunctionsPrepareRole")
    reads = json.dumps([s["Resource"] for s in mine if "s3:GetObject" in actions([s])])
    assert "/manifests/*" in reads and "/data/*/metadata/*" in reads and '/data/*"' not in reads
    writes = json.dumps([s["Resource"] for s in mine if set(actions([s])) & {"s3:PutObject", "s3:DeleteObject"}])
    assert "/staging/*" in writes and "/data/" not in writes and "/manifests/" not in writes
    (decrypt,) = [s for s in mine if "kms:Decrypt" in actions([s])]
    assert decrypt["Condition"] == {"Null": {"kms:EncryptionContext:braid:backup": "false"}}
    assert not {"kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:Encrypt"} & actions(mine)


def test_pipeline_roles_write_only_where_their_step_must(template: Template) -> None:
    def writes(role: str) -> str:
        return json.dumps([s for s in statements_of(template, role) if set(actions([s])) & {"s3:PutObject", "s3:DeleteObject"}])

    assert "/manifests/*" not in writes("FunctionsWorkerRole") and "/data/*" in writes("FunctionsWorkerRole")
    assert "s3:DeleteObject" not in writes("FunctionsWorkerRole")
    # Finalize writes a backup's metadata objects under data/, never a chunk (the worker's).
    assert "/manifests/*" in writes("FunctionsFinalizeRole") and '/data/*"' not in writes("FunctionsFinalizeRole")
    assert "/data/*/metadata/*" in writes("FunctionsFinalizeRole")
    assert "/manifests/*" not in writes("FunctionsCleanupRole")


def test_only_plan_finalize_and_cleanup_purge_versions_and_only_of_staging(template: Template) -> None:
    """Versioning keeps deleted staging (raw database bytes); those three steps purge it, nothing else may."""
    everything = statements_of(template, "")
    purging = [s for s in everything if "s3:DeleteObjectVersion" in actions([s])]
    assert purging and all(
        ("/staging/*" in json.dumps(s["Resource"]) or json.dumps(s["Resource"]).endswith('"/wal-staging/*"]]}')) and "/data/" not in json.dumps(s["Resource"])
        for s in purging
    )  # staging, and the WAL worker's raw staged WAL (test_wal_archive_infra.py)
    for role in ("FunctionsPlanRole", "FunctionsFinalizeRole", "FunctionsCleanupRole"):
        mine = statements_of(template, role)
        assert {"s3:DeleteObjectVersion", "s3:ListBucketVersions"} <= actions(mine)
        (listing,) = [s for s in mine if "s3:ListBucketVersions" in actions([s])]
        assert "staging/*" in json.dumps(listing["Condition"])
    for role in ("FunctionsWorkerRole", "FunctionsPrepareRole", "AccessAgentPolicy"):
        theirs = statements_of(template, role)
        assert theirs and "s3:DeleteObjectVersion" not in actions(theirs)


def test_bucket_blocks_public_access_denies_plain_http_and_expires_staging(template: Template) -> None:
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "PublicAccessBlockConfiguration": {"BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True},
            "BucketEncryption": {"ServerSideEncryptionConfiguration": [{"BucketKeyEnabled": True, "ServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms"}}]},
            "VersioningConfiguration": {"Status": "Enabled"},
            "LifecycleConfiguration": {
                "Rules": Match.array_with(
                    [
                        Match.object_like({"AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 8}, "Status": "Enabled"}),
                        Match.object_like({"Prefix": "staging/", "ExpirationInDays": 8, "NoncurrentVersionExpiration": {"NoncurrentDays": 1}}),
                    ]
                )
            },
        },
    )
    template.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Effect": "Deny", "Action": "s3:*", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]
                )
            }
        },
    )


def lifecycle_rules(template: Template) -> dict[str, dict[str, Any]]:
    buckets = resources_of(template.to_json(), "AWS::S3::Bucket").values()
    (repository,) = [b for b in buckets if b["Properties"].get("VersioningConfiguration")]
    return {rule["Id"]: rule for rule in repository["Properties"]["LifecycleConfiguration"]["Rules"]}


def test_deleted_chunks_stop_being_billed_within_a_day_and_delete_markers_go(template: Template) -> None:
    """Versioning must not keep pruned or discarded chunks for 30 days, nor their delete markers for ever."""
    rules = lifecycle_rules(template)
    chunks = rules["expire-deleted-chunks"]
    assert chunks["Prefix"] == "data/" and chunks["Status"] == "Enabled"
    assert chunks["NoncurrentVersionExpiration"] == {"NoncurrentDays": 1}
    assert chunks["ExpiredObjectDeleteMarker"] is True
    assert rules["expire-old-versions"]["ExpiredObjectDeleteMarker"] is True
    # No rule may expire current chunks or manifests: only retention deletes backups (staging, verify runs and prune
    # run reports are work, not backups).
    assert not any("ExpirationInDays" in r for r in rules.values() if r.get("Prefix") not in ("staging/", "verify-runs/", "prune/"))


def test_staging_outlives_the_longest_execution(template: Template) -> None:
    """A backup running up to the state machine's timeout keeps session.json, key.json and its uploads."""
    machine = backup_machine(template)
    timeout = json.loads(Placeholders().render(machine["Properties"]["DefinitionString"]))["TimeoutSeconds"]
    rules = lifecycle_rules(template)
    assert rules["expire-staging"]["ExpirationInDays"] * 86400 > timeout
    assert rules["abort-incomplete-uploads"]["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] * 86400 >= timeout


def test_finalize_may_withdraw_a_manifest_it_published(template: Template) -> None:
    """finalize_backup deletes the manifest when its read-back fails; IAM must allow it (moto does not check)."""
    statements = statements_of(template, "FunctionsFinalizeRole")
    deleting = [s for s in statements if "s3:DeleteObject" in actions([s])]
    assert any("/manifests/*" in json.dumps(s["Resource"]) for s in deleting)
    assert not any("/data/" in json.dumps(s["Resource"]) for s in deleting)


def test_functions_are_arm64_with_the_layer_and_powertools(template: Template) -> None:
    functions = resources_of(template.to_json(), "AWS::Lambda::Function")
    assert len(functions) == 13  # the backup pipeline's five, the scheduled maintenance, the verify and prune pipelines' three each, the WAL worker
    (layer_id,) = resources_of(template.to_json(), "AWS::Lambda::LayerVersion")
    for lid, function in functions.items():
        props = function["Properties"]
        assert props["Architectures"] == ["arm64"], lid
        assert props["Runtime"] == "python3.14", lid
        assert props["Layers"] == [{"Ref": layer_id}], lid
        assert props["TracingConfig"] == {"Mode": "Active"}, lid
        assert props["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"] == "braid"
    template.has_resource_properties("AWS::Lambda::LayerVersion", {"CompatibleArchitectures": ["arm64"], "CompatibleRuntimes": ["python3.14"]})
    template.has_resource_properties("AWS::Lambda::Function", {"Description": Match.string_like_regexp("Worker"), "MemorySize": 1472})


class Placeholders(Resolver):
    """Renders references as `<LogicalId>` / `<LogicalId.Attr>`, to read a definition offline."""

    def ref(self, name: str) -> str:
        return self.pseudo().get(name, f"<{name}>")

    def get_att(self, name: str, attribute: str) -> str:
        return f"<{name}.{attribute}>"


def backup_machine(template: Template) -> dict[str, Any]:
    """The backup pipeline's state machine (the verify pipeline has its own: tests/infra/test_verify_pipeline.py)."""
    (machine,) = [m for lid, m in resources_of(template.to_json(), "AWS::StepFunctions::StateMachine").items() if lid.startswith("Pipeline")]
    return machine


def test_state_machine_definition(template: Template) -> None:
    machine = backup_machine(template)
    assert machine["Properties"]["StateMachineType"] == "STANDARD"
    rendered = Placeholders().render(machine["Properties"]["DefinitionString"])
    Template.from_json({"Resources": {"Definition": {"Type": "Braid::Definition", "Properties": {"DefinitionString": rendered}}}}).has_resource_properties(
        "Braid::Definition",
        {
            "DefinitionString": Match.serialized_json(
                Match.object_like(
                    {
                        "StartAt": "Identify",
                        "States": Match.object_like(
                            {
                                "Identify": {
                                    "Type": "Pass",
                                    "Parameters": {"name.$": "$$.Execution.Name"},
                                    "ResultPath": "$.execution",
                                    "Next": "Prepare",
                                },
                                "Prepare": Match.object_like({"Next": "PlanSegments", "Catch": [Match.object_like({"Next": "Cleanup"})]}),
                                "SegmentsReady?": Match.object_like({"Type": "Choice", "Default": "WaitForSegments"}),
                                "WaitForSegments": {"Type": "Wait", "SecondsPath": "$.plan.wait_seconds", "Next": "PlanSegments"},
                                "ProcessChunks": Match.object_like(
                                    {
                                        "Type": "Map",
                                        "MaxConcurrencyPath": "$.plan.max_concurrency",
                                        "Next": "PlanSegments",
                                        "ItemReader": Match.object_like(
                                            {"ReaderConfig": {"InputType": "JSON"}, "Parameters": Match.object_like({"Key.$": "$.plan.items_object"})}
                                        ),
                                        "ItemProcessor": Match.object_like(
                                            {
                                                "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "EXPRESS"},
                                                "States": {
                                                    "Worker": Match.object_like(
                                                        {
                                                            "Retry": [
                                                                Match.object_like({"ErrorEquals": ["Lambda.TooManyRequestsException"], "JitterStrategy": "FULL"}),
                                                                Match.object_like(
                                                                    {
                                                                        "ErrorEquals": Match.array_with(["Lambda.ServiceException", "StorageError"]),
                                                                        "BackoffRate": 2,
                                                                        "JitterStrategy": "FULL",
                                                                    }
                                                                )
                                                            ],
                                                            # Failed after its retries: the child ends in ItemFailed, whose
                                                            # output is {} (review 3, M1: the map's output stays far below 256 KiB).
                                                            "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": None, "Next": "ItemFailed"}],
                                                        }
                                                    ),
                                                    "ItemFailed": Match.object_like({"Type": "Pass", "OutputPath": None, "End": True}),
                                                },
                                            }
                                        ),
                                        # Errors that end the backup go to Cleanup; any other failure holds it.
                                        "Catch": [
                                            Match.object_like({"ErrorEquals": list(contract.FINAL_PIPELINE_ERRORS), "Next": "Cleanup"}),
                                            Match.object_like({"ErrorEquals": ["States.ALL"], "Next": "ProcessChunksFailed"}),
                                        ],
                                    }
                                ),
                                "Finalize": Match.object_like(
                                    {
                                        "Next": "BackupSucceeded",
                                        "Catch": [
                                            Match.object_like({"ErrorEquals": list(contract.FINAL_PIPELINE_ERRORS), "Next": "Cleanup"}),
                                            Match.object_like({"ErrorEquals": ["States.ALL"], "Next": "FinalizeFailed"}),
                                        ],
                                    }
                                ),
                                "PlanSegments": Match.object_like(
                                    {"Catch": [Match.object_like({"Next": "Cleanup"}), Match.object_like({"ErrorEquals": ["States.ALL"], "Next": "PlanSegmentsFailed"})]}
                                ),
                                "FinalizeFailed": {
                                    "Type": "Pass",
                                    "Parameters": {"step": "Finalize"},
                                    "ResultPath": "$.failed",
                                    "Next": "Hold",
                                },
                                "Hold": Match.object_like(
                                    {
                                        "Next": "SegmentsReady?",
                                        # The Hold entry: the Plan function holds because this state calls it so.
                                        "Parameters": {contract.HOLD_ENTRY: {"step.$": "$.failed.step", "error.$": "$.error"}, f"{contract.HOLD_STATE}.$": "$"},
                                        "ResultPath": "$.plan",
                                        "Catch": [
                                            Match.object_like({"ErrorEquals": list(contract.FINAL_PIPELINE_ERRORS), "Next": "Cleanup"}),
                                            Match.object_like({"ErrorEquals": ["States.ALL"], "Next": "HoldFailed"}),
                                        ],
                                    }
                                ),
                                "Cleanup": Match.object_like({"Next": "BackupFailed"}),
                                "BackupFailed": {"Type": "Fail", "ErrorPath": "$.failure.error", "CausePath": "$.failure.cause"},
                            }
                        ),
                    }
                )
            ),
        },
    )
    # Features moto's parser rejects, which must stay out of the definition.
    definition = json.dumps(template.to_json())
    for unsupported in ("ItemBatcher", "WriterConfig", "JSONL"):
        assert unsupported not in definition


def test_outputs_name_what_braid_init_needs(template: Template) -> None:
    outputs = template.to_json()["Outputs"]
    for name in ("RepositoryBucket", "RepositoryUrl", "DataKeyArn", "BackupStateMachineArn", "AgentPolicyArn", "AgentRoleArn", "RestoreRoleArn",
                 "OperatorRoleArn"):
        assert name in outputs
    assert "ObjectLock" not in outputs  # cdk.json configures no Object Lock (tests/infra/test_object_lock.py)


def test_database_hosts_get_the_agent_role_by_instance_profile(template: Template) -> None:
    """EC2 hosts take a role only through an instance profile: one for the agent, one for restore."""
    resources = template.to_json()["Resources"]
    roles = {name: logical for logical, body in resources.items() if body["Type"] == "AWS::IAM::Role"
             for name in ("AgentRole", "RestoreRole") if logical.startswith(f"Access{name}")}
    profiles = {logical: body["Properties"]["Roles"] for logical, body in resources.items() if body["Type"] == "AWS::IAM::InstanceProfile"}
    assert sorted(profiles.values(), key=str) == sorted([[{"Ref": roles["AgentRole"]}], [{"Ref": roles["RestoreRole"]}]], key=str)
    # The agent role's trust lets EC2 assume it, which an instance profile needs.
    trust = resources[roles["AgentRole"]]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert any("ec2.amazonaws.com" in json.dumps(statement["Principal"]) for statement in trust)
    outputs = template.to_json()["Outputs"]
    for output, profile in (("AgentInstanceProfileName", "AgentRole"), ("RestoreInstanceProfileName", "RestoreRole")):
        (logical,) = [k for k, roles_ in profiles.items() if roles_ == [{"Ref": roles[profile]}]]
        assert outputs[output]["Value"] == {"Ref": logical}


def test_cdk_nag_is_enforced_not_silenced(tmp_path: Path) -> None:
    """A finding nobody acknowledged must fail synth (so the clean synth above means something)."""
    app = cdk.App(context=cdk_context(), outdir=str(tmp_path))
    stack = cdk.Stack(app, "Probe")
    role = iam.Role(stack, "Wide", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    role.add_to_policy(iam.PolicyStatement(actions=["s3:*"], resources=["*"]))
    add_nag_checks(app)
    with pytest.raises(Exception, match=r"AwsSolutions-IAM5\[Action::s3:\*\]"):
        app.synth()


def test_cfn_lint_accepts_the_template(stack: BraidStack, tmp_path: Path) -> None:
    path = tmp_path / "Braid.template.json"
    path.write_text(json.dumps(Template.from_stack(stack).to_json()))
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "cfn-lint"), "--format", "parseable", str(path)], capture_output=True, text=True)
    # parseable: path:line:col:endline:endcol:RULE:message; W3005 (CDK's explicit DependsOn) is only a warning
    errors = [line for line in done.stdout.splitlines() if line.split(":")[5:6] and line.split(":")[5].startswith("E")]
    assert done.returncode in (0, 4, 8), done.stdout + done.stderr  # 2 = errors; 4 = warnings; 8 = informational
    assert not errors, done.stdout


def test_schedule_deletes_no_backup_until_a_policy_is_configured(template: Template) -> None:
    """cdk.json sets no `braid:retention`: the daily event carries no keep rule (tests/infra/test_retention_schedule.py)."""
    scheduled = [r for r in template.find_resources("AWS::Events::Rule").values() if "ScheduleExpression" in r["Properties"]]
    inputs = [json.loads(t["Input"]) for r in scheduled for t in r["Properties"]["Targets"]]
    assert inputs and all(not any(k.startswith("keep_") for k in event) for event in inputs)
    # It applies the policies stored in the repository instead: the prune planner reads them, and never writes them.
    reads = json.dumps([s for s in statements_of(template, "FunctionsPruneRole") if "s3:GetObject" in actions([s])])
    writes = json.dumps([s for s in statements_of(template, "FunctionsPruneRole") if set(actions([s])) & {"s3:PutObject", "s3:DeleteObject"}])
    assert "/policies/*" in reads and "/policies/" not in writes


def _paths(node: Any) -> list[str]:
    """Every string of a definition (keys and values) that names a path in the state's $.plan."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _paths(k) + _paths(v)]
    if isinstance(node, list):
        return [p for v in node for p in _paths(v)]
    return re.findall(r"\$\.plan\.([A-Za-z_]+)", node) if isinstance(node, str) else []


def test_every_plan_key_the_state_machine_reads_is_a_contract_name(template: Template) -> None:
    definition = json.loads(Placeholders().render(backup_machine(template)["Properties"]["DefinitionString"]))
    read = _paths(definition)
    assert {"status", "items_object", "max_concurrency", "wait_seconds", "wake_object"} <= set(read)
    assert set(read) <= {str(key) for key in contract.PlanKey}, set(read) - {str(key) for key in contract.PlanKey}
    statuses = {c["StringEquals"] for c in _conditions(definition) if c.get("Variable") == contract.plan_path(contract.PlanKey.STATUS)}
    assert statuses and statuses <= {str(state) for state in contract.PlanState}
    # Nothing tells a hold by comparing ids any more.
    assert "States.UUID" not in json.dumps(definition) and "hold_id" not in json.dumps(definition)


def _conditions(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        own = [node] if "Variable" in node else []
        return own + [c for v in node.values() for c in _conditions(v)]
    if isinstance(node, list):
        return [c for v in node for c in _conditions(v)]
    return []


def _state(template: Template, name: str) -> dict[str, Any]:
    machine = backup_machine(template)
    definition = json.loads(Placeholders().render(machine["Properties"]["DefinitionString"]))
    found: list[dict[str, Any]] = []

    def walk(states: dict[str, Any]) -> None:
        for state_name, state in states.items():
            if state_name == name:
                found.append(state)
            if "ItemProcessor" in state:
                walk(state["ItemProcessor"]["States"])

    walk(definition["States"])
    (state,) = found
    return state


def _function(template: Template, description: str) -> dict[str, Any]:
    (found,) = [f["Properties"] for f in resources_of(template.to_json(), "AWS::Lambda::Function").values() if description in f["Properties"]["Description"]]
    return found


def test_every_worker_attempt_and_its_backoff_fit_the_express_child(template: Template) -> None:
    # An EXPRESS child ends at 5 minutes: a worker timing out on every attempt must still
    # fail its item inside the child (so the map sees the item's error), with >= 3 attempts.
    # A throttled invoke runs nothing: it adds only its backoffs.
    throttled, retry = _state(template, "Worker")["Retry"]
    timeout = _function(template, "Braid Worker")["Timeout"]
    attempts = 1 + retry["MaxAttempts"]

    def backoffs(r: dict[str, Any]) -> float:
        return sum(min(r["IntervalSeconds"] * r["BackoffRate"] ** n, r["MaxDelaySeconds"]) for n in range(r["MaxAttempts"]))

    assert attempts >= 3 and throttled["ErrorEquals"] == [contract.LAMBDA_THROTTLED] and throttled["MaxAttempts"] >= 6
    # Each attempt may first spend Lambda's INIT (up to 10 s, outside the function's timeout: review 3, L6).
    worst = attempts * (timeout + contract.LAMBDA_INIT_SECONDS) + backoffs(retry) + backoffs(throttled)
    # 300 s less a 30 s margin for scheduling (review 3, L6): 3 x (55 + 10) + 6 + 62 = 263 s.
    assert contract.EXPRESS_CHILD_SECONDS == 300 and worst <= 270, (attempts, timeout, backoffs(retry), backoffs(throttled))
    assert backoffs(throttled) >= 60  # a minute of throttling ridden out before the item fails
    assert "Sandbox.Timedout" in retry["ErrorEquals"] and contract.LAMBDA_THROTTLED not in retry["ErrorEquals"]
    # A coordinating step rides out a minute or more of throttling.
    plan_throttled = _state(template, "PlanSegments")["Retry"][0]
    assert plan_throttled["ErrorEquals"] == [contract.LAMBDA_THROTTLED] and backoffs(plan_throttled) >= 120


def test_the_planners_watch_is_half_its_timeout(template: Template) -> None:
    from braid.pipeline.pacing import DEADLINE_MARGIN_SECONDS, WATCH_SECONDS

    timeout = _function(template, "Braid Plan")["Timeout"]
    assert (WATCH_SECONDS + DEADLINE_MARGIN_SECONDS) * 2 <= timeout <= 900


def test_reserved_concurrency_is_opt_in_and_the_map_is_clamped_to_the_budget(template: Template) -> None:
    from braid import contract
    from braid_infra.stack import worker_reservation

    worker = _function(template, "Braid Worker")
    assert "ReservedConcurrentExecutions" not in worker  # never a deploy blocker on an account with a low quota
    assert (worker_reservation(None), worker_reservation(""), worker_reservation("300"), worker_reservation(800)) == (None, None, 300, 800)
    for wrong in ("many", 0, True):
        with pytest.raises(ValueError, match="braid:worker-concurrency must be"):
            worker_reservation(wrong)
    plan = _function(template, "Braid Plan")
    assert plan["Environment"]["Variables"][contract.ENV_WORKER_CONCURRENCY] == str(contract.DEFAULT_WORKER_CONCURRENCY)
    # The map runs what PlanSegments returns: the input's --fan-out, clamped to the reservation (functions/plan/app.py).
    assert _state(template, "ProcessChunks")["MaxConcurrencyPath"] == "$.plan.max_concurrency"
    assert _state(template, "ProcessChunks")["ToleratedFailureCount"] == 10_000  # failed items are planned again, not fatal


def test_every_round_is_a_distributed_map_and_nothing_warms_finalize(template: Template) -> None:
    # The inline final round and WarmFinalize saved 0.3 s and 1.3 s after stream end at the published network rate, under
    # the 2 s a mechanism must pay (docs/design/2026-11-28-optimisations.md): SegmentsReady? sends every round to the map.
    # A failed child's place in the map's output is {} (OutputPath null): ItemFailed.
    worker = _state(template, "Worker")
    assert worker["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": None, "Next": "ItemFailed"}]
    assert {k: v for k, v in _state(template, "ItemFailed").items() if k != "Comment"} == {"Type": "Pass", "OutputPath": None, "End": True}
    choices = _state(template, "SegmentsReady?")["Choices"]
    assert choices[0] == {"Variable": "$.plan.status", "StringEquals": "ready", "Next": "ProcessChunks"}
    states = json.loads(Placeholders().render(backup_machine(template)["Properties"]["DefinitionString"]))["States"]
    assert not {"WarmFinalize", "FinalRoundInline?", "ProcessFinalRound"} & set(states), sorted(states)


def _prune_definition(template: Template) -> dict[str, Any]:
    (machine,) = [r for lid, r in resources_of(template.to_json(), "AWS::StepFunctions::StateMachine").items() if lid.startswith("PrunePipeline")]
    assert machine["Properties"]["StateMachineType"] == "STANDARD"
    definition: dict[str, Any] = json.loads(Placeholders().render(machine["Properties"]["DefinitionString"]))
    return definition


def test_the_prune_is_its_own_fan_out_manifests_first(template: Template) -> None:
    """Plan (manifests removed there) -> a Distributed Map of EXPRESS sweep children -> Tally; any step failing ends it failed."""
    definition = _prune_definition(template)
    states = definition["States"]
    assert definition["StartAt"] == "Identify" and states["Identify"]["Next"] == "PlanPrune"
    assert states["PlanPrune"]["Next"] == "AnythingToSweep?"
    choice = states["AnythingToSweep?"]
    assert choice["Choices"][0]["Next"] == "Sweep" and choice["Default"] == "TallyPrune"
    sweep = states["Sweep"]
    assert sweep["ItemProcessor"]["ProcessorConfig"] == {"Mode": "DISTRIBUTED", "ExecutionType": "EXPRESS"}
    assert sweep["ItemReader"]["Parameters"]["Key.$"] == "$.plan.items_object" and sweep["MaxConcurrencyPath"] == "$.plan.max_concurrency"
    assert sweep["ToleratedFailurePercentage"] == 100  # a failed item's data has no manifest: the next run collects it
    assert sweep["Next"] == "TallyPrune" and states["TallyPrune"]["Next"] == "PruneDone"
    for step in ("PlanPrune", "Sweep", "TallyPrune"):
        assert [c["Next"] for c in states[step]["Catch"]] == ["PruneFailed"]
    assert states["PruneFailed"]["Type"] == "Fail"


def test_every_sweep_attempt_and_its_backoff_fit_the_express_child(template: Template) -> None:
    (retry,) = _prune_definition(template)["States"]["Sweep"]["ItemProcessor"]["States"]["SweepItem"]["Retry"]
    timeout = _function(template, "Braid Sweep")["Timeout"]
    attempts = 1 + retry["MaxAttempts"]
    backoff = sum(min(retry["IntervalSeconds"] * retry["BackoffRate"] ** n, retry["MaxDelaySeconds"]) for n in range(retry["MaxAttempts"]))
    # Each attempt may start a new environment whose Init (up to 10 s) runs outside the timeout (review 3, L6).
    assert attempts >= 3 and attempts * (timeout + contract.LAMBDA_INIT_SECONDS) + backoff <= contract.EXPRESS_CHILD_SECONDS - 20, (attempts, timeout, backoff)
    assert {"StorageError", "Sandbox.Timedout"} <= set(retry["ErrorEquals"])


def test_the_maintenance_may_start_the_prune_and_nothing_else(template: Template) -> None:
    from braid import contract

    (prune_id,) = [lid for lid in resources_of(template.to_json(), "AWS::StepFunctions::StateMachine") if lid.startswith("PrunePipeline")]
    states = [s for s in statements_of(template, "FunctionsVerifyRole") if any(a.startswith("states:") for a in actions([s]))]
    assert [(actions([s]), s["Resource"]) for s in states] == [({"states:StartExecution"}, {"Ref": prune_id})]
    verify = _function(template, "Braid scheduled maintenance: starts the prune run")
    assert verify["Environment"]["Variables"][contract.ENV_PRUNE_STATE_MACHINE] == {"Ref": prune_id}
    # No other function may start anything.
    for lid in resources_of(template.to_json(), "AWS::IAM::Role"):
        if lid.startswith("Functions") and not lid.startswith("FunctionsVerifyRole"):
            assert not [s for s in statements_of(template, lid) if "states:StartExecution" in actions([s])], lid


def test_a_sleeping_planner_waits_for_the_agents_wake_or_its_timeout(template: Template) -> None:
    """PlanSegments says "sleeping" when the next round is far off (braid.pipeline.pacing.sleep_plan): no Lambda watches.
    SleepUntilWoken writes the wake record (braid.format.staging.wake) with its task token and waits for the agent."""
    choices = _state(template, "SegmentsReady?")["Choices"]
    assert {"Variable": "$.plan.status", "StringEquals": "sleeping", "Next": "SleepUntilWoken"} in choices
    sleep = _state(template, "SleepUntilWoken")
    assert sleep["Resource"].endswith(":states:::aws-sdk:s3:putObject.waitForTaskToken")
    parameters = sleep["Parameters"]
    assert parameters["Key.$"] == "$.plan.wake_object"  # the Plan function's full S3 key of this backup's record
    assert parameters["Body.$"] == "States.Format('{} {} {}', $.plan.wake_chunks, $.plan.wake_after_seconds, $$.Task.Token)"
    assert sleep["TimeoutSecondsPath"] == "$.plan.wait_seconds" and sleep["ResultPath"] is None and sleep["Next"] == "PlanSegments"
    # Its timeout is the planner's next look (a wake is never needed for correctness); a failed PUT waits instead.
    assert sleep["Catch"] == [
        {"ErrorEquals": ["States.Timeout"], "ResultPath": None, "Next": "PlanSegments"},
        {"ErrorEquals": ["States.ALL"], "ResultPath": None, "Next": "WaitForSegments"},
    ]
    assert sleep["Retry"][0]["ErrorEquals"] == ["States.TaskFailed"]
    from fnmatch import fnmatchcase

    from braid.format.ids import BackupRef
    from braid.format.staging import WakeRecord, session_key, stream_end_key, wake_key  # the agent reads what the state writes

    # The role's one S3 write (the least-privilege table: s3:PutObject on staging/*/wake) covers the key the Plan function
    # names, and no other staging record: the state machine cannot overwrite what the agent staged.
    (granted,) = [p for a, p in LEAST_PRIVILEGE["PipelineBackupRole"] if a == "s3:PutObject"]
    ref = BackupRef.new("db")
    assert fnmatchcase(wake_key(ref), granted)
    assert not any(fnmatchcase(key, granted) for key in (session_key(ref), stream_end_key(ref), f"{wake_key(ref)}.json"))

    assert WakeRecord.from_bytes(b"130 20 AAAAKgAAAAIAAAAA+token/==", "k") == WakeRecord(130, 20, "AAAAKgAAAAIAAAAA+token/==")


def _refs(node: Any) -> list[str]:
    """Logical ids a CloudFormation value refers to (Ref and Fn::GetAtt)."""
    if isinstance(node, dict):
        found = []
        for key, value in node.items():
            if key == "Ref" and isinstance(value, str):
                found.append(value)
            elif key == "Fn::GetAtt":
                found.append(value[0] if isinstance(value, list) else str(value).split(".")[0])
            else:
                found += _refs(value)
        return found
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def test_state_machines_invoke_published_versions_that_a_deploy_keeps(template: Template) -> None:
    """An execution keeps its definition, so naming versions (not $LATEST) pins a backup to the code it started with."""
    resources = template.to_json()["Resources"]
    machines = {lid: r for lid, r in resources.items() if r["Type"] == "AWS::StepFunctions::StateMachine"}
    assert len(machines) == 3
    for lid, machine in machines.items():
        kinds = {ref: resources[ref]["Type"] for ref in _refs(machine["Properties"]["DefinitionString"]) if ref in resources}
        assert "AWS::Lambda::Function" not in kinds.values(), (lid, kinds)
        assert "AWS::Lambda::Version" in kinds.values(), lid
    versions = [r for r in resources.values() if r["Type"] == "AWS::Lambda::Version"]
    assert versions and all(v.get("DeletionPolicy") == "Retain" and v.get("UpdateReplacePolicy") == "Retain" for v in versions)


def test_the_scale_models_throttle_ride_out_is_the_workers_throttle_retry() -> None:
    """scripts/bench_lib/account_model.py holds a backup whose items stay throttled longer than this retry rides out."""
    from braid_infra.steps import WORKER_THROTTLE_RETRY as retry

    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    from bench_lib.account_model import THROTTLE_RIDE_OUT_SECONDS

    waits = [min(retry.interval.to_seconds() * retry.backoff_rate**n, retry.max_delay.to_seconds()) for n in range(retry.max_attempts)]
    assert sum(waits) == THROTTLE_RIDE_OUT_SECONDS


def test_state_machine_log_groups_are_named_under_vendedlogs(template: Template) -> None:
    """Review 3, L3: a group outside /aws/vendedlogs/ adds to the account's one CloudWatch Logs resource policy (5,120 characters)."""
    machines = resources_of(template.to_json(), "AWS::StepFunctions::StateMachine")
    groups = resources_of(template.to_json(), "AWS::Logs::LogGroup")
    named = set()
    for machine in machines.values():
        (destination,) = machine["Properties"]["LoggingConfiguration"]["Destinations"]
        group_id = destination["CloudWatchLogsLogGroup"]["LogGroupArn"]["Fn::GetAtt"][0]
        named.add(groups[group_id]["Properties"]["LogGroupName"])
    assert named == {"/aws/vendedlogs/states/Braid-Backup", "/aws/vendedlogs/states/Braid-Prune", "/aws/vendedlogs/states/Braid-Verify"}


def test_a_backup_execution_that_times_out_is_sent_to_cleanup(template: Template) -> None:
    """Review 3, M4: an execution past its TimeoutSeconds runs no Catch; Step Functions' status change event for
    the backup machine's TIMED_OUT executions (and nothing else) invokes the published Cleanup version."""
    rules = resources_of(template.to_json(), "AWS::Events::Rule")
    (rule,) = [r["Properties"] for lid, r in rules.items() if lid.startswith("TimedOutCleanup")]
    machine_id = next(lid for lid in resources_of(template.to_json(), "AWS::StepFunctions::StateMachine") if lid.startswith("Pipeline"))
    assert rule["EventPattern"] == {
        "source": ["aws.states"],
        "detail-type": ["Step Functions Execution Status Change"],
        "detail": {"status": ["TIMED_OUT"], "stateMachineArn": [{"Ref": machine_id}]},
    }
    (target,) = rule["Targets"]
    cleanup_version = target["Arn"]["Ref"]
    assert cleanup_version.startswith("FunctionsCleanupCurrentVersion") and "Input" not in target and "InputTransformer" not in target
    permissions = [p["Properties"] for p in resources_of(template.to_json(), "AWS::Lambda::Permission").values()]
    assert {"Action": "lambda:InvokeFunction", "FunctionName": {"Ref": cleanup_version}, "Principal": "events.amazonaws.com",
            "SourceArn": {"Fn::GetAtt": [next(lid for lid in rules if lid.startswith("TimedOutCleanup")), "Arn"]}} in permissions
