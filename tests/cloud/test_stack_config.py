"""`braid init --stack`: the repository config comes from the stack's outputs, checked."""

from __future__ import annotations

import pytest

from braid.adapters.aws.s3 import S3Store
from braid.adapters.aws.stack_outputs import config_from_outputs
from braid.errors import RepositoryError, UsageError

OUTPUTS = {
    "RepositoryBucket": "braid-repo",
    "RepositoryUrl": "s3://braid-repo/prod",
    "DataKeyArn": "arn:aws:kms:eu-west-1:111122223333:key/1234",
    "BackupStateMachineArn": "arn:aws:states:eu-west-1:111122223333:stateMachine:Braid-Backup",
}


def store(bucket: str, prefix: str) -> S3Store:
    return S3Store(client=None, bucket=bucket, prefix=prefix)


def test_config_names_the_key_and_pipeline_of_the_stack() -> None:
    config = config_from_outputs("Braid", OUTPUTS, store("braid-repo", "prod"), "2026-11-23T00:00:00Z", "eu-west-1")
    assert config.key == {"type": "kms", "key_id": OUTPUTS["DataKeyArn"]}
    assert config.cloud == {
        "stack": "Braid",
        "state_machine_arn": OUTPUTS["BackupStateMachineArn"],
        "region": "eu-west-1",
    }


@pytest.mark.parametrize(
    "bucket,prefix,needle",
    [("other-bucket", "prod", "serves bucket braid-repo"), ("braid-repo", "test", "serves the repository s3://braid-repo/prod")],
)
def test_a_repository_the_stack_does_not_serve_is_refused(bucket: str, prefix: str, needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        config_from_outputs("Braid", OUTPUTS, store(bucket, prefix), "now", None)


def test_a_stack_without_braid_outputs_is_refused() -> None:
    with pytest.raises(RepositoryError, match="is it a Braid stack"):
        config_from_outputs("Other", {"RepositoryBucket": "braid-repo"}, store("braid-repo", ""), "now", None)
