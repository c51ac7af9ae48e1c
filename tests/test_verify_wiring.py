"""How `braid verify` finds the stack's verify state machine, and how it follows a run (moto, no emulator)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto import mock_aws

from braid.adapters.aws.clients import cloudformation_client, stepfunctions_client
from braid.adapters.aws.s3 import S3Store
from braid.adapters.aws.stack_outputs import config_from_outputs
from braid.adapters.aws.verify_runs import CloudVerifier
from braid.adapters.aws.wiring import cloud_verifier
from braid.adapters.local.store import LocalStore
from braid.contract import OUTPUT_BUCKET, OUTPUT_KEY, OUTPUT_STATE_MACHINE, OUTPUT_VERIFY_STATE_MACHINE
from braid.errors import ExecutionError
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import utc_now

BUCKET = "braid-verify-wiring"
BACKUP = "arn:aws:states:us-east-1:123456789012:stateMachine:Braid-Backup"
KMS = {"type": "kms", "key_id": "arn:aws:kms:us-east-1:123456789012:key/k"}


@pytest.fixture
def store(aws_env: None) -> Iterator[S3Store]:
    with mock_aws():
        store = S3Store.from_url(f"s3://{BUCKET}", region="us-east-1", sleep=lambda _: None)
        store.client.create_bucket(Bucket=BUCKET)
        yield store


def outputs_stack(name: str, outputs: dict[str, str]) -> None:
    template = {
        "Resources": {"Placeholder": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": {k: {"Value": v} for k, v in outputs.items()},
    }
    cloudformation_client(region="us-east-1").create_stack(StackName=name, TemplateBody=json.dumps(template))


def test_init_records_the_verify_state_machine_when_the_stack_has_one(store: S3Store) -> None:
    outputs = {OUTPUT_BUCKET: BUCKET, OUTPUT_KEY: KMS["key_id"], OUTPUT_STATE_MACHINE: BACKUP}
    older = config_from_outputs("Braid", outputs, store, utc_now(), "us-east-1")
    assert "verify_state_machine_arn" not in older.cloud  # a stack from before: verify then runs on the host
    newer = config_from_outputs("Braid", {**outputs, OUTPUT_VERIFY_STATE_MACHINE: "arn:verify"}, store, utc_now(), "us-east-1")
    assert newer.cloud["verify_state_machine_arn"] == "arn:verify"


def test_the_verifier_comes_from_the_config_else_from_the_stack_it_names(store: S3Store, tmp_path: Path) -> None:
    recorded = Repository(store, RepositoryConfig.new(KMS, utc_now(), {"stack": "Braid", "state_machine_arn": BACKUP, "verify_state_machine_arn": "arn:a"}))
    found = cloud_verifier(recorded)
    assert isinstance(found, CloudVerifier) and found.state_machine_arn == "arn:a"

    outputs_stack("Braid", {OUTPUT_VERIFY_STATE_MACHINE: "arn:from-stack"})
    older = Repository(store, RepositoryConfig.new(KMS, utc_now(), {"stack": "Braid", "state_machine_arn": BACKUP}))
    found = cloud_verifier(older)
    assert found is not None and found.state_machine_arn == "arn:from-stack"

    outputs_stack("Old", {OUTPUT_STATE_MACHINE: BACKUP})
    assert cloud_verifier(Repository(store, RepositoryConfig.new(KMS, utc_now(), {"stack": "Old"}))) is None
    assert cloud_verifier(Repository(store, RepositoryConfig.new(KMS, utc_now(), {}))) is None  # S3 without the stack
    assert cloud_verifier(Repository(LocalStore(tmp_path), RepositoryConfig.new(KMS, utc_now(), {"stack": "Braid"}))) is None


def test_a_run_that_cannot_start_says_what_to_do(store: S3Store) -> None:
    missing = "arn:aws:states:us-east-1:123456789012:stateMachine:Braid-Verify"
    with pytest.raises(ExecutionError, match="verify state machine .* does not exist: deploy the stack, or re-run 'braid init --stack'"):
        CloudVerifier(stepfunctions_client(region="us-east-1"), missing, poll_seconds=0).run("verify-x", {"backups": "all"})
