"""The scheduled copy (`braid:copyTo`): functions/copy on moto, a source and a second repository in two buckets.

Each run copies what the second repository is missing, stops before its
deadline leaving the backup it was copying unpublished, and the next run
resumes it sending only the missing objects; a run with nothing to copy
copies nothing; a corrupt source backup fails the run (the function's
Errors alarm) without holding back the others.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from inprocess_lambda import PROCESS_ENVIRONMENT  # noqa: E402

from braid import contract  # noqa: E402
from braid.adapters.aws.clients import kms_client, s3_client  # noqa: E402
from braid.adapters.aws.kms import KmsKeyService  # noqa: E402
from braid.adapters.aws.s3 import S3Store  # noqa: E402
from braid.errors import BackupError, UsageError  # noqa: E402
from braid.format.ids import BackupRef  # noqa: E402
from braid.format.layout import data_prefix, manifest_key, summary_key  # noqa: E402
from braid.format.repository import Repository, RepositoryConfig  # noqa: E402
from braid.format.timestamps import utc_now  # noqa: E402
from braid.ops.open import open_backup  # noqa: E402
from support.synthetic_backup import write_backup  # noqa: E402

SOURCE, SECOND = "braid-source", "braid-second"
START = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)


@dataclass
class Clock:
    """Lambda's context: plenty of time for the first `calls` questions, then below the copy's stop margin."""

    calls: int | None = None
    asked: int = 0
    function_name: str = "Braid-Copy"
    memory_limit_in_mb: int = contract.COPY_MEMORY_MB
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:Braid-Copy"
    aws_request_id: str = field(default="copy-run")

    def get_remaining_time_in_millis(self) -> int:
        self.asked += 1
        plenty = self.calls is None or self.asked <= self.calls
        return 800_000 if plenty else contract.COPY_STOP_SECONDS * 1000 - 1


@dataclass
class Cloud:
    source: Repository
    second: Repository
    source_keys: KmsKeyService
    second_keys: KmsKeyService
    app: Any

    def run(self, clock: Clock | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.app.handler({"prefix": ""}, clock or Clock())
        return result

    def identical(self, ref: BackupRef) -> None:
        """The copy opens under the second repository's key, and holds the source's objects byte for byte."""
        opened = open_backup(self.second, ref, self.second_keys)
        assert opened.manifest.repository == self.second.config.id and opened.manifest.key.key_id == self.second_keys.key_id
        theirs = {i.key for i in self.source.store.list(data_prefix(ref))}
        assert theirs and theirs == {i.key for i in self.second.store.list(data_prefix(ref))}
        assert all(self.source.store.get(k) == self.second.store.get(k) for k in theirs)


def handler_module() -> Any:
    spec = importlib.util.spec_from_file_location("braid_copy_app", ROOT / "functions" / "copy" / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cloud(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    with mock_aws():
        s3, kms = s3_client(region="us-east-1"), kms_client(region="us-east-1")
        for bucket in (SOURCE, SECOND):
            s3.create_bucket(Bucket=bucket)
        source_arn = kms.create_key(Description="source")["KeyMetadata"]["Arn"]
        second_arn = kms.create_key(Description="second")["KeyMetadata"]["Arn"]
        source = Repository.create(S3Store(s3, SOURCE), RepositoryConfig.new({"type": "kms", "key_id": source_arn}, utc_now()))
        second = Repository.create(S3Store(s3, SECOND, "dr"), RepositoryConfig.new({"type": "kms", "key_id": second_arn}, utc_now()))
        environment = {
            **PROCESS_ENVIRONMENT, "POWERTOOLS_METRICS_DISABLED": "true", contract.ENV_BUCKET: SOURCE, contract.ENV_KMS_KEY_ID: source_arn,
            contract.ENV_COPY_TO: f"s3://{SECOND}/dr", contract.ENV_COPY_KMS_KEY: second_arn,
        }
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        from braid.adapters.aws import lambda_env

        for cached in (lambda_env._s3, lambda_env._kms, lambda_env._events):  # clients of this mock, not an earlier test's
            cached.cache_clear()
        yield Cloud(source, second, KmsKeyService(kms, source_arn), KmsKeyService(kms, second_arn), handler_module())


def backup(cloud: Cloud, name: str, hours: int, chunks: int = 2) -> BackupRef:
    return write_backup(cloud.source, cloud.source_keys, name, START + timedelta(hours=hours), chunks=chunks)


def test_a_run_copies_every_missing_backup_and_a_run_with_nothing_to_copy_copies_nothing(cloud: Cloud) -> None:
    refs = [backup(cloud, "pg", 0), backup(cloud, "db2", 1), backup(cloud, "pg", 2, chunks=3)]

    first = cloud.run()

    assert first["ok"] and first["copied"] == [str(r) for r in refs] and first["pending"] == 3
    assert first["objects_copied"] == 7 and first["interrupted"] is None and first["remaining"] == [] and first["failed"] == []
    assert cloud.second.backups() == sorted(refs, key=lambda r: r.id)
    for ref in refs:
        cloud.identical(ref)
    second = cloud.run()
    assert second["ok"] and second["pending"] == 0 and second["copied"] == [] and second["objects_copied"] == 0


def test_a_run_stopped_by_its_deadline_publishes_nothing_and_the_next_run_resumes_it(cloud: Cloud) -> None:
    ref = backup(cloud, "pg", 0, chunks=6)
    later = backup(cloud, "pg", 1)

    cut = cloud.run(Clock(calls=3))  # the pending check, then two objects: the deadline comes mid-backup

    assert cut["ok"] and cut["interrupted"] == str(ref) and cut["remaining"] == [str(ref), str(later)] and cut["copied"] == []
    sent = {i.key for i in cloud.second.store.list(data_prefix(ref))}
    assert 1 <= len(sent) < 6  # some of its objects, and nothing published
    assert cloud.second.store.head(manifest_key(ref)) is None and cloud.second.store.head(summary_key(ref)) is None
    assert cloud.second.backups() == []

    resumed = cloud.run()

    assert resumed["ok"] and resumed["copied"] == [str(ref), str(later)] and resumed["interrupted"] is None
    assert resumed["objects_copied"] == 6 - len(sent) + 2  # only what the cut run did not send
    cloud.identical(ref)
    cloud.identical(later)


def test_a_deadline_before_the_first_backup_copies_nothing_and_leaves_all_for_the_next_run(cloud: Cloud) -> None:
    ref = backup(cloud, "pg", 0)
    run = cloud.run(Clock(calls=0))
    assert run["ok"] and run["copied"] == [] and run["interrupted"] is None and run["remaining"] == [str(ref)]
    assert list(cloud.second.store.list(data_prefix(ref))) == []


def test_a_corrupt_source_backup_fails_the_run_and_the_others_are_copied(cloud: Cloud) -> None:
    bad = backup(cloud, "pg", 0)
    good = backup(cloud, "pg", 1)
    other = backup(cloud, "db2", 2)
    (chunk, *_) = [i.key for i in cloud.source.store.list(data_prefix(bad))]
    damaged = bytearray(cloud.source.store.get(chunk))
    damaged[-1] ^= 1
    cloud.source.store.client.put_object(Bucket=SOURCE, Key=chunk, Body=bytes(damaged))  # type: ignore[attr-defined]

    with pytest.raises(BackupError) as failed:
        cloud.run()

    assert type(failed.value).__name__ == "CopyFailedError"
    message = str(failed.value)
    assert message.startswith(f"1 backup(s) not copied to s3://{SECOND}/dr: {bad}: ") and "does not match its manifest (corrupt)" in message
    assert f"braid verify --deep {bad}" in message
    assert cloud.second.backups() == [good, other]
    # A backup older than the second repository's newest of its name is not pending: its retention's, or passed over.
    again = cloud.run()
    assert again["ok"] and again["pending"] == 0


def test_backups_the_second_repositorys_retention_let_go_are_not_copied_again(cloud: Cloud) -> None:
    old, new = backup(cloud, "pg", 0), backup(cloud, "pg", 1)
    assert cloud.run()["copied"] == [str(old), str(new)]
    cloud.second.store.delete([manifest_key(old)])  # pruned there, kept here
    run = cloud.run()
    assert run["pending"] == 0 and run["copied"] == [] and cloud.second.backups() == [new]


def test_a_key_that_is_not_the_second_repositorys_is_refused_before_anything_is_copied(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = backup(cloud, "pg", 0)
    monkeypatch.setenv(contract.ENV_COPY_KMS_KEY, cloud.source_keys.key_id)
    with pytest.raises(UsageError, match=rf"braid:copyTo names the KMS key {cloud.source_keys.key_id}, but s3://{SECOND}/dr uses KMS key "):
        cloud.run()
    assert list(cloud.second.store.list(data_prefix(ref))) == []


def test_a_second_repository_in_another_region_gets_the_data_key_by_encrypt_there(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    """KMS keys are regional: ReEncrypt cannot reach another region's key, so the copy decrypts here and encrypts there."""
    far = kms_client(region="eu-west-1")
    far_arn = far.create_key(Description="far")["KeyMetadata"]["Arn"]
    s3 = s3_client(region="us-east-1")
    far_repo = Repository.create(S3Store(s3, SECOND, "far"), RepositoryConfig.new({"type": "kms", "key_id": far_arn}, utc_now()))
    monkeypatch.setenv(contract.ENV_COPY_TO, f"s3://{SECOND}/far")
    monkeypatch.setenv(contract.ENV_COPY_KMS_KEY, far_arn)
    ref = backup(cloud, "pg", 0)

    run = cloud.run()

    assert run["ok"] and run["copied"] == [str(ref)] and run["target"] == f"s3://{SECOND}/far"
    opened = open_backup(far_repo, ref, KmsKeyService(far, far_arn))
    assert opened.manifest.key.key_id == far_arn and opened.key.fingerprint == open_backup(cloud.source, ref, cloud.source_keys).key.fingerprint


