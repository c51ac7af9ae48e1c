"""Producer faults on the emulated cloud: the pipeline never publishes what a failed producer wrote.

The agent judges the producer (and refuses an empty stream) before it
writes the stream-end record the pipeline finalizes on; instead it writes
the record with `abandoned` set, so the execution fails at the planner's
next poll with the agent's reason, Cleanup removes the staging, and the
agent, which waited for that, exits 11 (or 5) with the producer's words.

Few tests, each a real agent CLI against one shared emulator (seconds each).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_emulated_e2e import BRAID, CHUNK, Emulator, MiB, Run, assert_within_policy, braid

from braid import contract
from braid.adapters.aws.stepfunctions import StepFunctionsExecutions
from braid.format.ids import BackupRef
from braid.pipeline import pacing
from support.db_tools import install, stream

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]



@pytest.fixture
def tools(tmp_path: Path) -> tuple[str, str]:
    dbtool, dbrestore = install(tmp_path / "bin")
    return str(dbtool), str(dbrestore)


# The longest a sleeping planner waits unwoken (pacing.sleep_plan, at the default stall window); the
# `cloud` emulator runs at time scale 1. Only a hang guard: tests wait for the execution's end itself.
NOT_WOKEN_SECONDS = min(pacing.SLEEP_MAX_SECONDS, contract.DEFAULT_STALL_SECONDS / 4)


def execution_end(cloud: Emulator, ref: str) -> str:
    """The execution of `ref` once it is no longer RUNNING (polled; bounded by a planner's longest unwoken wait and one watch)."""
    sfn = cloud.client("stepfunctions")
    arn = StepFunctionsExecutions(sfn, cloud.config()["cloud"]["state_machine_arn"]).execution_arn(BackupRef.parse(ref))
    guard = time.monotonic() + NOT_WOKEN_SECONDS + pacing.WATCH_SECONDS
    while (status := sfn.describe_execution(executionArn=arn)["status"]) == "RUNNING":
        assert time.monotonic() < guard, f"the pipeline did not give up on {ref}:\n{cloud.tail()}"
        time.sleep(0.5)
    return str(status)


def started(run: Run) -> str:
    (event,) = run.events("started")
    return str(event["backup"])


def assert_nothing_left(cloud: Emulator, caller: str, ref: str, reason: str) -> None:
    """No manifest, no chunk, no staging, no open upload; the execution failed with the agent's reason."""
    name, _, backup_id = ref.partition("@")
    assert cloud.keys(f"manifests/{name}/") == [] and cloud.keys(f"data/{name}/{backup_id}/") == []
    assert cloud.keys(f"staging/{name}/{backup_id}/") == [] and cloud.open_uploads(f"staging/{name}/") == []
    listed = braid(cloud, caller, "list", "--name", name, "--json")
    assert listed.code == 0 and json.loads(listed.stdout) == [], listed.stdout + listed.stderr
    status = braid(cloud, caller, "status", ref, "--once", "--json")
    assert status.code == 9, status.stderr
    assert json.loads(status.stdout)["status"] == "FAILED"
    (cause,) = status.errors
    assert cause.startswith(f"braid: error: backup {ref} failed (StreamAbandonedError): the agent abandoned backup {ref}: {reason}"), cause
    assert "Nothing was published" in cause


def test_a_producer_failing_mid_stream_fails_the_execution_at_once(cloud: Emulator, tools: tuple[str, str]) -> None:
    size = 12 * MiB
    began = time.monotonic()

    run = braid(cloud, "agent-producer", "backup", "--name", "pgfail", "--chunk-size", CHUNK, "--json", "--", tools[0],
                f"size={size},fail_at={7 * MiB},status=1,say=pg_basebackup: error: could not read WAL")

    waited = time.monotonic() - began
    assert run.code == 11, run.stderr + cloud.tail()
    assert run.stdout == ""
    message = 'the producer failed: dbtool exited with status 1 (its last stderr line: "pg_basebackup: error: could not read WAL"); nothing was published'
    assert run.errors == [f"braid: error: {message}"], run.stderr
    ref = started(run)
    (abandoned,) = run.events("abandoned")
    assert abandoned["reason"] == message
    assert_nothing_left(cloud, "agent-producer", ref, message)
    # At once: had the pipeline not been woken by the abandoned record, it would have slept until its
    # sleep's timeout (at time scale 1 here), so a bound below that tells the two apart whatever the load.
    assert waited < NOT_WOKEN_SECONDS, f"the agent waited {waited:.0f} s for the pipeline to give up"
    assert_within_policy(cloud, "agent-producer", "agent")


def test_an_empty_stream_from_producer_pipes_is_refused(cloud: Emulator, tools: tuple[str, str]) -> None:
    run = braid(cloud, "agent-empty", "backup", "--name", "pgempty", "--pipes", "2", "--json", "--", tools[0], "size=0", "{pipes}")

    assert run.code == 5, run.stderr + cloud.tail()
    (error,) = run.errors
    assert error.startswith("braid: error: the backup stream is empty (every input ended before its first byte); nothing was published"), error
    assert_nothing_left(cloud, "agent-empty", started(run), "the backup stream is empty")


def test_producer_pipes_round_trip_into_a_consumer(cloud: Emulator, tools: tuple[str, str]) -> None:
    size = 6 * MiB + 123

    run = braid(cloud, "agent-pipes2", "backup", "--name", "db2", "--pipes", "2", "--chunk-size", CHUNK, "--", tools[0], f"size={size}", "{pipes}")

    assert run.code == 0, run.stderr + cloud.tail()
    ref = run.stdout.strip()
    restored = braid(cloud, "restore-pipes2", "restore", ref, "--pipes", "--", tools[1], f"size={size}", "{pipes}")
    assert restored.code == 0, restored.stderr
    assert f"dbrestore: 2 input(s) of {size} bytes each, every byte as written" in restored.stderr
    one = braid(cloud, "restore-pipes2", "restore", ref, "--", tools[1], f"size={size}")
    assert one.code == 2 and one.errors[0].startswith(f"braid: error: backup {ref} has 2 inputs; give the command one pipe per input")
    assert stream(0, 10) != stream(1, 10)  # the two inputs differ, so a swapped restore would fail the check


def test_sigterm_to_the_agent_reaches_the_producer_and_the_pipeline_gives_up(cloud: Emulator, tools: tuple[str, str], tmp_path: Path) -> None:
    ready, trapped = tmp_path / "ready", tmp_path / "trapped"
    spec = f"size={12 * MiB},fail_at={6 * MiB},hang=1,ready={ready},trap={trapped}"
    agent = subprocess.Popen(
        [str(BRAID), "backup", "--name", "pgterm", "--chunk-size", CHUNK, "--json", "--", tools[0], spec],
        env=cloud.braid_env("agent-term"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert agent.poll() is None and time.monotonic() < deadline, "the producer did not start"
        time.sleep(0.05)

    agent.send_signal(signal.SIGTERM)
    out, err = agent.communicate(timeout=60)

    run = Run(agent.returncode, out.decode(), err.decode())
    assert run.code == 130 and run.stderr.splitlines()[-1] == "braid: interrupted", run.stderr
    assert trapped.read_text() == "SIGTERM\n"
    ref = started(run)
    (event,) = run.events("started")  # no --resume hint: a rerun of the command would write a new stream
    assert event["message"] == f"braid: backup {ref} started; its command's stream cannot be resumed: if interrupted, run the backup again"
    # The agent did not wait; the pipeline fails once it reads the abandoned stream-end record, and Cleanup
    # removes the staging before the execution fails: wait for the execution to end (the event).
    assert execution_end(cloud, ref) == "FAILED"
    assert_nothing_left(cloud, "agent-term", ref, "the agent was interrupted")
