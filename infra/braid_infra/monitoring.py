"""Monitoring: alarms that reach someone, and one dashboard.

Every alarm notifies one SNS topic; an e-mail address from the CDK context
`braid:alarmEmail` (a string or a list) subscribes to it, and any other
subscriber (a pager, a chat webhook) can be added to the topic output. The
topic is encrypted with a key of its own: CloudWatch cannot publish to a
topic under the AWS-managed SNS key, so that key's policy lets the
CloudWatch service use it, for this account's alarms only.

Alarms: failed or timed-out backup executions; failed map-run children
(the workers' EXPRESS executions, whose metrics AWS files under the map's
label); Lambda errors (synchronous Step Functions invokes: no DLQ, so the
Errors metric is the signal, and worker errors that retries absorbed still
show); sustained worker throttling; the scheduled maintenance nearing its
timeout (it may then not start the prune); the VerifyFailures
metric (EMF, namespace Braid) of the scheduled and the cloud verify; failed
or timed-out verify executions; prune executions failed or timed out, and
prune runs whose items failed (PruneFailures: their data waits for the next
run), so retention never stops silently; and any alarm another construct
hands in (the backup schedules' delivery failures); and a backup staged for more
than a day (OldestStagingHours, measured by the daily maintenance).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from braid import contract

ALARM_EMAIL_CONTEXT = "braid:alarmEmail"
EXPECTED_BACKUPS_CONTEXT = "braid:expectedBackups"  # {"NAME": hours}: alarm when NAME has no published backup for that long
MAX_EXPECTED_HOURS = 168  # CloudWatch evaluates at most 7 days of hourly datapoints
MAP_LABEL = "chunks"  # the Distributed Map's label (braid_infra.pipeline): AWS names its children's metrics by it
MAINTENANCE_NEAR_TIMEOUT = 0.8  # of the function's timeout


def alarm_emails(value: object) -> list[str]:
    """Addresses from a context value: one string, a comma-separated string, or a list; a bad one fails synth."""
    if value is None or value == "":
        return []
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"{ALARM_EMAIL_CONTEXT}: an e-mail address or a list of them, not {value!r}")
    found = [i.strip() for i in items if i.strip()]
    for address in found:
        local, at, domain = address.partition("@")
        if not (local and at and "." in domain and " " not in address):
            raise ValueError(f"{ALARM_EMAIL_CONTEXT}: {address!r} is not an e-mail address")
    return found


def expected_backups(value: object) -> dict[str, int]:
    """{backup name: hours} from a context value (an object, or its JSON text); a bad one fails synth."""
    import json

    from braid.errors import UsageError
    from braid.format.ids import validate_name

    if value is None or value == "":
        return {}
    doc = json.loads(value) if isinstance(value, str) else value
    if not isinstance(doc, dict):
        raise ValueError(f'{EXPECTED_BACKUPS_CONTEXT}: an object of backup name to hours, e.g. {{"pg": 26}}, not {value!r}')
    for name, hours in doc.items():
        try:
            validate_name(name)
        except UsageError as exc:
            raise ValueError(f"{EXPECTED_BACKUPS_CONTEXT}: {exc}") from None
        if isinstance(hours, bool) or not isinstance(hours, int) or not 1 <= hours <= MAX_EXPECTED_HOURS:
            raise ValueError(f"{EXPECTED_BACKUPS_CONTEXT}: {name}: hours must be a whole number from 1 to {MAX_EXPECTED_HOURS}, not {hours!r}")
    return dict(doc)


class Monitoring(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        state_machine: sfn.StateMachine,
        prune_state_machine: sfn.StateMachine,
        functions: dict[str, lambda_.Function],
        verify_state_machine: sfn.StateMachine | None = None,
        extra_alarms: Sequence[cloudwatch.Alarm] = (),
        alarm_emails_value: object = None,
        expected_backups_value: object = None,
        scheduled_backups: Mapping[str, int] | None = None,
    ) -> None:
        """`scheduled_backups`: {name: hours} the backup schedules imply (BackupSchedule.expected_hours); each gets a
        freshness alarm unless braid:expectedBackups names it with hours of its own."""
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        period = Duration.minutes(5)
        key = kms.Key(self, "TopicKey", enable_key_rotation=True, description="Braid alarm topic")
        key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy, "*" is this key
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            )
        )
        self.topic = sns.Topic(self, "Alarms", display_name="Braid alarms", master_key=key, enforce_ssl=True)
        emails = alarm_emails(alarm_emails_value if alarm_emails_value is not None else self.node.try_get_context(ALARM_EMAIL_CONTEXT))
        for address in emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(address))
        CfnOutput(self, "AlarmTopicArn", value=self.topic.topic_arn, description="Subscribe pagers or chat to Braid's alarms")

        def alarm(metric: cloudwatch.IMetric, name: str, description: str, threshold: float = 1, periods: int = 1) -> cloudwatch.Alarm:
            return metric.create_alarm(
                self,
                name,
                alarm_description=description,
                threshold=threshold,
                evaluation_periods=periods,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )

        def daily_sum(metric: str) -> cloudwatch.Metric:
            """A count the handlers emit (EMF, namespace Braid), summed per day: a scheduled job's failures."""
            return cloudwatch.Metric(
                namespace=contract.METRICS_NAMESPACE, metric_name=metric, dimensions_map={"service": contract.SERVICE_NAME},
                period=Duration.days(1), statistic="Sum",
            )

        children = f"{state_machine.state_machine_arn}/{MAP_LABEL}"
        maintenance = functions["verify"]
        timeout = maintenance.timeout.to_milliseconds() if maintenance.timeout else 900_000
        self.alarms: list[cloudwatch.Alarm] = [
            alarm(state_machine.metric_failed(period=period), "BackupsFailed", "A Braid backup execution failed; its cause says what to do"),
            alarm(state_machine.metric_timed_out(period=period), "BackupsTimedOut", "A Braid backup execution timed out"),
            # A child whose worker failed after its retries ends in ItemFailed, a success (braid_infra.pipeline): the
            # worker's own Errors alarm (below) sees those failures; a child past the EXPRESS 5 minutes still times out.
            alarm(
                cloudwatch.Metric(namespace="AWS/States", metric_name="ExecutionsTimedOut", dimensions_map={"StateMachineArn": children}, period=period, statistic="Sum"),
                "MapRunChildrenTimedOut",
                "Braid worker child executions hit the EXPRESS 5-minute limit",
            ),
            alarm(
                functions["worker"].metric_throttles(period=period),
                "WorkerThrottled",
                "Braid workers are throttled for 15 minutes: raise the account's Lambda concurrency or lower --fan-out",
                threshold=10,
                periods=3,
            ),
            alarm(
                maintenance.metric_duration(period=Duration.hours(1), statistic="Maximum"),
                "MaintenanceNearTimeout",
                f"Braid's scheduled maintenance ran past {MAINTENANCE_NEAR_TIMEOUT:.0%} of its timeout: it may not start the prune",
                threshold=timeout * MAINTENANCE_NEAR_TIMEOUT,
            ),
            alarm(
                prune_state_machine.metric_failed(period=period),
                "PruneFailed",
                "A Braid prune run failed: retention did not finish; the execution's history names the step and its error",
            ),
            alarm(prune_state_machine.metric_timed_out(period=period), "PruneTimedOut", "A Braid prune run timed out: retention did not finish"),
            alarm(
                daily_sum(contract.METRIC_PRUNE_FAILURES),
                "PruneItemsFailed",
                "A Braid prune run could not delete some data (it has no manifest: the next run collects it); see the run's report",
            ),
            alarm(
                cloudwatch.Metric(
                    namespace=contract.METRICS_NAMESPACE, metric_name=contract.METRIC_OLDEST_STAGING_HOURS,
                    dimensions_map={"service": contract.SERVICE_NAME}, period=Duration.days(1), statistic="Maximum",
                ),
                "StagingOlderThanADay",
                f"A Braid backup has been in staging for more than {contract.STAGING_ALARM_HOURS} hours: stuck, held for --resume,"
                " or abandoned by a host that died ('braid list --incomplete' names it)",
                threshold=contract.STAGING_ALARM_HOURS,
            ),
            alarm(
                daily_sum(contract.METRIC_VERIFY_FAILURES),
                "VerifyFailed",
                "A Braid verify found a damaged backup, or could not check some of its chunks: see its Verify Failed event",
            ),
        ]
        if verify_state_machine is not None:
            self.alarms += [
                alarm(verify_state_machine.metric_failed(period=period), "VerifyRunsFailed", "A Braid verify execution failed: its backups were not checked"),
                alarm(verify_state_machine.metric_timed_out(period=period), "VerifyRunsTimedOut", "A Braid verify execution timed out"),
            ]
        for name, function in functions.items():
            self.alarms.append(
                alarm(
                    function.metric_errors(period=period),
                    f"{name.capitalize()}Errors",
                    f"Braid {name} function errors (no DLQ: synchronous Step Functions invokes)",
                    threshold=5 if name in ("worker", "sweep") else 1,  # map items: retries absorb a few
                )
            )
        # Freshness: Finalize counts each published backup under its name; an hour with none is
        # missing data, so H missing hours in a row (treated as breaching) is "no backup for H hours".
        expected = {
            **(scheduled_backups or {}),
            **expected_backups(
                expected_backups_value if expected_backups_value is not None else self.node.try_get_context(EXPECTED_BACKUPS_CONTEXT)
            ),
        }
        for name, hours in sorted(expected.items()):
            self.alarms.append(
                cloudwatch.Metric(
                    namespace=contract.METRICS_NAMESPACE,
                    metric_name=contract.METRIC_BACKUP_PUBLISHED,
                    dimensions_map={"service": contract.SERVICE_NAME, contract.DIMENSION_BACKUP_NAME: name},
                    period=Duration.hours(1),
                    statistic="Sum",
                ).create_alarm(
                    self,
                    f"NoBackup-{name}",
                    alarm_description=f"No Braid backup of {name} was published in the last {hours} hours",
                    threshold=1,
                    evaluation_periods=hours,
                    datapoints_to_alarm=hours,
                    comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
                    treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
                )
            )
        self.alarms.extend(extra_alarms)
        action = cw_actions.SnsAction(self.topic)
        for each in self.alarms:
            each.add_alarm_action(action)

        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{stack.stack_name}-braid")
        worker = functions["worker"]
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Backups",
                left=[state_machine.metric_started(), state_machine.metric_succeeded(), state_machine.metric_failed(), state_machine.metric_timed_out()],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Workers",
                left=[worker.metric_invocations(), worker.metric_errors(), worker.metric_throttles()],
                right=[worker.metric_duration(statistic="p90")],
                width=12,
            ),
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=self.alarms, width=24),
        )
