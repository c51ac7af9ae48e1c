"""The agent's DescribeExecution calls stay within the account's quota for 100 concurrent backups (issue 22, item 7).

Counted from the agent's own wait loop on a simulated clock
(bench_lib.api_quota.follow); the quota is the published default for
DescribeExecution (refill 10 per second outside the three largest Regions),
written here from AWS's quota page, not read from the model.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from bench_lib import api_quota  # noqa: E402
from bench_lib.benchmarks.cloud_model import describe_table  # noqa: E402
from braid.agent.cloud_engine import CloudOptions  # noqa: E402

REFILL_PER_S = 10.0  # DescribeExecution, every Region but us-east-1, us-west-2 and eu-west-1


def test_waiting_asks_step_functions_once_a_watch_period_while_staging_is_in_place() -> None:
    options = CloudOptions()
    calls, ended = api_quota.follow(604.0, staged_until=600.0)
    assert ended == 604.0  # seen at the first poll once done
    assert 600 / options.watch_seconds <= calls <= 600 / options.watch_seconds + 1 + 4 / options.poll_seconds + 1


def test_a_finished_pipeline_is_seen_within_a_poll_of_its_staging_going() -> None:
    options = CloudOptions()
    calls, ended = api_quota.follow(101.0, staged_until=100.0)
    assert ended - 101.0 < options.poll_seconds


def test_an_execution_that_ends_without_cleanup_is_seen_within_a_watch_period() -> None:
    options = CloudOptions()
    _, ended = api_quota.follow(100.0)
    assert 100.0 <= ended <= 100.0 + options.watch_seconds


def test_before_the_change_every_poll_asked_and_100_backups_would_exceed_the_quota() -> None:
    """The bound has teeth: polling DescribeExecution at every poll (watch = poll) is 50 calls/s for 100 backups."""
    options = CloudOptions()
    calls, _ = api_quota.follow(604.0, staged_until=600.0, watch_seconds=options.poll_seconds)
    assert 100 * calls / 600 > REFILL_PER_S


def test_100_concurrent_backups_stay_within_the_published_refill() -> None:
    row = next(r for r in api_quota.rows() if r["concurrent_backups"] == 100)
    assert max(row["uploading_calls_per_s"], row["waiting_calls_per_s"]) <= REFILL_PER_S
    assert row["within_quota"] and row["quota_refill_per_s"] == REFILL_PER_S
    table = describe_table()
    assert "DescribeExecution" in table.title and len(table.rows) == len(api_quota.CONCURRENT_BACKUPS)
    moved = [r["waiting_calls_per_s"] for r in api_quota.rows()]
    assert moved == sorted(moved) and moved[-1] > REFILL_PER_S  # the table shows where the quota is crossed
