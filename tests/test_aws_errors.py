"""One AWS error mapping: every service's failures become one typed line saying what to fix.

Service answers are injected with botocore's Stubber (no retries, no
network); failures with no answer at all (credentials, network) come from a
client that raises them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError
from botocore.stub import Stubber

from braid.adapters.aws.clients import cloudformation_client, events_client, kms_client, s3_client, stepfunctions_client
from braid.adapters.aws.errors import AwsCall, aws_error, error_code, error_message, http_status, is_transient
from braid.adapters.aws.events import EventBridgePublisher
from braid.adapters.aws.kms import KmsKeyService
from braid.adapters.aws.s3 import S3Store
from braid.adapters.aws.stack_outputs import stack_outputs
from braid.adapters.aws.stepfunctions import StepFunctionsExecutions
from braid.errors import (
    BackupError,
    ExecutionError,
    KeyAccessError,
    NotFoundError,
    RepositoryError,
    StorageError,
)
from braid.format.ids import BackupRef
from braid.format.keys import WrappedKey, encryption_context

REF = BackupRef.new("db")
MACHINE = "arn:aws:states:us-east-1:111122223333:stateMachine:Braid-Backup"


def client_error(code: str, status: int, operation: str = "Op", message: str = "m") -> ClientError:
    error = {"Code": code, "Message": message} if code else {}
    return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


class Raising:
    """A client whose every call raises `exc`: what boto3 does without credentials or network."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(**_: Any) -> Any:
            raise self.exc

        return call


def test_one_reading_of_codes_statuses_and_messages() -> None:
    assert (error_code(client_error("SlowDown", 503)), http_status(client_error("SlowDown", 503))) == ("SlowDown", 503)
    assert error_code(client_error("", 404)) == "404"  # HEAD: no body, the status is the code
    assert error_message(client_error("NoSuchKey", 404, message="")) == "NoSuchKey"
    assert error_code(ValueError("x")) == "" and http_status(ValueError("x")) == 0
    assert is_transient(client_error("ThrottlingException", 400)) and is_transient(client_error("Whatever", 502))
    assert is_transient(EndpointConnectionError(endpoint_url="https://x")) and not is_transient(client_error("AccessDenied", 403))


@pytest.mark.parametrize(
    "exc,kind,needle",
    [
        (NoCredentialsError(), StorageError, "no AWS credentials found while writing s3://b/k: configure a profile"),
        (EndpointConnectionError(endpoint_url="https://x"), StorageError, "cannot reach S3 while writing s3://b/k: .*AWS_ENDPOINT_URL"),
        (client_error("AccessDeniedException", 400), StorageError, r"access denied while writing s3://b/k: the role needs s3:PutObject on it \(m\)"),
        (client_error("ThrottlingException", 400), StorageError, r"S3 kept throttling while writing s3://b/k \(ThrottlingException\) after retries; resume"),
        (client_error("InternalError", 500), StorageError, "S3 kept failing while writing s3://b/k after retries: InternalError: m"),
        (client_error("InvalidArgument", 400), StorageError, "S3 refused writing s3://b/k: InvalidArgument: m"),
    ],
)
def test_the_failures_every_service_shares(exc: BaseException, kind: type[BackupError], needle: str) -> None:
    error = aws_error(exc, AwsCall("S3", "writing s3://b/k", "s3:PutObject", advice="resume"), kind)
    assert type(error) is kind
    assert pytest.raises(BackupError, lambda: _raise(error)).match(needle)


def _raise(error: BackupError) -> None:
    raise error


def test_s3_errors_name_the_object(aws_env: None) -> None:
    store = S3Store(s3_client(region="us-east-1"), "braid-b", "repo")
    with Stubber(store.client) as stub:
        stub.add_client_error("get_object", "NoSuchBucket", "gone", http_status_code=404)
        stub.add_client_error("get_object", "KMS.DisabledException", "key disabled", http_status_code=400)
        stub.add_client_error("get_object", "InvalidRange", "no", http_status_code=416)
        with pytest.raises(RepositoryError, match="bucket braid-b does not exist .*region"):
            store.get("config.json")
        with pytest.raises(StorageError, match="could not use the bucket's KMS key while reading s3://braid-b/repo/x"):
            store.get("x")
        with pytest.raises(StorageError, match="range outside object s3://braid-b/repo/y"):
            store.get_range("y", 10, 5)
    with pytest.raises(StorageError, match="no AWS credentials found while reading s3://braid-b/repo/x"):
        S3Store(Raising(NoCredentialsError()), "braid-b", "repo").get("x")


def test_kms_errors_name_the_backup_and_key(aws_env: None) -> None:
    context = encryption_context("repo-1", str(REF))
    wrapped = WrappedKey("arn:aws:kms:us-east-1:111122223333:key/k", b"blob", context)
    service = KmsKeyService(kms_client(region="us-east-1"), "arn:aws:kms:us-east-1:111122223333:key/k")
    with Stubber(service.client) as stub:
        stub.add_client_error("decrypt", "InvalidCiphertextException", "bad", http_status_code=400)
        stub.add_client_error("decrypt", "ThrottlingException", "slow", http_status_code=400)
        stub.add_client_error("generate_data_key", "UnrecognizedClientException", "who", http_status_code=400)
        with pytest.raises(KeyAccessError, match=f"KMS refused to unwrap the data key of {REF}: the wrapped key or its encryption context"):
            service.unwrap(wrapped)
        with pytest.raises(KeyAccessError, match=r"KMS is unavailable or throttling \(ThrottlingException\)"):
            service.unwrap(wrapped)
        with pytest.raises(KeyAccessError, match=f"access denied while trying to make the data key of {REF} with key .*kms:GenerateDataKey"):
            service.generate_data_key(context)
    offline = KmsKeyService(Raising(EndpointConnectionError(endpoint_url="https://kms")), "alias/braid")
    with pytest.raises(KeyAccessError, match=f"cannot reach KMS while trying to unwrap the data key of {REF} with key alias/braid"):
        offline.unwrap(wrapped)


