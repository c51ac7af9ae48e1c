"""The cloud engine with its AWS parts: the composition root of the agent's cloud path.

braid.agent takes ports only; this is where they become S3 (the repository's
own store and client, and S3Multipart over them) and Step Functions (the
state machine the repository's config names), all reporting their retries
to the one relay the engine points at each run's progress. `braid backup`
and `braid status` both build the engine here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from braid.adapters.aws.clients import cloudformation_client, process_requests, stepfunctions_client
from braid.adapters.aws.s3 import S3Store
from braid.adapters.aws.s3_multipart import S3Multipart
from braid.adapters.aws.stepfunctions import StepFunctionsExecutions
from braid.agent.cloud_engine import CloudEngine, CloudOptions
from braid.errors import RepositoryError, UsageError
from braid.format.repository import Repository

if TYPE_CHECKING:  # the stubs are a development dependency: the Lambda layer does not ship them
    from types_boto3_stepfunctions.client import SFNClient

    from braid.adapters.aws.verify_runs import CloudVerifier


def cloud_engine(repository: Repository, options: CloudOptions | Any, *, stepfunctions: SFNClient | None = None) -> CloudEngine:
    """The engine for a repository on S3 whose config names a pipeline.

    `options` is CloudOptions, or the CLI's parsed arguments (CloudOptions.from_cli).
    `stepfunctions` replaces the Step Functions client (tests).
    """
    store = repository.store
    if not isinstance(store, S3Store):
        raise UsageError("the cloud engine needs an s3:// repository")
    arn = repository.config.cloud.get("state_machine_arn")
    if not arn:
        raise RepositoryError(f"repository {repository.url} names no pipeline: run 'braid init --repo {repository.url} --stack NAME'")
    if not isinstance(options, CloudOptions):
        options = CloudOptions.from_cli(options)
    light = getattr(store.client, "light", False) is True  # the store's is the agent's light client (LightS3.light): so is this one
    client = stepfunctions or stepfunctions_client(region=repository.config.cloud.get("region"), on_retry=store.retries, light=light)
    return CloudEngine(
        repository,
        options,
        uploads=S3Multipart(store),
        executions=StepFunctionsExecutions(client, str(arn)),
        prefix=store.prefix,
        retries=store.retries,
        requests=process_requests,
    )


def cloud_verifier(repository: Repository, *, stepfunctions: SFNClient | None = None) -> CloudVerifier | None:
    """The stack's verify state machine for an s3:// repository, or None when it has none (verify on this host).

    Its ARN is in the repository's config when `braid init --stack` ran on
    a stack that has one; a repository initialised before that names the
    stack, whose outputs are then read.
    """
    from braid.adapters.aws.stack_outputs import VERIFY_STATE_MACHINE_SETTING, stack_outputs  # verify's: not a backup's
    from braid.adapters.aws.verify_runs import CloudVerifier
    from braid.contract import OUTPUT_VERIFY_STATE_MACHINE

    store = repository.store
    if not isinstance(store, S3Store):
        return None
    cloud = repository.config.cloud
    arn = cloud.get(VERIFY_STATE_MACHINE_SETTING)
    if not arn and cloud.get("stack"):
        arn = stack_outputs(str(cloud["stack"]), cloudformation_client(region=cloud.get("region"))).get(OUTPUT_VERIFY_STATE_MACHINE)
    if not arn:
        return None
    client = stepfunctions or stepfunctions_client(region=cloud.get("region"), on_retry=store.retries)
    return CloudVerifier(client, str(arn))
