"""Scheduled backups: EventBridge Scheduler runs `braid backup` on the database hosts.

A backup must run where the database is, so the schedule does not invoke
anything in the cloud: it calls Systems Manager's SendCommand (a universal
target) with the AWS-RunShellScript document on the hosts carrying a tag,
and the agent on each host does the rest exactly as when a person runs it.
The stack holds what, when and where; the host holds the credentials of
its own role (HostAccess) and the key material stays out of the schedule.

Configuration, from the `backup_schedules` prop or else the CDK context
`braid:backupSchedules` (a JSON list, or its text), one object per schedule:

- `name`: the backup name (as `braid backup --name`); also the schedule's;
- `command`: the shell command the host runs, e.g.
  `braid backup --name pg -- pg_basebackup -Ft -D - -X fetch -c fast`;
- `schedule`: an EventBridge Scheduler expression, `cron(0 2 * * ? *)`,
  `rate(12 hours)`; `timezone` (IANA, default UTC);
- `run_as`: the OS user that runs it (`postgres`, `db2inst1`); the SSM agent
  runs commands as root, so without it the backup runs as root;
- `tag_key`/`tag_value`: the hosts to run on (default `BraidBackup` = name);
- `timeout_hours`: how long the command may run (default and maximum 48,
  AWS-RunShellScript's own limit).

By default there is none. The scheduler's role may send only that document,
only to instances (EC2 or hybrid managed nodes) carrying the tag, and a
schedule that cannot deliver (TargetErrorCount) trips an alarm; one that
reaches no host at all (a tag no instance carries: SSM sends nothing and
reports success) trips its name's freshness alarm (`expected_hours`).
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aws_cdk import Duration, Stack, TimeZone
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as scheduler_targets
from constructs import Construct

from braid.errors import UsageError
from braid.format.ids import validate_name
from braid_infra.nag import acknowledge, wildcard

SCHEDULES_CONTEXT = "braid:backupSchedules"
DOCUMENT = "AWS-RunShellScript"
DEFAULT_TAG_KEY = "BraidBackup"
MAX_TIMEOUT_HOURS = 48  # AWS-RunShellScript's executionTimeout maximum (172800 s)
_EXPRESSION = re.compile(r"(cron|rate)\(.+\)|at\(.+\)")
_RATE = re.compile(r"rate\((\d+) (minute|hour|day)s?\)")
MAX_EXPECTED_HOURS = 168  # braid_infra.monitoring's: CloudWatch evaluates at most 7 days of hourly datapoints
_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?")
_TAG = re.compile(r"[\w.:/=+\-@ ]{1,128}")
_FIELDS = {"name", "command", "schedule", "timezone", "run_as", "tag_key", "tag_value", "timeout_hours"}


@dataclass(frozen=True)
class BackupSchedule:
    name: str
    command: str
    schedule: str
    timezone: str = "UTC"
    run_as: str | None = None
    tag_key: str = DEFAULT_TAG_KEY
    tag_value: str = ""
    timeout_hours: int = MAX_TIMEOUT_HOURS

    @classmethod
    def from_json(cls, doc: Any) -> BackupSchedule:
        if not isinstance(doc, Mapping):
            raise ValueError(f"each schedule is an object, not {doc!r}")
        unknown = sorted(set(doc) - _FIELDS)
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))})")
        for required in ("name", "command", "schedule"):
            if not isinstance(doc.get(required), str) or not doc[required].strip():
                raise ValueError(f"{required!r} is required, as text")
        try:
            name = validate_name(doc["name"])
        except UsageError as exc:
            raise ValueError(str(exc)) from None
        if not _EXPRESSION.fullmatch(doc["schedule"]):
            raise ValueError(f"schedule {doc['schedule']!r} is not an EventBridge Scheduler expression, e.g. cron(0 2 * * ? *) or rate(1 day)")
        run_as = doc.get("run_as")
        if run_as is not None and (not isinstance(run_as, str) or not _USER.fullmatch(run_as)):
            raise ValueError(f"run_as {run_as!r} is not a user name")
        tag_key = doc.get("tag_key", DEFAULT_TAG_KEY)
        tag_value = doc.get("tag_value", name)
        for field, value in (("tag_key", tag_key), ("tag_value", tag_value)):
            if not isinstance(value, str) or not _TAG.fullmatch(value):
                raise ValueError(f"{field} {value!r} is not a tag {'key' if field == 'tag_key' else 'value'}")
        hours = doc.get("timeout_hours", MAX_TIMEOUT_HOURS)
        if isinstance(hours, bool) or not isinstance(hours, int) or not 1 <= hours <= MAX_TIMEOUT_HOURS:
            raise ValueError(f"timeout_hours must be a whole number of hours from 1 to {MAX_TIMEOUT_HOURS}, not {hours!r}")
        timezone = doc.get("timezone", "UTC")
        if not isinstance(timezone, str) or not timezone:
            raise ValueError(f"timezone {timezone!r} is not a time zone name")
        return cls(name, doc["command"].strip(), doc["schedule"], timezone, run_as, tag_key, tag_value, hours)

    def expected_hours(self) -> int:
        """After how many hours without a published backup of this name an alarm says so (braid_infra.monitoring).

        A schedule whose tag reaches no host sends its command to nobody, which SSM counts as a success, so
        no delivery alarm fires (review 3, L8): only the missing backup shows it. A rate() schedule expects one
        within its interval plus 2 hours; a cron() or at() one within a week (CloudWatch's longest window), unless
        braid:expectedBackups says otherwise.
        """
        rate = _RATE.fullmatch(self.schedule)
        if rate is None:
            return MAX_EXPECTED_HOURS
        hours = int(rate.group(1)) * {"minute": 1 / 60, "hour": 1, "day": 24}[rate.group(2)]
        return max(1, min(MAX_EXPECTED_HOURS, math.ceil(hours) + 2))

    def shell_command(self) -> str:
        """The line the host's shell runs: as `run_as` through runuser (a login-less switch that
        keeps no root privileges), with the command quoted so the user's own shell parses it."""
        if self.run_as is None:
            return self.command
        return f"runuser -u {self.run_as} -- sh -c {shlex.quote(self.command)}"

    def send_command_input(self) -> dict[str, Any]:
        """SendCommand's request, as EventBridge Scheduler passes it (the API's own field names)."""
        return {
            "DocumentName": DOCUMENT,
            "Targets": [{"Key": f"tag:{self.tag_key}", "Values": [self.tag_value]}],
            "Parameters": {"commands": [self.shell_command()], "executionTimeout": [str(self.timeout_hours * 3600)]},
            "Comment": f"Braid scheduled backup {self.name}"[:100],
            "MaxErrors": "0",
        }