def test_step_functions_errors(aws_env: None) -> None:
    executions = StepFunctionsExecutions(stepfunctions_client(region="us-east-1"), MACHINE)
    with Stubber(executions.client) as stub:
        stub.add_client_error("start_execution", "ExecutionAlreadyExists", "dup", http_status_code=400)
        stub.add_client_error("start_execution", "AccessDeniedException", "no", http_status_code=400)
        stub.add_client_error("start_execution", "StateMachineDoesNotExist", "no", http_status_code=400)
        stub.add_client_error("start_execution", "ThrottlingException", "slow", http_status_code=400)
        stub.add_client_error("describe_execution", "ExecutionDoesNotExist", "no", http_status_code=400)
        assert executions.start(REF, {}) == executions.execution_arn(REF)  # started before: the same one
        with pytest.raises(StorageError, match="the agent needs states:StartExecution"):
            executions.start(REF, {})
        with pytest.raises(ExecutionError, match="does not exist: deploy the stack"):
            executions.start(REF, {})
        with pytest.raises(ExecutionError, match=rf"Step Functions kept throttling while starting the pipeline of {REF} \(ThrottlingException\)"):
            executions.start(REF, {})
        with pytest.raises(NotFoundError, match=f"no pipeline execution for {REF}"):
            executions.describe(REF)
    offline = StepFunctionsExecutions(Raising(EndpointConnectionError(endpoint_url="https://states")), MACHINE)
    with pytest.raises(ExecutionError, match=f"cannot reach Step Functions while reading the pipeline execution of {REF}"):
        offline.describe(REF)


def test_eventbridge_errors(aws_env: None) -> None:
    publisher = EventBridgePublisher(events_client(region="us-east-1"), "default")
    with Stubber(publisher.client) as stub:
        stub.add_client_error("put_events", "AccessDeniedException", "no", http_status_code=400)
        stub.add_response("put_events", {"FailedEntryCount": 1, "Entries": [{"ErrorCode": "InternalFailure", "ErrorMessage": "later"}]})
        with pytest.raises(StorageError, match="access denied while publishing 'Backup Failed' to bus default: the role needs events:PutEvents"):
            publisher.publish("Backup Failed", {"backup": str(REF)})
        with pytest.raises(StorageError, match="EventBridge refused 'Backup Failed': InternalFailure: later"):
            publisher.publish("Backup Failed", {"backup": str(REF)})


def test_cloudformation_errors(aws_env: None) -> None:
    client = cloudformation_client(region="us-east-1")
    with Stubber(client) as stub:
        stub.add_client_error("describe_stacks", "ValidationError", "Stack with id Nope does not exist", http_status_code=400)
        stub.add_client_error("describe_stacks", "AccessDenied", "no", http_status_code=403)
        with pytest.raises(RepositoryError, match="cannot read stack 'Nope': Stack with id Nope does not exist"):
            stack_outputs("Nope", client)
        with pytest.raises(RepositoryError, match="access denied while reading stack 'Braid': the role needs cloudformation:DescribeStacks"):
            stack_outputs("Braid", client)


def test_waking_a_pipeline_drops_a_stale_token_and_names_a_refused_wake(aws_env: None) -> None:
    """SendTaskSuccess (braid.agent.wake): a token the execution no longer waits for is not an error; anything else is an
    ExecutionError naming the permission (the waker logs it and leaves the pipeline to its sleep's timeout)."""
    executions = StepFunctionsExecutions(stepfunctions_client(region="us-east-1"), MACHINE)
    with Stubber(executions.client) as stub:
        stub.add_response("send_task_success", {}, {"taskToken": "t1", "output": "{}"})
        for code in ("TaskTimedOut", "TaskDoesNotExist", "InvalidToken"):
            stub.add_client_error("send_task_success", code, "gone", http_status_code=400)
        stub.add_client_error("send_task_success", "AccessDeniedException", "no", http_status_code=400)
        assert executions.wake("t1") is True
        assert [executions.wake("old") for _ in range(3)] == [False, False, False]
        with pytest.raises(ExecutionError, match=r"waking the backup pipeline.*states:SendTaskSuccess"):
            executions.wake("t2")


def test_a_completion_whose_parts_another_agent_replaced_says_so(aws_env: None) -> None:
    from braid.adapters.aws.s3_multipart import S3Multipart
    from braid.ports.multipart import SentPart

    uploads = S3Multipart(S3Store(s3_client(region="us-east-1"), "braid-b", "repo"))
    with Stubber(uploads.client) as stub:
        stub.add_client_error("complete_multipart_upload", "InvalidPart", "One or more of the specified parts could not be found.", http_status_code=400)
        with pytest.raises(StorageError) as refused:
            uploads.complete_upload("staging/db/x/seg00000", "u1", [SentPart(1, '"etag"', "AAAAAAAAAAA=")], "AAAAAAAAAAA=", 5)
    assert str(refused.value) == (
        "S3 refused completing s3://braid-b/repo/staging/db/x/seg00000: its parts were replaced meanwhile; another agent is resuming"
        " this backup at the same time: let that one finish (see 'braid list --incomplete' and 'braid status')"
    )
    assert refused.value.exit_code == 7
