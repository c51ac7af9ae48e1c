"""Alarms reach someone: every alarm notifies the encrypted SNS topic; e-mail from configuration; a dashboard."""

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

from braid_infra.backup_schedules import SCHEDULES_CONTEXT  # noqa: E402
from braid_infra.monitoring import ALARM_EMAIL_CONTEXT, EXPECTED_BACKUPS_CONTEXT, alarm_emails, expected_backups  # noqa: E402
from braid_infra.nag import add_nag_checks  # noqa: E402
from braid_infra.stack import BraidStack  # noqa: E402
from support.moto_stack import cdk_context  # noqa: E402

SCHEDULE = {"name": "pg", "schedule": "rate(1 day)", "command": "braid backup --name pg -- pg_basebackup -Ft -D - -X fetch"}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    context = {
        **cdk_context(),
        ALARM_EMAIL_CONTEXT: "dba@example.com, oncall@example.com",
        SCHEDULES_CONTEXT: [SCHEDULE],
        EXPECTED_BACKUPS_CONTEXT: {"pg": 26, "sample": 170 - 2},
    }
    app = cdk.App(context=context, outdir=str(tmp_path_factory.mktemp("cdk.out")))
    stack = BraidStack(app, "Braid")
    add_nag_checks(app)
    app.synth()  # cdk-nag: SNS2 (encryption) and SNS3 (TLS only) would fail it
    return Template.from_stack(stack)


def alarms(template: Template) -> dict[str, dict[str, Any]]:
    return {lid: r["Properties"] for lid, r in template.find_resources("AWS::CloudWatch::Alarm").items()}


def test_every_alarm_notifies_the_topic(template: Template) -> None:
    (topic_id,) = template.find_resources("AWS::SNS::Topic")
    found = alarms(template)
    assert len(found) >= 14
    silent = [lid for lid, p in found.items() if p.get("AlarmActions") != [{"Ref": topic_id}]]
    assert silent == []


def test_the_alarms_cover_what_needs_a_person(template: Template) -> None:
    names = {(p.get("Namespace"), p.get("MetricName")) for p in alarms(template).values()}
    for wanted in [
        ("AWS/States", "ExecutionsFailed"),
        ("AWS/States", "ExecutionsTimedOut"),
        ("AWS/Lambda", "Throttles"),
        ("AWS/Lambda", "Duration"),
        ("AWS/Lambda", "Errors"),
        ("Braid", "VerifyFailures"),
        ("AWS/Scheduler", "TargetErrorCount"),
    ]:
        assert wanted in names, wanted
    children = [p for p in alarms(template).values() if p.get("MetricName") == "ExecutionsTimedOut" and "Fn::Join" in json.dumps(p["Dimensions"])]
    assert len(children) == 1 and "/chunks" in json.dumps(children[0]["Dimensions"]), "map-run children are filed under the map's label"
    # A child whose worker failed ends in ItemFailed (a success, review 3 M1): the worker's Errors alarm sees the failures.
    assert not [p for p in alarms(template).values() if p.get("MetricName") == "ExecutionsFailed" and "Fn::Join" in json.dumps(p["Dimensions"])]
    (staging,) = [p for p in alarms(template).values() if p.get("MetricName") == "OldestStagingHours"]
    assert (staging["Threshold"], staging["Statistic"], staging["Namespace"]) == (24, "Maximum", "Braid"), staging
    near = [p for p in alarms(template).values() if p.get("MetricName") == "Duration"]
    assert [p["Threshold"] for p in near] == [48000]  # 80% of the maintenance function's minute (it only starts the prune run)


def test_email_subscriptions_come_from_configuration(template: Template) -> None:
    subscribed = sorted(r["Properties"]["Endpoint"] for r in template.find_resources("AWS::SNS::Subscription").values())
    assert subscribed == ["dba@example.com", "oncall@example.com"]
    assert alarm_emails(None) == [] and alarm_emails(["a@b.io"]) == ["a@b.io"]
    with pytest.raises(ValueError, match=f"{ALARM_EMAIL_CONTEXT}: 'pager' is not an e-mail address"):
        alarm_emails("pager")
    with pytest.raises(ValueError, match="an e-mail address or a list of them"):
        alarm_emails({"to": "a@b.io"})


def test_the_topic_is_encrypted_with_a_key_cloudwatch_may_use_and_refuses_plain_http(template: Template) -> None:
    (topic,) = template.find_resources("AWS::SNS::Topic").values()
    assert "KmsMasterKeyId" in topic["Properties"]
    keys = [r for r in template.find_resources("AWS::KMS::Key").values() if "alarm" in r["Properties"].get("Description", "")]
    (key,) = keys
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    cloudwatch = [s for s in statements if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert len(cloudwatch) == 1 and set(cloudwatch[0]["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
    (policy,) = template.find_resources("AWS::SNS::TopicPolicy").values()
    denies = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert denies and denies[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_a_dashboard_shows_backups_workers_and_alarms(template: Template) -> None:
    (dashboard,) = template.find_resources("AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for title in ("Backups", "Workers", "Alarms"):
        assert f'\\"title\\":\\"{title}\\"' in body


def test_a_name_without_a_backup_for_its_expected_hours_trips_its_own_alarm(template: Template) -> None:
    fresh = {p["AlarmDescription"]: p for p in alarms(template).values() if p.get("MetricName") == "BackupPublished"}
    assert sorted(fresh) == [
        "No Braid backup of pg was published in the last 26 hours",
        "No Braid backup of sample was published in the last 168 hours",
    ]
    pg = fresh["No Braid backup of pg was published in the last 26 hours"]
    assert pg["Dimensions"] == [{"Name": "backup_name", "Value": "pg"}, {"Name": "service", "Value": "braid"}]
    assert (pg["Period"], pg["EvaluationPeriods"], pg["DatapointsToAlarm"]) == (3600, 26, 26)
    assert (pg["ComparisonOperator"], pg["Threshold"], pg["TreatMissingData"]) == ("LessThanThreshold", 1, "breaching")
    assert expected_backups(None) == {} and expected_backups('{"pg": 1}') == {"pg": 1}
    for bad, said in (("[1]", "an object of backup name to hours"), ('{"pg": 0}', "pg: hours must be"), ('{"pg": 200}', "from 1 to 168"),
                      ('{"../x": 5}', "invalid backup name")):
        with pytest.raises(ValueError, match=said):
            expected_backups(bad)



def test_a_prune_that_fails_times_out_or_leaves_data_behind_alarms(template: Template) -> None:
    """Retention must never stop silently: the prune state machine's failures and its items' failures each reach the topic."""
    (prune_id,) = [lid for lid in template.find_resources("AWS::StepFunctions::StateMachine") if lid.startswith("PrunePipeline")]
    found = alarms(template).values()
    on_prune = {p["MetricName"] for p in found if p.get("Namespace") == "AWS/States" and {"Name": "StateMachineArn", "Value": {"Ref": prune_id}} in p["Dimensions"]}
    assert on_prune == {"ExecutionsFailed", "ExecutionsTimedOut"}
    (items,) = [p for p in found if p.get("MetricName") == "PruneFailures"]
    assert (items["Namespace"], items["Threshold"], items["Statistic"]) == ("Braid", 1, "Sum")
