"""`braid:copyTo` in the synthesized stack: a Copy function on a schedule, least privilege over both repositories and keys."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "infra"))

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402

from braid import contract  # noqa: E402
from braid_infra.copy_schedule import CopySetting, copy_setting  # noqa: E402
from braid_infra.nag import add_nag_checks  # noqa: E402
from braid_infra.stack import BraidStack  # noqa: E402
from support.moto_stack import cdk_context  # noqa: E402

SECOND_KEY = "arn:aws:kms:eu-west-1:111122223333:key/0b5c6c4e-2f0a-4c53-9d34-4b1d3b1c0f11"
SETTING = {"repo": "s3://braid-dr-bucket/prod", "kms_key": SECOND_KEY}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    app = cdk.App(context={**cdk_context(), contract.COPY_CONTEXT: json.dumps(SETTING)}, outdir=str(tmp_path_factory.mktemp("cdk.out")))
    stack = BraidStack(app, "Braid")
    add_nag_checks(app)
    app.synth()  # raises if cdk-nag reports an unacknowledged finding (the copy role's included)
    return Template.from_stack(stack).to_json()


def of_type(template: dict[str, Any], kind: str, prefix: str = "") -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind and k.startswith(prefix)}


def copy_statements(template: dict[str, Any]) -> list[dict[str, Any]]:
    (policy,) = of_type(template, "AWS::IAM::Policy", "FunctionsCopyRole").values()
    statements: list[dict[str, Any]] = policy["Properties"]["PolicyDocument"]["Statement"]
    return statements


def grants(template: dict[str, Any]) -> set[tuple[str, str]]:
    """(action, resource) of the copy role's own policy, resources rendered: <Bucket> for the stack's bucket."""
    (bucket,) = of_type(template, "AWS::S3::Bucket", "StorageRepository")
    found = set()
    for statement in copy_statements(template):
        assert statement["Effect"] == "Allow" and "NotAction" not in statement and "NotResource" not in statement
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        for resource in resources:
            text = json.dumps(resource, sort_keys=True)
            if f'"{bucket}"' in text:
                rendered = "<Bucket>" + ("/" + text.split('"/', 1)[1].split('"')[0] if '"/' in text else "")
            elif "braid-dr-bucket" in text:
                rendered = "s3:::braid-dr-bucket" + text.split("braid-dr-bucket", 1)[1].split('"')[0]
            else:
                rendered = resource if isinstance(resource, str) else text
            found.update((a, rendered) for a in actions)
    return found


def test_the_copy_role_reads_the_source_writes_only_the_second_repository_and_uses_only_the_two_keys(template: dict[str, Any]) -> None:
    s3 = {g for g in grants(template) if g[0].startswith("s3:")}
    assert s3 == {
        ("s3:GetObject", "<Bucket>/config.json"), ("s3:GetObject", "<Bucket>/manifests/*"), ("s3:GetObject", "<Bucket>/data/*"),
        ("s3:ListBucket", "<Bucket>"),
        ("s3:GetObject", "s3:::braid-dr-bucket/prod/config.json"), ("s3:GetObject", "s3:::braid-dr-bucket/prod/manifests/*"),
        ("s3:PutObject", "s3:::braid-dr-bucket/prod/data/*"), ("s3:PutObject", "s3:::braid-dr-bucket/prod/manifests/*"),
        ("s3:PutObjectRetention", "s3:::braid-dr-bucket/prod/data/*"), ("s3:PutObjectRetention", "s3:::braid-dr-bucket/prod/manifests/*"),
        ("s3:PutObject", "s3:::braid-dr-bucket/prod/catalog/*"), ("s3:DeleteObject", "s3:::braid-dr-bucket/prod/catalog/*"),
        ("s3:DeleteObject", "s3:::braid-dr-bucket/prod/manifests/*"), ("s3:ListBucket", "s3:::braid-dr-bucket"),
    }
    assert not any(a.startswith("s3:") and r.startswith("<Bucket>") and a not in ("s3:GetObject", "s3:ListBucket") for a, r in s3)  # no source write
    kms = [s for s in copy_statements(template) if any(a.startswith("kms:") for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))]
    by_resource = {json.dumps(s["Resource"], sort_keys=True): (sorted(s["Action"]), s.get("Condition")) for s in kms}
    (data_key,) = of_type(template, "AWS::KMS::Key", "KeysDataKeys")
    assert by_resource == {
        json.dumps(SECOND_KEY): (["kms:Decrypt", "kms:Encrypt", "kms:ReEncryptTo"], {"Null": {"kms:EncryptionContext:braid:backup": "false"}}),
        json.dumps({"Fn::GetAtt": [data_key, "Arn"]}, sort_keys=True): (
            ["kms:Decrypt", "kms:ReEncryptFrom"], {"Null": {"kms:EncryptionContext:braid:backup": "false"}}
        ),
    }
    # The stack's key policy names the copy role for the same two actions, with the context.
    (key,) = of_type(template, "AWS::KMS::Key", "KeysDataKeys").values()
    (role,) = of_type(template, "AWS::IAM::Role", "FunctionsCopyRole")
    named = [s for s in key["Properties"]["KeyPolicy"]["Statement"] if role in json.dumps(s.get("Principal"))]
    assert [(sorted(s["Action"]), s["Condition"]) for s in named] == [
        (["kms:Decrypt", "kms:ReEncryptFrom"], {"Null": {"kms:EncryptionContext:braid:backup": "false"}})
    ]


def test_the_schedule_runs_the_copy_function_with_the_second_repository_in_its_environment(template: dict[str, Any]) -> None:
    (function_id, function) = next((k, v) for k, v in of_type(template, "AWS::Lambda::Function", "FunctionsCopy").items())
    props = function["Properties"]
    assert props["Timeout"] == contract.COPY_TIMEOUT_SECONDS and props["MemorySize"] == contract.COPY_MEMORY_MB
    env = props["Environment"]["Variables"]
    assert env[contract.ENV_COPY_TO] == "s3://braid-dr-bucket/prod" and env[contract.ENV_COPY_KMS_KEY] == SECOND_KEY
    (rule,) = of_type(template, "AWS::Events::Rule", "CopySchedule").values()
    assert rule["Properties"]["ScheduleExpression"] == contract.DEFAULT_COPY_SCHEDULE
    (target,) = rule["Properties"]["Targets"]
    assert json.loads(target["Input"]) == {"prefix": ""} and function_id in json.dumps(target["Arn"])
    (invoke_config,) = of_type(template, "AWS::Lambda::EventInvokeConfig").values()
    assert invoke_config["Properties"]["MaximumRetryAttempts"] == 0  # the next scheduled run is the retry: never two at once
    (role_id,) = of_type(template, "AWS::IAM::Role", "FunctionsCopyRole")
    assert template["Outputs"][contract.OUTPUT_COPY_ROLE]["Value"] == {"Fn::GetAtt": [role_id, "Arn"]}  # what the second key's policy names
    alarms = [a for a in of_type(template, "AWS::CloudWatch::Alarm").values() if function_id in json.dumps(a["Properties"].get("Dimensions"))]
    assert len(alarms) == 1 and alarms[0]["Properties"]["MetricName"] == "Errors"  # a run that could not copy a backup


def test_the_stack_has_no_copy_function_unless_configured() -> None:
    assert copy_setting(None) is None and copy_setting("") is None
    assert copy_setting({**SETTING, "schedule": "cron(0 5 * * ? *)"}) == CopySetting("braid-dr-bucket", "prod", SECOND_KEY, "cron(0 5 * * ? *)")
    assert copy_setting(json.dumps({"repo": "s3://b-2/", "kms_key": SECOND_KEY})) == CopySetting("b-2", "", SECOND_KEY)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", "not JSON"),
        ({"repo": "s3://b/p"}, "an object with repo, kms_key and optionally schedule"),
        ({**SETTING, "region": "x"}, "an object with repo, kms_key and optionally schedule"),
        ({**SETTING, "repo": "/mnt/offsite"}, "repo is s3://BUCKET"),
        ({**SETTING, "kms_key": "alias/braid"}, "kms_key is the key's ARN"),
        ({**SETTING, "schedule": "hourly"}, "schedule is an EventBridge expression"),
    ],
)
def test_a_bad_setting_fails_synth_naming_the_context_key(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^braid:copyTo: {message}"):
        copy_setting(value)
