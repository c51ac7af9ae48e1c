"""Access for hosts: the agent (backup side) and restore.

The agent stages raw parts and starts and follows executions; it holds no
key material and gets no KMS permission at all. It may write only under
staging/, and read only the repository config, manifests and staging.
Restore reads everything and may decrypt data keys; it is the only role
outside the pipeline that the key policy lets decrypt.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from braid_infra.keys import Keys
from braid_infra.storage import CONFIG, DATA_OBJECTS, MANIFEST_OBJECTS, STAGING_OBJECTS, Storage


def host_principal() -> iam.IPrincipal:
    """EC2 database hosts by instance profile; anyone the account allows to assume it (on-premises hosts)."""
    return iam.CompositePrincipal(iam.ServicePrincipal("ec2.amazonaws.com"), iam.AccountRootPrincipal())


class HostAccess(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, storage: Storage, keys: Keys, state_machine: sfn.StateMachine) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        executions = stack.format_arn(
            service="states",
            resource="execution",
            resource_name=f"{state_machine.state_machine_name}:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self.agent_policy = iam.ManagedPolicy(
            self,
            "AgentPolicy",
            description="Braid agent: stage backups and run their pipeline; no KMS, no reads of backup data",
            statements=[
                iam.PolicyStatement(
                    sid="StageBackups",
                    actions=["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
                    resources=[storage.arn(STAGING_OBJECTS)],
                ),
                iam.PolicyStatement(
                    sid="ReadRepositoryState",
                    actions=["s3:GetObject"],
                    resources=[storage.arn(CONFIG), storage.arn(MANIFEST_OBJECTS), storage.arn(STAGING_OBJECTS)],
                ),
                iam.PolicyStatement(
                    sid="ListRepository",
                    actions=["s3:ListBucket", "s3:ListBucketMultipartUploads"],
                    resources=[storage.bucket.bucket_arn],
                ),
                iam.PolicyStatement(sid="StartBackups", actions=["states:StartExecution"], resources=[state_machine.state_machine_arn]),
                iam.PolicyStatement(sid="FollowBackups", actions=["states:DescribeExecution"], resources=[executions]),
            ],
        )
        self.agent_role = iam.Role(
            self, "AgentRole", assumed_by=host_principal(), managed_policies=[self.agent_policy], description="Braid agent on database hosts"
        )
        # EC2 database hosts get the agent role through an instance profile
        # (`aws ec2 associate-iam-instance-profile`); restore hosts through theirs.
        self.agent_instance_profile = iam.InstanceProfile(self, "AgentInstanceProfile", role=self.agent_role)
        self.restore_role = iam.Role(self, "RestoreRole", assumed_by=host_principal(), description="Braid restore and verify from hosts")
        self.restore_role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"], resources=[storage.arn(CONFIG), storage.arn(MANIFEST_OBJECTS), storage.arn(DATA_OBJECTS)]
            )
        )
        self.restore_role.add_to_policy(iam.PolicyStatement(actions=["s3:ListBucket"], resources=[storage.bucket.bucket_arn]))
        keys.allow_decrypt(self.restore_role)
        self.restore_instance_profile = iam.InstanceProfile(self, "RestoreInstanceProfile", role=self.restore_role)

