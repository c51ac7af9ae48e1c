"""How many DescribeExecution calls concurrent backups' agents make, against the account's quota (scripts/bench cloud-model).

Step Functions throttles DescribeExecution per account and Region with a
token bucket. Published defaults (AWS Step Functions Developer Guide,
"Quotas", section "Other quotas", read 2026-11-28): bucket 300, refill
15 per second in US East (N. Virginia), US West (Oregon) and Europe
(Ireland); bucket 250, refill 10 per second in every other Region. The
model holds the agents to the lower refill, since a burst bucket empties.

The agent's calls are counted, not assumed: `follow` drives the
agent's own wait loop (braid.agent.cloud_engine.CloudEngine.wait) on a
simulated clock with a counting Executions, and the upload phase's watch
(braid.agent.watch) calls once per `watch_seconds`. The rows then scale the
per-backup rate by the number of backups in that phase at once; the worst
case is every backup in the same phase (backups scheduled for the same hour).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

QUOTA_SOURCE = "AWS Step Functions Developer Guide, Quotas, Other quotas (DescribeExecution), read 2026-11-28"
DESCRIBE_REFILL_PER_S = {"us-east-1, us-west-2, eu-west-1": 15.0, "other Regions": 10.0}
DESCRIBE_BUCKET = {"us-east-1, us-west-2, eu-west-1": 300, "other Regions": 250}
LOWEST_REFILL = min(DESCRIBE_REFILL_PER_S.values())
CONCURRENT_BACKUPS: Sequence[int] = (10, 100, 300, 1000)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)

    def __getattr__(self, name: str) -> Any:  # time.time and friends, untouched
        import time

        return getattr(time, name)


def follow(done_at: float, *, staged_until: float | None = None, poll_seconds: float | None = None, watch_seconds: float | None = None) -> tuple[int, float]:
    """(DescribeExecution calls, simulated seconds) of the agent's wait loop following an execution that ends at
    `done_at`, its staging session removed at `staged_until` (Finalize's or Cleanup's purge; None: never, an
    execution stopped from outside). The execution ends FAILED here, so the loop needs no manifest; it leaves the
    same way on SUCCEEDED."""
    from braid.adapters.local.store import LocalStore
    from braid.agent import cloud_engine
    from braid.agent.cloud_engine import CloudEngine, CloudOptions
    from braid.errors import ExecutionError
    from braid.format.ids import BackupRef
    from braid.format.repository import Repository, RepositoryConfig
    from braid.format.staging.keys import session_key
    from braid.format.timestamps import utc_now
    from braid.ports.executions import ExecutionStatus

    defaults = CloudOptions()
    options = CloudOptions(
        poll_seconds=defaults.poll_seconds if poll_seconds is None else poll_seconds,
        watch_seconds=defaults.watch_seconds if watch_seconds is None else watch_seconds,
    )
    clock = _Clock()
    ref = BackupRef.new("db")
    key = session_key(ref)
    calls = [0]

    class Counting:
        def describe(self, _ref: BackupRef) -> ExecutionStatus:
            calls[0] += 1
            return ExecutionStatus("arn", "FAILED" if clock.now >= done_at else "RUNNING", "Model", "counted")

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the wait loop called Executions.{name}")

    with tempfile.TemporaryDirectory() as root:
        store = LocalStore(Path(root))
        repository = Repository.create(store, RepositoryConfig.new(
            {"type": "kms", "key_id": "arn:aws:kms:us-east-1:111122223333:key/model"}, utc_now(), {}
        ))
        store.put(key, b"{}")
        sleep = clock.sleep

        def sleep_then_purge(delay: float) -> None:
            sleep(delay)
            if staged_until is not None and clock.now >= staged_until and store.head(key) is not None:
                store.delete([key])

        clock.sleep = sleep_then_purge  # type: ignore[method-assign]
        engine = CloudEngine(repository, options, uploads=None, executions=Counting(), prefix="")  # type: ignore[arg-type]
        real = cloud_engine.time
        cloud_engine.time = clock  # type: ignore[assignment]
        try:
            engine.wait(ref, lambda _event: None)
        except ExecutionError:
            pass
        finally:
            cloud_engine.time = real  # type: ignore[assignment]
    return calls[0], clock.now


def rows(processing_seconds: float = 600.0) -> list[dict[str, Any]]:
    """Per count of concurrent backups: DescribeExecution calls per second with all of them uploading, and with all
    of them waiting for their pipelines, against the lowest published refill."""
    from braid.agent.cloud_engine import CloudOptions

    options = CloudOptions()
    waiting_per_backup = follow(processing_seconds + 4.0, staged_until=processing_seconds)[0] / processing_seconds
    uploading_per_backup = 1.0 / options.watch_seconds
    polled_every_poll = 1.0 / options.poll_seconds  # what the loop did before it asked S3 first
    out = []
    for backups in CONCURRENT_BACKUPS:
        waiting = backups * waiting_per_backup
        uploading = backups * uploading_per_backup
        out.append({
            "concurrent_backups": backups,
            "uploading_calls_per_s": round(uploading, 2),
            "waiting_calls_per_s": round(waiting, 2),
            "waiting_calls_per_s_if_every_poll": round(backups * polled_every_poll, 2),
            "quota_refill_per_s": LOWEST_REFILL,
            "within_quota": max(waiting, uploading) <= LOWEST_REFILL,
        })
    return out
