"""A cloud backup's progress on the emulated cloud: the same vocabulary as a local one, and a summary with real totals.

The agent CLI runs against `scripts/emulated-aws` (see test_emulated_e2e),
once with --json and a --log-file, once on a pseudo-terminal as a person
watches it; then the backup is restored with --json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_emulated_e2e import CHUNK, Emulator, MiB, braid, stream_bytes

from braid.ports.progress import SCHEMA_VERSION
from test_progress_events import kinds, parse_events, run_on_terminal

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]
SIZE = 12 * MiB + 12345  # three 5 MiB chunks, the last one short



@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "base.tar"
    path.write_bytes(stream_bytes(SIZE, seed=7))
    return path


def test_a_cloud_backup_and_its_restore_report_in_the_one_vocabulary(cloud: Emulator, source: Path, tmp_path: Path) -> None:
    log = tmp_path / "braid.jsonl"
    run = braid(cloud, "agent", "backup", "--name", "prog", "--chunk-size", CHUNK, "--input", str(source), "--json", "--log-file", str(log))
    assert run.code == 0, run.stderr
    events = parse_events(run.stderr)
    assert parse_events(log.read_text()) == events  # the log holds the same documents
    order = kinds(events)
    assert order[:3] == ["started", "phase:uploading", "upload"], order
    # finalizing: once the workers processed every chunk (the last status count may follow it), or once the execution succeeded
    assert order.index("stream-end") < order.index("phase:processing") < order.index("phase:finalizing"), order
    assert order[order.index("phase:finalizing") :] in (["phase:finalizing", "done"], ["phase:finalizing", "status", "done"]), order
    (uploading,) = [e for e in events if e["event"] == "phase" and e["phase"] == "uploading"]
    assert (uploading["total_bytes"], uploading["total_chunks"]) == (SIZE, 3)  # a regular file: its size is known
    uploads = [e for e in events if e["event"] == "upload"]  # thinned to two a second, but the last one is kept
    assert all(0 < e["bytes"] == e["bytes_uploaded"] <= SIZE and e["total_bytes"] == SIZE for e in uploads)
    assert [e["bytes"] for e in uploads] == sorted(e["bytes"] for e in uploads)
    assert (uploads[-1]["bytes"], uploads[-1]["chunks"]) == (SIZE, 3)
    (end,) = [e for e in events if e["event"] == "stream-end"]
    assert (end["bytes"], end["bytes_read"], end["chunks"]) == (SIZE, SIZE, 3)
    assert all(e["phase"] in ("processing", "finalizing") and e["total_chunks"] == 3 for e in events if e["event"] == "status")
    done = events[-1]
    assert (done["operation"], done["bytes"], done["chunks"], done["engine"]) == ("backup", SIZE, 3, "stepfunctions")
    assert 0 < done["stored_bytes"] < SIZE and done["rate"] > 0
    summary = json.loads(run.stdout)
    assert (summary["schema_version"], summary["status"], summary["backup"], summary["bytes"]) == (SCHEMA_VERSION, "published", done["backup"], SIZE)

    out = tmp_path / "restored"
    restored = braid(cloud, "restore", "restore", done["backup"], "--output", str(out), "--json")
    assert restored.code == 0, restored.stderr
    assert out.read_bytes() == source.read_bytes()
    events = parse_events(restored.stderr)
    assert kinds(events)[0] == "phase:restoring" and (events[0]["total_bytes"], events[0]["total_chunks"]) == (SIZE, 3)
    assert (events[-1]["event"], events[-1]["bytes"], events[-1]["chunks"]) == ("done", SIZE, 3)
    assert json.loads(restored.stdout)["bytes"] == SIZE


def test_a_cloud_backup_on_a_terminal_ends_with_its_real_totals(cloud: Emulator, source: Path) -> None:
    """The summary line once read `0 B 0 chunks`: the done event and the upload used other names."""
    env = cloud.braid_env("agent")
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    code, out, text = run_on_terminal("backup", "--name", "progtty", "--chunk-size", CHUNK, "--input", str(source), stdin=source, env=env, timeout=180)
    assert code == 0, text
    ref = out.strip()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0].startswith(f"braid: backup {ref} started; if interrupted, continue with 'braid backup --resume {ref} ...'"), lines
    assert any(line.startswith("uploading") for line in lines), lines
    assert lines[-1].startswith(f"{ref}: backed up 12 MiB in 3 chunks, stored "), lines


def test_a_no_wait_backup_and_status_print_versioned_json(cloud: Emulator, source: Path) -> None:
    staged = braid(cloud, "agent", "backup", "--name", "prognw", "--chunk-size", CHUNK, "--input", str(source), "--no-wait", "--json")
    assert staged.code == 0, staged.stderr
    doc = json.loads(staged.stdout)
    assert (doc["schema_version"], doc["status"], doc["name"]) == (SCHEMA_VERSION, "staged", "prognw")
    assert kinds(parse_events(staged.stderr))[-1] == "stream-end"
    once = json.loads(braid(cloud, "agent", "status", doc["backup"], "--once", "--json").stdout)
    assert once["schema_version"] == SCHEMA_VERSION and once["chunks"] == once["chunks_done"]
    followed = braid(cloud, "agent", "status", doc["backup"], "--json")
    assert followed.code == 0, followed.stderr
    events = parse_events(followed.stderr)
    assert kinds(events)[0] == "phase:processing" and (events[-1]["event"], events[-1]["bytes"]) == ("done", SIZE)
    assert json.loads(followed.stdout)["bytes"] == SIZE
