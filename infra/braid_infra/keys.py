"""Keys: the customer-managed KMS key that wraps every backup's data key.

The key policy does not delegate use to IAM (no root `kms:*`): the account
can administer the key, but only the roles named here can use it. Prepare
may generate data keys; only the roles that must read chunks (worker,
finalize, verify, restore) may decrypt; and every use must carry the Braid
encryption context (`braid:backup`), so CloudTrail names the backup.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

ADMIN_ACTIONS = [
    "kms:Create*",
    "kms:Describe*",
    "kms:Enable*",
    "kms:List*",
    "kms:Put*",
    "kms:Update*",
    "kms:Revoke*",
    "kms:Disable*",
    "kms:Get*",
    "kms:Delete*",
    "kms:TagResource",
    "kms:UntagResource",
    "kms:ScheduleKeyDeletion",
    "kms:CancelKeyDeletion",
    "kms:RotateKeyOnDemand",
]
CONTEXT_CONDITION = {"Null": {"kms:EncryptionContext:braid:backup": "false"}}


class Keys(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, alias: str) -> None:
        super().__init__(scope, construct_id)
        admin = iam.PolicyStatement(
            sid="KeyAdministration",
            principals=[iam.AccountRootPrincipal()],
            actions=ADMIN_ACTIONS,
            resources=["*"],
        )
        self.key = kms.Key(
            self,
            "DataKeys",
            description="Braid: wraps per-backup data keys (envelope encryption of backup chunks)",
            alias=alias,
            enable_key_rotation=True,
            pending_window=Duration.days(30),
            policy=iam.PolicyDocument(statements=[admin]),
            removal_policy=RemovalPolicy.RETAIN,
        )

    def allow_generate(self, role: iam.IRole) -> None:
        """Backup side: make data keys for a named backup (and nothing else)."""
        self._allow("GenerateDataKeys", role, ["kms:GenerateDataKey"])

    def allow_decrypt(self, role: iam.IRole) -> None:
        """Read side: unwrap a named backup's data key."""
        self._allow("DecryptDataKeys", role, ["kms:Decrypt"])

    def allow_rekey(self, role: iam.IRole) -> None:
        """`braid rekey` of the stack's key: authenticate a manifest (Decrypt), re-wrap its data key from and to
        this key (ReEncrypt, the key material never leaves KMS), and resolve `--kms-key` to its ARN (DescribeKey,
        which carries no encryption context, so the key policy cannot require one: it is granted by the role's
        own policy, through the administration statement's kms:Describe* for the account). Re-keying to another
        key needs kms:ReEncryptTo, kms:Decrypt and kms:DescribeKey for this role in that key's own policy (docs/cloud.md)."""
        self._allow("RekeyDataKeys", role, ["kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo"])
        role.add_to_principal_policy(iam.PolicyStatement(actions=["kms:DescribeKey"], resources=[self.key.key_arn]))

    def allow_copy_from(self, role: iam.IRole) -> None:
        """The scheduled copy (braid_infra.copy_schedule): authenticate a backup (Decrypt) and re-encrypt its data
        key from this key to the second repository's (ReEncryptFrom; to a key in another region it decrypts)."""
        self._allow("CopyDataKeys", role, ["kms:Decrypt", "kms:ReEncryptFrom"])

    def allow_for_context(self, role: iam.IRole, sid: str, actions: list[str], backup_pattern: str) -> None:
        """`actions` only under encryption contexts whose `braid:backup` matches `backup_pattern` (the WAL worker: `*@wal/*`)."""
        condition = {"StringLike": {"kms:EncryptionContext:braid:backup": backup_pattern}}
        self.key.add_to_resource_policy(
            iam.PolicyStatement(sid=sid, principals=[role], actions=actions, resources=["*"], conditions=condition)
        )
        role.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=[self.key.key_arn], conditions=condition))

    def _allow(self, sid: str, role: iam.IRole, actions: list[str]) -> None:
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid=f"{sid}{role.node.id}" if hasattr(role, "node") else sid,
                principals=[role],
                actions=actions,
                resources=["*"],
                conditions=CONTEXT_CONDITION,
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=actions, resources=[self.key.key_arn], conditions=CONTEXT_CONDITION)
        )
