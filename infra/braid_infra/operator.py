"""Access for the operator: the person who runs `braid init --stack` once and `braid rekey` when keys rotate.

Neither the agent (stages, no key) nor restore (reads, decrypts) may
rewrite anything published, and that is right for hosts that run every
night. Re-wrapping every backup's data key is an operator's occasional
act, so it gets a role of its own that a DBA assumes for the run
(`aws sts assume-role --role-arn <OperatorRoleArn> ...`), holding exactly
what `braid rekey` (braid.ops.rekey) and `braid init --stack` call:

  - read config.json and every manifest; replace a manifest (the bucket
    policy lets a manifest PUT through only with If-Match on the version
    read) and, under Object Lock, give the new version its retention;
  - write, read back and delete its verified copies under rekey/;
  - delete a manifest whose backup a prune took while it was re-wrapped
    (rekey's step 4: the prune's removal is finished, never undone);
  - replace config.json (the key it names), which init also creates;
  - read and replace each archived WAL object and pack, and each timeline
    history file (their wrapped keys are in their heads: braid.ops.wal_rekey;
    the bucket policy lets a PUT under wal/ through only create-only or with
    If-Match on the version read), never an archive's archive.json;
  - list the bucket (manifests, and each backup's chunks, by name only);
  - KMS on the stack's key only, with the Braid encryption context:
    Decrypt (authenticate a manifest), ReEncryptFrom/ReEncryptTo (re-wrap
    inside KMS), DescribeKey (resolve --kms-key);
  - cloudformation:DescribeStacks of this stack (init reads its outputs).

It cannot read or write chunks, staging, the catalog or stored policies.
Re-keying to a key outside the stack needs that key's policy to grant this
role kms:ReEncryptTo, kms:Decrypt and kms:DescribeKey (docs/cloud.md, the operator role).
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from braid_infra.keys import Keys
from braid_infra.storage import CONFIG, MANIFEST_OBJECTS, REKEY_OBJECTS, WAL_FILE_OBJECTS, WAL_HISTORY_OBJECTS, Storage


class OperatorAccess(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, storage: Storage, keys: Keys) -> None:
        super().__init__(scope, construct_id)
        self.role = iam.Role(
            self, "OperatorRole", assumed_by=iam.AccountRootPrincipal(), description="Braid operator: braid init --stack and braid rekey"
        )
        statements = [
            iam.PolicyStatement(
                sid="RewriteManifestsAndConfig",
                actions=["s3:GetObject", "s3:PutObject"],
                resources=[storage.arn(CONFIG), storage.arn(MANIFEST_OBJECTS), storage.arn(REKEY_OBJECTS)],
            ),
            iam.PolicyStatement(
                sid="RewrapWal", actions=["s3:GetObject", "s3:PutObject"], resources=[storage.arn(WAL_FILE_OBJECTS), storage.arn(WAL_HISTORY_OBJECTS)]
            ),
            iam.PolicyStatement(sid="RemoveRekeyCopies", actions=["s3:DeleteObject"], resources=[storage.arn(MANIFEST_OBJECTS), storage.arn(REKEY_OBJECTS)]),
            iam.PolicyStatement(sid="ListRepository", actions=["s3:ListBucket"], resources=[storage.bucket.bucket_arn]),
            iam.PolicyStatement(sid="ReadStackOutputs", actions=["cloudformation:DescribeStacks"], resources=[Stack.of(self).stack_id]),
        ]
        if storage.object_lock is not None:
            statements.append(
                iam.PolicyStatement(
                    sid="RetainManifestsAndWal", actions=["s3:PutObjectRetention"],
                    resources=[storage.arn(MANIFEST_OBJECTS), storage.arn(WAL_FILE_OBJECTS), storage.arn(WAL_HISTORY_OBJECTS)],
                )
            )
            # A rekeyed WAL object's new version keeps the replaced one's date, which HEAD returns only with this.
            statements.append(
                iam.PolicyStatement(
                    sid="ReadWalRetention", actions=["s3:GetObjectRetention"], resources=[storage.arn(WAL_FILE_OBJECTS), storage.arn(WAL_HISTORY_OBJECTS)]
                )
            )
        for statement in statements:
            self.role.add_to_policy(statement)
        keys.allow_rekey(self.role)
