"""A cloud repository's configuration, read from the deployed stack's outputs.

`braid init --repo s3://BUCKET/PREFIX --stack NAME` reads the outputs once
and writes them into the repository's config.json, so afterwards the agent
needs only `--repo` (or BRAID_REPO): no hand-copied ARNs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from braid.adapters.aws.clients import cloudformation_client
from braid.adapters.aws.errors import AwsCall, aws_error
from braid.adapters.aws.s3 import S3Store
from braid.contract import OUTPUT_BUCKET, OUTPUT_KEY, OUTPUT_OBJECT_LOCK, OUTPUT_REPOSITORY, OUTPUT_STATE_MACHINE, OUTPUT_VERIFY_STATE_MACHINE
from braid.errors import BackupError, RepositoryError, UsageError
from braid.format.lock import ObjectLock
from braid.format.repository import RepositoryConfig

VERIFY_STATE_MACHINE_SETTING = "verify_state_machine_arn"  # the repository config's cloud setting

if TYPE_CHECKING:  # the stubs are a development dependency: the Lambda layer does not ship them
    from types_boto3_cloudformation.client import CloudFormationClient


def stack_outputs(stack: str, client: CloudFormationClient | None = None) -> dict[str, str]:
    client = client or cloudformation_client()

    def specific(code: str, message: str) -> BackupError | None:
        # CloudFormation answers a missing stack with ValidationError ("Stack with id X does not exist").
        return RepositoryError(f"cannot read stack {stack!r}: {message}") if code == "ValidationError" else None

    try:
        stacks = client.describe_stacks(StackName=stack)["Stacks"]
    except (ClientError, BotoCoreError) as exc:
        raise aws_error(exc, AwsCall("CloudFormation", f"reading stack {stack!r}", "cloudformation:DescribeStacks"), RepositoryError, specific) from None
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def config_from_outputs(stack: str, outputs: dict[str, str], store: S3Store, created: str, region: str | None) -> RepositoryConfig:
    missing = [k for k in (OUTPUT_BUCKET, OUTPUT_KEY, OUTPUT_STATE_MACHINE) if k not in outputs]
    if missing:
        raise RepositoryError(f"stack {stack!r} has no output(s) {', '.join(missing)}: is it a Braid stack?")
    if outputs[OUTPUT_BUCKET] != store.bucket:
        raise UsageError(f"stack {stack!r} serves bucket {outputs[OUTPUT_BUCKET]}, not {store.bucket}: use --repo s3://{outputs[OUTPUT_BUCKET]}/PREFIX")
    served = outputs.get(OUTPUT_REPOSITORY)
    if served is not None and served.rstrip("/") != store.url.rstrip("/"):
        # The stack's roles are scoped to its repository prefix: any other
        # prefix would fail later, half-way through a backup, on AccessDenied.
        raise UsageError(f"stack {stack!r} serves the repository {served}, not {store.url}: use --repo {served}")
    # The bucket is not recorded: the config lives in it.
    cloud = {"stack": stack, "state_machine_arn": outputs[OUTPUT_STATE_MACHINE]}
    if outputs.get(OUTPUT_VERIFY_STATE_MACHINE):  # stacks from before the cloud verify have none: verify then runs on the host
        cloud[VERIFY_STATE_MACHINE_SETTING] = outputs[OUTPUT_VERIFY_STATE_MACHINE]
    if region:
        cloud["region"] = region
    # The bucket's retention, so hosts writing here (rekey, --engine local) and prune apply it too.
    lock = ObjectLock.parse(outputs[OUTPUT_OBJECT_LOCK]) if outputs.get(OUTPUT_OBJECT_LOCK) else None
    return RepositoryConfig.new({"type": "kms", "key_id": outputs[OUTPUT_KEY]}, created, cloud, object_lock=lock)


def config_from_stack(stack: str, store: S3Store, created: str) -> RepositoryConfig:
    client = cloudformation_client()
    return config_from_outputs(stack, stack_outputs(stack, client), store, created, client.meta.region_name)
