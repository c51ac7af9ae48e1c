"""Access for hosts: the agent (backup side) and restore.

The agent stages raw parts and starts and follows executions; it holds no
key material and gets no KMS permission at all. It may write only under
staging/, and read only the repository config, manifests and staging.
Restore reads everything and may decrypt data keys; it is the only role
outside the pipeline that the key policy lets decrypt.

Staging holds raw database bytes, so a host may write and read only the
staging of the backup name it is tagged with: every staging grant that
touches bytes is scoped to `staging/${aws:PrincipalTag/braid-name}/*`.
One host cannot overwrite, read, or abort the uploads of another name's
backup. Across names it may read only the small records `braid list
--incomplete` shows (session.json, stream-end.json, the agent's lease) and
list key names.

How a host gets its tag (`braid-name` = the `--name` it backs up):
  - an EC2 instance (or any host with a role of its own): tag that role
    `braid-name=NAME` and attach the stack's AgentPolicy (output
    AgentPolicyArn); a role's tags are the principal tags of its sessions;
  - a host that assumes the stack's AgentRole passes the tag as a session
    tag: `aws sts assume-role --role-arn <AgentRoleArn> --role-session-name
    HOST --tags Key=braid-name,Value=NAME`. The role's trust lets a
    principal of the account pass only the `braid-name` it is tagged with
    itself (aws:RequestTag equal to its aws:PrincipalTag, and no other tag
    key), so a host cannot name itself after another host's backups: the
    caller's own tag, which only an IAM administrator sets, decides.
A principal without the tag can stage nothing: IAM matches no resource for
a policy variable whose key is missing (an instance given the stack's
AgentInstanceProfile, whose role is untagged, can only follow backups;
each EC2 host gets a role of its own, tagged, with the AgentPolicy).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from braid.format import layout
from braid.format.staging import keys as staging_keys
from braid_infra.keys import Keys
from braid_infra.storage import CATALOG_OBJECTS, CONFIG, DATA_OBJECTS, MANIFEST_OBJECTS, PRICES, VERIFY_OBJECTS, Storage

# The principal tag naming the one backup name a host may stage.
HOST_TAG = "braid-name"
# The staging of the tagged name only (an IAM policy variable, resolved per request).
OWN_STAGING = f"{layout.STAGING}${{aws:PrincipalTag/{HOST_TAG}}}/*"
# `wal-push` with the stack: the raw WAL of the tagged name only (braid.ops.wal_stage), and its archive's
# objects, read for the duplicate check (their SHA-256 metadata, archive.json); no key, so no bytes of WAL.
OWN_WAL_STAGING = f"{layout.WAL_STAGING}${{aws:PrincipalTag/{HOST_TAG}}}/*"
OWN_WAL = f"{layout.WAL}${{aws:PrincipalTag/{HOST_TAG}}}/*"
# What `braid list --incomplete` reads of every backup in staging: small records, no bytes.
STAGING_RECORDS = tuple(
    f"{layout.STAGING}*/*/{name}" for name in (staging_keys.SESSION, staging_keys.STREAM_END, staging_keys.AGENT_LEASE)
)


# What the AgentRole's trust requires of a session's tags: the caller's own braid-name, and no other key.
OWN_TAG_ONLY = {
    "StringEquals": {f"aws:RequestTag/{HOST_TAG}": f"${{aws:PrincipalTag/{HOST_TAG}}}"},
    "ForAllValues:StringEquals": {"aws:TagKeys": [HOST_TAG]},
}


def host_principal(*, session_tags: bool = False) -> iam.IPrincipal:
    """EC2 database hosts by instance profile; anyone the account allows to assume it (on-premises hosts).

    With `session_tags` (the agent's role), an account principal must pass its own `braid-name` as the
    session's (OWN_TAG_ONLY): the session tag decides which staging the session may touch, so a caller
    choosing it freely could stage as any name (review 3, M2)."""
    account: iam.IPrincipal = iam.AccountRootPrincipal()
    if session_tags:
        account = account.with_session_tags().with_conditions(OWN_TAG_ONLY)
    return iam.CompositePrincipal(iam.ServicePrincipal("ec2.amazonaws.com"), account)


class HostAccess(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        storage: Storage,
        keys: Keys,
        state_machine: sfn.StateMachine,
        verify_state_machine: sfn.StateMachine | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)

        def executions_of(machine: sfn.StateMachine) -> str:
            return stack.format_arn(
                service="states", resource="execution", resource_name=f"{machine.state_machine_name}:*", arn_format=ArnFormat.COLON_RESOURCE_NAME
            )

        executions = executions_of(state_machine)
        # `braid verify` on an s3:// repository starts the verify state machine and follows it (the host reads
        # no chunk); `list` and `show` read the verify records.
        verifying = (
            [
                iam.PolicyStatement(sid="StartVerify", actions=["states:StartExecution"], resources=[verify_state_machine.state_machine_arn]),
                iam.PolicyStatement(sid="FollowVerify", actions=["states:DescribeExecution"], resources=[executions_of(verify_state_machine)]),
            ]
            if verify_state_machine is not None
            else []
        )
        self.agent_policy = iam.ManagedPolicy(
            self,
            "AgentPolicy",
            description="Braid agent: stage backups and run their pipeline; no KMS, no reads of backup data",
            statements=[
                iam.PolicyStatement(
                    sid="StageOwnBackups",
                    actions=["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts", "s3:GetObject"],
                    resources=[storage.arn(OWN_STAGING)],
                ),
                iam.PolicyStatement(sid="StageOwnWal", actions=["s3:PutObject", "s3:GetObject"], resources=[storage.arn(OWN_WAL_STAGING)]),
                iam.PolicyStatement(sid="CheckOwnWal", actions=["s3:GetObject"], resources=[storage.arn(OWN_WAL)]),
                iam.PolicyStatement(
                    sid="ReadRepositoryState",
                    actions=["s3:GetObject"],
                    resources=[
                        storage.arn(CONFIG),
                        storage.arn(MANIFEST_OBJECTS),
                        *(storage.arn(r) for r in STAGING_RECORDS),
                        storage.arn(CATALOG_OBJECTS),
                        storage.arn(PRICES),
                        storage.arn(VERIFY_OBJECTS),
                    ],
                ),
                iam.PolicyStatement(
                    sid="ListRepository",
                    actions=["s3:ListBucket", "s3:ListBucketMultipartUploads"],
                    resources=[storage.bucket.bucket_arn],
                ),
                iam.PolicyStatement(sid="StartBackups", actions=["states:StartExecution"], resources=[state_machine.state_machine_arn]),
                iam.PolicyStatement(sid="FollowBackups", actions=["states:DescribeExecution"], resources=[executions]),
                # The agent wakes its sleeping backup pipeline with the task token the pipeline left in the backup's
                # staging (braid.format.staging.wake). A callback names no resource, only its token, so AWS allows
                # no narrower Resource; the token is a secret the host reads from its own staging alone, and the
                # state discards what is sent, so a wake can only make the planner look sooner.
                iam.PolicyStatement(sid="WakeBackups", actions=["states:SendTaskSuccess"], resources=["*"]),
                *verifying,
            ],
        )
        self.agent_role = iam.Role(
            self, "AgentRole", assumed_by=host_principal(session_tags=True), managed_policies=[self.agent_policy], description="Braid agent on database hosts"
        )
        # EC2 database hosts get the agent role through an instance profile
        # (`aws ec2 associate-iam-instance-profile`); restore hosts through theirs.
        self.agent_instance_profile = iam.InstanceProfile(self, "AgentInstanceProfile", role=self.agent_role)
        self.restore_role = iam.Role(self, "RestoreRole", assumed_by=host_principal(), description="Braid restore and verify from hosts")
        self.restore_role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[
                    storage.arn(CONFIG),
                    storage.arn(MANIFEST_OBJECTS),
                    storage.arn(DATA_OBJECTS),
                    storage.arn(CATALOG_OBJECTS),
                    storage.arn(PRICES),
                    storage.arn(VERIFY_OBJECTS),
                    # wal-fetch (restore_command): archived WAL, and a file the WAL worker has not stored yet.
                    storage.arn(f"{layout.WAL}*"),
                    storage.arn(f"{layout.WAL_STAGING}*"),
                ],
            )
        )
        # `braid verify --engine local` records its result beside the backup (create-only, as every record).
        self.restore_role.add_to_policy(iam.PolicyStatement(actions=["s3:PutObject"], resources=[storage.arn(VERIFY_OBJECTS)]))
        for statement in verifying:
            self.restore_role.add_to_policy(statement)
        self.restore_role.add_to_policy(iam.PolicyStatement(actions=["s3:ListBucket"], resources=[storage.bucket.bucket_arn]))
        keys.allow_decrypt(self.restore_role)
        self.restore_instance_profile = iam.InstanceProfile(self, "RestoreInstanceProfile", role=self.restore_role)