def backup_schedules(value: Any) -> list[BackupSchedule]:
    """The schedules from a prop or context value (None: none); a bad value fails synth, naming it."""
    if value is None or value == "":
        return []
    try:
        doc = json.loads(value) if isinstance(value, str) else value
        if not isinstance(doc, Sequence) or isinstance(doc, (str, bytes)):
            raise ValueError("a list of schedules is expected")
        found = [BackupSchedule.from_json(item) for item in doc]
    except ValueError as exc:
        raise ValueError(
            f'{SCHEDULES_CONTEXT}: not a list of backup schedules ({exc}); e.g. [{{"name": "pg", "schedule": "cron(0 2 * * ? *)",'
            ' "run_as": "postgres", "command": "braid backup --name pg -- pg_basebackup -Ft -D - -X fetch -c fast"}]'
        ) from None
    names = [s.name for s in found]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"{SCHEDULES_CONTEXT}: two schedules for {duplicated[0]}; give each backup name one schedule")
    return found


class BackupSchedules(Construct):
    """One EventBridge Scheduler schedule per configured backup, in a group of the stack's own."""

    def __init__(self, scope: Construct, construct_id: str, *, schedules: Any = None) -> None:
        super().__init__(scope, construct_id)
        self.schedules = backup_schedules(schedules if schedules is not None else self.node.try_get_context(SCHEDULES_CONTEXT))
        self.group: scheduler.ScheduleGroup | None = None
        self.alarm: cloudwatch.Alarm | None = None
        if not self.schedules:
            return
        stack = Stack.of(self)
        self.group = scheduler.ScheduleGroup(self, "Group")
        document = stack.format_arn(service="ssm", account="", resource="document", resource_name=DOCUMENT)
        for item in self.schedules:
            instances = [
                stack.format_arn(service="ec2", resource="instance", resource_name="*"),
                stack.format_arn(service="ssm", resource="managed-instance", resource_name="*"),  # hybrid (on-premises) hosts
            ]
            # A role per schedule: one host tag per role, so no schedule can reach another's hosts.
            role = iam.Role(
                self,
                f"Role-{item.name}",
                assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": stack.account}}),
                description=f"Braid: EventBridge Scheduler sends the {item.name} backup command to its tagged hosts",
            )
            target = scheduler_targets.Universal(
                service="ssm",
                action="sendCommand",
                input=scheduler.ScheduleTargetInput.from_object(item.send_command_input()),
                policy_statements=[
                    iam.PolicyStatement(actions=["ssm:SendCommand"], resources=[document]),
                    iam.PolicyStatement(
                        actions=["ssm:SendCommand"],
                        resources=instances,
                        conditions={"StringEquals": {f"aws:ResourceTag/{item.tag_key}": item.tag_value}},
                    ),
                ],
                role=role,
                retry_attempts=2,
                max_event_age=Duration.hours(1),  # a backup that could not start within the hour waits for the next slot
            )
            scheduler.Schedule(
                self,
                f"Backup-{item.name}",
                schedule=scheduler.ScheduleExpression.expression(item.schedule, TimeZone.of(item.timezone)),
                target=target,
                schedule_group=self.group,
                description=f"Braid: back up {item.name} on hosts tagged {item.tag_key}={item.tag_value}",
            )
            policy = role.node.find_child("DefaultPolicy")
            reason = f"Hosts are chosen at run time by their tag: the statement allows only instances tagged {item.tag_key}={item.tag_value}."
            acknowledge(policy, wildcard("arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*"), reason)
            acknowledge(policy, wildcard("arn:<AWS::Partition>:ssm:<AWS::Region>:<AWS::AccountId>:managed-instance/*"), reason)
        self.alarm = cloudwatch.Metric(
            namespace="AWS/Scheduler",
            metric_name="TargetErrorCount",
            dimensions_map={"ScheduleGroup": self.group.schedule_group_name},
            period=Duration.hours(1),
            statistic="Sum",
        ).create_alarm(
            self,
            "DeliveryFailed",
            alarm_description="A scheduled Braid backup could not be sent to its hosts (SendCommand failed after retries)",
            threshold=1,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

