"""Scheduled backups: EventBridge Scheduler sends `braid backup` to tagged hosts through SSM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "infra"))

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402

from braid_infra.backup_schedules import SCHEDULES_CONTEXT, BackupSchedule, BackupSchedules  # noqa: E402
from braid_infra.nag import add_nag_checks  # noqa: E402
from braid_infra.stack import BraidStack  # noqa: E402
from support.moto_stack import cdk_context  # noqa: E402

PG = {
    "name": "pg",
    "schedule": "cron(0 2 * * ? *)",
    "timezone": "Europe/Berlin",
    "run_as": "postgres",
    "command": "braid backup --name pg -- pg_basebackup -Ft -D - -X fetch -c fast",
}
DB2 = {
    "name": "sample",
    "schedule": "rate(12 hours)",
    "run_as": "db2inst1",
    "tag_key": "Database",
    "tag_value": "db2-prod",
    "timeout_hours": 24,
    "command": "braid backup --name sample --pipes 4 -- db2 backup db SAMPLE to {pipes}",
}


def template_with(context: dict[str, Any] | None = None, schedules: Any = None) -> Template:
    app = cdk.App(context=context or {})
    stack = cdk.Stack(app, "S")
    BackupSchedules(stack, "BackupSchedules", schedules=schedules)
    return Template.from_stack(stack)


def schedules_of(template: Template) -> list[dict[str, Any]]:
    return [r["Properties"] for r in template.find_resources("AWS::Scheduler::Schedule").values()]


def test_no_schedule_unless_configured() -> None:
    template = template_with()
    assert schedules_of(template) == []
    assert template.find_resources("AWS::IAM::Role") == {}


def test_each_schedule_sends_the_backup_command_to_the_tagged_hosts_as_its_user() -> None:
    template = template_with({SCHEDULES_CONTEXT: json.dumps([PG, DB2])})
    by_name = {p["Description"].split()[3]: p for p in schedules_of(template)}
    assert set(by_name) == {"pg", "sample"}
    pg = by_name["pg"]
    assert (pg["ScheduleExpression"], pg["ScheduleExpressionTimezone"], pg["State"]) == ("cron(0 2 * * ? *)", "Europe/Berlin", "ENABLED")
    assert pg["Target"]["Arn"] == {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":scheduler:::aws-sdk:ssm:sendCommand"]]}
    assert pg["Target"]["RetryPolicy"] == {"MaximumEventAgeInSeconds": 3600, "MaximumRetryAttempts": 2}
    sent = json.loads(pg["Target"]["Input"])
    assert sent == {
        "DocumentName": "AWS-RunShellScript",
        "Targets": [{"Key": "tag:BraidBackup", "Values": ["pg"]}],
        "Parameters": {
            "commands": ["runuser -u postgres -- sh -c 'braid backup --name pg -- pg_basebackup -Ft -D - -X fetch -c fast'"],
            "executionTimeout": ["172800"],
        },
        "Comment": "Braid scheduled backup pg",
        "MaxErrors": "0",
    }
    db2 = json.loads(by_name["sample"]["Target"]["Input"])
    assert db2["Targets"] == [{"Key": "tag:Database", "Values": ["db2-prod"]}]
    assert db2["Parameters"]["executionTimeout"] == ["86400"]
    assert db2["Parameters"]["commands"] == ["runuser -u db2inst1 -- sh -c 'braid backup --name sample --pipes 4 -- db2 backup db SAMPLE to {pipes}'"]


def test_the_quoted_command_runs_as_written() -> None:
    """The host's shell must see the user's command unchanged, quotes and all."""
    schedule = BackupSchedule.from_json({**PG, "command": "braid backup --name pg -- sh -c 'pg_dumpall | cat'", "run_as": None})
    assert schedule.shell_command() == "braid backup --name pg -- sh -c 'pg_dumpall | cat'"
    quoted = BackupSchedule.from_json({**PG, "command": "echo 'it''s' \"$HOME\""}).shell_command()
    inner = quoted.split(" -- sh -c ", 1)[1]
    done = subprocess.run(["sh", "-c", f"printf %s {inner}"], capture_output=True, text=True, check=True)
    assert done.stdout == "echo 'it''s' \"$HOME\""


def test_the_scheduler_may_send_only_the_shell_document_only_to_tagged_hosts() -> None:
    template = template_with(schedules=[PG])
    policies = list(template.find_resources("AWS::IAM::Policy").values())
    statements = [s for p in policies for s in p["Properties"]["PolicyDocument"]["Statement"]]
    assert {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])} == {"ssm:SendCommand"}
    rendered = json.dumps(statements)
    assert "document/AWS-RunShellScript" in rendered
    tagged = [s for s in statements if "Condition" in s]
    assert len(tagged) == 1 and tagged[0]["Condition"] == {"StringEquals": {"aws:ResourceTag/BraidBackup": "pg"}}
    assert all("instance/*" in json.dumps(r) for r in tagged[0]["Resource"])
    untagged = [s for s in statements if "Condition" not in s]
    assert all("instance" not in json.dumps(s["Resource"]) for s in untagged), "a host may only be reached through its tag"
    (role,) = template.find_resources("AWS::IAM::Role").values()
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    # Two schedules, two roles: neither may reach the other's hosts.
    two = template_with(schedules=[PG, DB2])
    conditions = sorted(
        json.dumps(s["Condition"])
        for p in two.find_resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if "Condition" in s
    )
    assert len(two.find_resources("AWS::IAM::Role")) == 2 and len(conditions) == 2 and conditions[0] != conditions[1]


def test_a_schedule_that_cannot_deliver_trips_an_alarm() -> None:
    template = template_with(schedules=[PG])
    (alarm,) = template.find_resources("AWS::CloudWatch::Alarm").values()
    assert (alarm["Properties"]["Namespace"], alarm["Properties"]["MetricName"]) == ("AWS/Scheduler", "TargetErrorCount")


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ('{"name": "pg"}', "a list of schedules is expected"),
        ("[7]", "each schedule is an object"),
        ("not json", "Expecting value"),
        (json.dumps([{**PG, "when": "nightly"}]), "unknown field 'when'"),
        (json.dumps([{k: v for k, v in PG.items() if k != "command"}]), "'command' is required"),
        (json.dumps([{**PG, "name": "../x"}]), "invalid backup name '../x'"),
        (json.dumps([{**PG, "schedule": "0 2 * * *"}]), "not an EventBridge Scheduler expression"),
        (json.dumps([{**PG, "run_as": "root; rm -rf /"}]), "is not a user name"),
        (json.dumps([{**PG, "timeout_hours": 72}]), "timeout_hours must be a whole number of hours from 1 to 48"),
        (json.dumps([PG, PG]), "two schedules for pg"),
    ],
)
def test_a_bad_schedule_fails_synth_naming_what_is_wrong(bad: str, said: str) -> None:
    with pytest.raises(ValueError, match=f"{SCHEDULES_CONTEXT}: .*{said}"):
        template_with({SCHEDULES_CONTEXT: bad})


def test_the_whole_stack_with_schedules_passes_cdk_nag(tmp_path: Path) -> None:
    app = cdk.App(context={**cdk_context(), SCHEDULES_CONTEXT: [PG, DB2]}, outdir=str(tmp_path))
    stack = BraidStack(app, "Braid")
    add_nag_checks(app)
    app.synth()  # raises on an unacknowledged finding
    template = Template.from_stack(stack)
    assert len(schedules_of(template)) == 2
    path = tmp_path / "Braid.template.json"
    path.write_text(json.dumps(template.to_json()))
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "cfn-lint"), "--format", "parseable", str(path)], capture_output=True, text=True)
    errors = [line for line in done.stdout.splitlines() if line.split(":")[5:6] and line.split(":")[5].startswith("E")]
    assert not errors, done.stdout
    # A schedule whose tag reaches no host sends nothing and fails nothing (review 3, L8): each scheduled name gets a
    # freshness alarm, a rate() its interval plus 2 hours, a cron() a week, unless braid:expectedBackups names it.
    fresh = {p["AlarmDescription"]: p for p in template.find_resources("AWS::CloudWatch::Alarm").values() for p in [p["Properties"]]
             if p.get("MetricName") == "BackupPublished"}
    named = {d: (p["EvaluationPeriods"], *[x["Value"] for x in p["Dimensions"] if x["Name"] == "backup_name"]) for d, p in fresh.items()}
    assert named == {
        "No Braid backup of pg was published in the last 168 hours": (168, "pg"),
        "No Braid backup of sample was published in the last 14 hours": (14, "sample"),
    }


def test_a_scheduled_name_is_expected_within_its_interval() -> None:
    def hours(schedule: str) -> int:
        return BackupSchedule.from_json({**PG, "schedule": schedule}).expected_hours()

    assert (hours("rate(12 hours)"), hours("rate(1 day)"), hours("rate(90 minutes)"), hours("rate(30 days)")) == (14, 26, 4, 168)
    assert hours("cron(0 2 * * ? *)") == hours("at(2026-12-01T02:00:00)") == 168