# -- the Copy role's policy allows every request a run makes (and no write to the source) -------------------

PLACEHOLDER_KEY = "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-4000-8000-000000000000"


@pytest.fixture(scope="module")
def copy_template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The stack as `cdk deploy -c braid:copyTo=...` synthesizes it, the second repository named as in these tests."""
    sys.path.insert(0, str(ROOT / "infra"))
    import aws_cdk as cdk
    from aws_cdk.assertions import Template

    from braid_infra.stack import BraidStack
    from support.moto_stack import cdk_context

    app = cdk.App(context=cdk_context(), outdir=str(tmp_path_factory.mktemp("cdk.out")))
    stack = BraidStack(app, "Braid", copy_to={"repo": f"s3://{SECOND}/dr", "kms_key": PLACEHOLDER_KEY})
    app.synth()
    template: dict[str, Any] = Template.from_stack(stack).to_json()
    return template


def test_the_copy_roles_policy_allows_every_request_of_a_run_and_no_write_to_the_source(cloud: Cloud, copy_template: dict[str, Any]) -> None:
    import json
    from urllib.parse import parse_qs, urlsplit

    from braid.adapters.aws import lambda_env
    from support.emulated_iam import _Lenient, json_authorizations, s3_authorizations
    from support.iam_policy import ALLOW, IMPLICIT, Request, evaluate
    from support.moto_stack import data_key_id, resources_of

    second_key = cloud.second_keys.key_id
    template = json.loads(json.dumps(copy_template).replace(PLACEHOLDER_KEY, second_key))
    (bucket_id,) = [lid for lid, r in resources_of(template, "AWS::S3::Bucket").items() if lid.startswith("StorageRepository")]
    key_id = data_key_id(template)
    (role_id,) = [lid for lid in resources_of(template, "AWS::IAM::Role") if lid.startswith("FunctionsCopyRole")]
    role_arn = f"arn:aws:iam::123456789012:role/{role_id}"
    render = _Lenient(
        refs={bucket_id: SOURCE},
        attributes={(bucket_id, "Arn"): f"arn:aws:s3:::{SOURCE}", (key_id, "Arn"): cloud.source_keys.key_id, (role_id, "Arn"): role_arn},
    ).render
    identity = [s for p in resources_of(template, "AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]
                for s in render(p["Properties"]["PolicyDocument"])["Statement"]]
    key_policy = render(template["Resources"][key_id]["Properties"]["KeyPolicy"])["Statement"]
    (bucket_policy,) = [render(p["Properties"]["PolicyDocument"])["Statement"] for p in resources_of(template, "AWS::S3::BucketPolicy").values()
                        if render(p["Properties"]["Bucket"]) == SOURCE]

    asked: list[tuple[str, str, dict[str, Any]]] = []

    def capture(request: Any, event_name: str, **_: Any) -> None:
        service, operation = event_name.split(".")[1:3]
        url = urlsplit(request.url)
        if service == "s3":
            host_bucket = url.hostname.split(".s3.")[0] if url.hostname and ".s3." in url.hostname else ""
            path = f"/{host_bucket}{url.path}" if host_bucket else url.path
            headers = {k.lower(): v for k, v in request.headers.items()}
            body = request.body if isinstance(request.body, bytes) else b""
            asked.extend(s3_authorizations(request.method, path, parse_qs(url.query, keep_blank_values=True), headers, body))
        else:
            asked.extend(json_authorizations(service, operation, json.loads(request.body or b"{}"), None))  # type: ignore[arg-type]

    for client in (lambda_env._s3(), lambda_env._kms()):
        client.meta.events.register("request-created", capture)
    refs = [backup(cloud, "pg", 0, chunks=3), backup(cloud, "pg", 1)]
    cut = cloud.run(Clock(calls=2))
    assert cut["interrupted"] == str(refs[0])
    assert cloud.run()["copied"] == [str(r) for r in refs]

    def decide(action: str, resource: str, context: dict[str, Any]) -> str:
        request = Request(role_arn, action, resource, {"aws:SecureTransport": "true", **context})
        if resource.startswith(f"arn:aws:s3:::{SOURCE}"):
            return evaluate(request, identity, bucket_policy)
        if resource == cloud.source_keys.key_id:
            return evaluate(request, identity, key_policy, key_policy=True)
        return evaluate(request, identity)  # the second bucket (same account) and key: the role's own policy

    denied = [(a, r) for a, r, c in asked if decide(a, r, c) != ALLOW]
    assert asked and denied == []
    used = {a for a, _, _ in asked}
    assert {"s3:GetObject", "s3:PutObject", "s3:ListBucket", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo"} <= used
    # A run with nothing to copy (every 15 minutes) reads the two configs and lists the two repositories' manifests: no KMS request.
    asked.clear()
    assert cloud.run()["pending"] == 0
    assert sorted((a, r.split(":::")[1]) for a, r, _ in asked) == [
        ("s3:GetObject", f"{SECOND}/dr/config.json"), ("s3:GetObject", f"{SOURCE}/config.json"), ("s3:ListBucket", SECOND), ("s3:ListBucket", SOURCE)
    ]
    # What a run never needs, it may not do: write, delete or re-key the source.
    for action, resource in [("s3:PutObject", f"arn:aws:s3:::{SOURCE}/data/pg/x"), ("s3:DeleteObject", f"arn:aws:s3:::{SOURCE}/manifests/pg/x"),
                             ("s3:GetObject", f"arn:aws:s3:::{SECOND}/dr/data/pg/x"), ("s3:PutObject", f"arn:aws:s3:::{SECOND}/other/data/x")]:
        assert decide(action, resource, {}) == IMPLICIT, (action, resource)


@pytest.mark.parametrize(
    ("setting", "value", "error", "message"),
    [
        (contract.ENV_COPY_TO, f"s3://{SECOND}/nothing-here", "RepositoryError", f"no Braid repository at s3://{SECOND}/nothing-here"),
        (contract.ENV_COPY_TO, None, "UsageError", f"the function's environment lacks {contract.ENV_COPY_TO}; deploy it with the Braid stack"),
        (contract.ENV_COPY_KMS_KEY, None, "UsageError", f"the function's environment lacks {contract.ENV_COPY_KMS_KEY}"),
    ],
)
def test_a_second_repository_that_is_not_there_or_not_configured_fails_the_run_naming_it(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch, setting: str, value: str | None, error: str, message: str
) -> None:
    ref = backup(cloud, "pg", 0)
    if value is None:
        monkeypatch.delenv(setting)
    else:
        monkeypatch.setenv(setting, value)
    with pytest.raises(BackupError) as failed:
        cloud.run()
    assert type(failed.value).__name__ == error and message in str(failed.value), failed.value
    assert list(cloud.second.store.list(data_prefix(ref))) == []


def test_a_backup_that_could_not_be_published_holds_its_names_later_ones_for_the_next_run(cloud: Cloud) -> None:
    """A failure a rerun can get past (here the second bucket refuses one manifest): the name's later backups wait, so
    none is skipped over by "newer than the newest copy"; other names go on. The next run copies them in order."""
    from botocore.exceptions import ClientError

    from braid.adapters.aws import lambda_env

    refused, later, other = backup(cloud, "pg", 0), backup(cloud, "pg", 1), backup(cloud, "db2", 2)
    manifest = f"dr/{manifest_key(refused)}"

    def deny(params: dict[str, Any], **_: Any) -> None:
        if SECOND in params.get("url", "") and params.get("url", "").endswith(manifest):  # the serialized request
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "PutObject")

    lambda_env._s3().meta.events.register("before-call.s3.PutObject", deny)
    try:
        with pytest.raises(BackupError) as failed:
            cloud.run()
    finally:
        lambda_env._s3().meta.events.unregister("before-call.s3.PutObject", deny)
    message = str(failed.value)
    assert type(failed.value).__name__ == "CopyFailedError" and message.startswith(f"1 backup(s) not copied to s3://{SECOND}/dr: {refused}: ")
    assert "access denied" in message.lower(), message
    assert cloud.second.backups() == [other]  # pg's later backup waited

    again = cloud.run()
    assert again["ok"] and again["copied"] == [str(refused), str(later)]


def test_the_stacks_own_repository_as_the_second_one_is_refused(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    backup(cloud, "pg", 0)
    monkeypatch.setenv(contract.ENV_COPY_TO, f"s3://{SOURCE}")
    monkeypatch.setenv(contract.ENV_COPY_KMS_KEY, cloud.source_keys.key_id)
    with pytest.raises(UsageError, match=rf"^s3://{SOURCE} is the source repository itself \(id {cloud.source.config.id}\): copy to another repository$"):
        cloud.run()
