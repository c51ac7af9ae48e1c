"""Logging, tracing and metrics every pipeline Lambda shares (AWS Lambda Powertools).

One Logger, Tracer and Metrics per container, named from braid.contract, so
the stack's alarms and dashboards (infra/) and the code agree on the service
and namespace. `pipeline_handler` wraps every handler alike: structured JSON
logs with the Lambda context and the event's backup on every line, an X-Ray
segment, and its metrics flushed as EMF when it returns or raises. Only the
handlers (functions/*/app.py) import this: the steps run anywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric
from aws_lambda_powertools.utilities.typing import LambdaContext

from braid import contract

logger = Logger(service=contract.SERVICE_NAME)
tracer = Tracer(service=contract.SERVICE_NAME)
metrics = Metrics(namespace=contract.METRICS_NAMESPACE, service=contract.SERVICE_NAME)

R = TypeVar("R")

__all__ = ["LambdaContext", "MetricUnit", "add_metrics", "count_for_backup_name", "logger", "memory_mb", "metrics", "pipeline_handler", "tracer"]

# Lambda's default memory, for a context that does not say (a handler called without one).
DEFAULT_MEMORY_MB = 128


def memory_mb(context: LambdaContext | None) -> int:
    """The invocation's memory (what its duration is billed at): the context's `memory_limit_in_mb`."""
    try:
        return int(context.memory_limit_in_mb) if context is not None else DEFAULT_MEMORY_MB
    except (AttributeError, TypeError, ValueError):
        return DEFAULT_MEMORY_MB


def pipeline_handler(handler: Callable[[dict[str, Any], LambdaContext], R]) -> Callable[[dict[str, Any], LambdaContext], R]:
    """Wrap a Lambda handler: fresh log keys per invocation, then `backup` from the event, tracing, metrics."""

    @functools.wraps(handler)
    def with_backup(event: dict[str, Any], context: LambdaContext) -> R:
        backup = event.get("backup") if isinstance(event, Mapping) else None
        if backup is not None:
            logger.append_keys(backup=str(backup))
        return handler(event, context)

    traced = tracer.capture_lambda_handler(metrics.log_metrics(with_backup))
    wrapped: Callable[[dict[str, Any], LambdaContext], R] = logger.inject_lambda_context(clear_state=True)(traced)
    return wrapped


def add_metrics(values: Mapping[str, tuple[MetricUnit, float]]) -> None:
    """Add several metrics of this invocation at once: {name: (unit, value)}."""
    for name, (unit, value) in values.items():
        metrics.add_metric(name=name, unit=unit, value=value)


def count_for_backup_name(metric: str, backup_name: str) -> None:
    """One count of `metric` under its own dimensions (service, backup name), written at once: a backup_name
    dimension on the shared metrics would split every other metric per name (docs/design/2026-11-cloud-figures.md)."""
    with single_metric(
        name=metric, unit=MetricUnit.Count, value=1, namespace=contract.METRICS_NAMESPACE, default_dimensions={"service": contract.SERVICE_NAME}
    ) as named:
        named.add_dimension(name=contract.DIMENSION_BACKUP_NAME, value=backup_name)

