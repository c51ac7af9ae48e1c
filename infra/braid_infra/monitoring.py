"""Monitoring: alarms on what needs a person.

Failed or timed-out backup executions; Lambda errors (the functions are
invoked synchronously by Step Functions, so there is no DLQ: the Errors
metric is the signal, and worker errors that retries absorbed still show);
and the scheduled verify's own VerifyFailures metric (EMF, namespace Braid).
Alarms carry no actions here: wire them to the team's SNS topic or pager.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from braid import contract


class Monitoring(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, state_machine: sfn.StateMachine, functions: dict[str, lambda_.Function]
    ) -> None:
        super().__init__(scope, construct_id)
        period = Duration.minutes(5)
        self.alarms: list[cloudwatch.Alarm] = [
            state_machine.metric_failed(period=period).create_alarm(
                self,
                "BackupsFailed",
                alarm_description="A Braid backup execution failed; its cause says what to do",
                threshold=1,
                evaluation_periods=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            ),
            state_machine.metric_timed_out(period=period).create_alarm(
                self,
                "BackupsTimedOut",
                alarm_description="A Braid backup execution timed out",
                threshold=1,
                evaluation_periods=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            ),
            cloudwatch.Metric(
                namespace=contract.METRICS_NAMESPACE,
                metric_name=contract.METRIC_VERIFY_FAILURES,
                dimensions_map={"service": contract.SERVICE_NAME},
                period=Duration.days(1),
                statistic="Sum",
            ).create_alarm(
                self,
                "VerifyFailed",
                alarm_description="Scheduled deep verify found a damaged backup",
                threshold=1,
                evaluation_periods=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            ),
        ]
        for name, function in functions.items():
            self.alarms.append(
                function.metric_errors(period=period).create_alarm(
                    self,
                    f"{name.capitalize()}Errors",
                    alarm_description=f"Braid {name} function errors (no DLQ: synchronous Step Functions invokes)",
                    threshold=5 if name == "worker" else 1,
                    evaluation_periods=1,
                    treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                )
            )
