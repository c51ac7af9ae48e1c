"""Progress and JSON: one event vocabulary (braid.ports.progress), docs/usage.md's tables of it, --json, --quiet, --log-file.

Local backups and restores run the real CLI as a subprocess; the cloud
backup's events are checked the same way in tests/cloud/test_progress_cloud.py.
The terminal line is checked on a pseudo-terminal, as a person would see it.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from braid.cli.progress import Progress, open_log
from braid.cli.progress_view import ProgressView, summary_line
from braid.format.timestamps import parse_timestamp
from braid.ports.progress import COMMON_FIELDS, EVENTS, PHASES, SCHEMA_VERSION, event_problems
from conftest import BRAID, ROOT, run_braid

pytestmark = pytest.mark.e2e
CHUNK = "64KiB"
SIZE = 300_000  # five chunks, the last one short


def data(size: int = SIZE) -> bytes:
    rows = b"".join(b"%08d|customer-%d\n" % (i, i % 977) for i in range(size // 20 + 1))
    return (rows[: size // 2] + os.urandom(size))[:size]


def parse_events(stderr: str) -> list[dict[str, Any]]:
    """Every line on stderr is a JSON event that conforms to the vocabulary."""
    events = [json.loads(line) for line in stderr.splitlines()]
    problems = [p for e in events for p in event_problems(e)]
    assert problems == [], (problems, stderr)
    for event in events:
        parse_timestamp(event["time"])  # the one timestamp form
    return events


def kinds(events: list[dict[str, Any]]) -> list[str]:
    """Event names in order, runs of counting events collapsed (how many depends on timing)."""
    names: list[str] = []
    for event in events:
        name = event["event"] if event["event"] != "phase" else f"phase:{event['phase']}"
        if not names or names[-1] != name:
            names.append(name)
    return names


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "base.tar"
    path.write_bytes(data())
    return path


# -- the vocabulary ------------------------------------------------------------------


def test_a_local_backup_and_its_restore_report_in_the_vocabulary_with_totals(repo: Path, source: Path, tmp_path: Path) -> None:
    backed = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK, "--json", "--input", str(source))
    assert backed.code == 0, backed.stderr
    events = parse_events(backed.stderr)
    assert kinds(events)[0] == "phase:reading" and kinds(events)[-2:] == ["phase:finalizing", "done"], kinds(events)
    assert set(kinds(events)) == {"phase:reading", "chunk", "phase:finalizing", "done"}
    reading = events[0]
    assert (reading["total_bytes"], reading["total_chunks"]) == (SIZE, 5)  # a regular file: its size is known
    chunks = [e for e in events if e["event"] == "chunk"]
    assert all(e["phase"] == "reading" and e["total_bytes"] == SIZE and 0 < e["bytes"] <= SIZE for e in chunks)
    assert all(e["ratio"] == round(e["stored_bytes"] / e["bytes"], 4) for e in chunks)
    assert (chunks[-1]["bytes"], chunks[-1]["chunks"]) == (SIZE, 5)  # thinned to two a second, but each phase's last count is kept
    done = events[-1]
    assert (done["operation"], done["bytes"], done["plaintext_bytes"], done["chunks"]) == ("backup", SIZE, SIZE, 5)
    assert done["stored_bytes"] > 0 and done["ratio"] == round(done["stored_bytes"] / SIZE, 4) and done["rate"] > 0

    # stdout: one JSON document, the same figures as the done event
    (line,) = backed.out.splitlines()
    summary = json.loads(line)
    assert summary["schema_version"] == SCHEMA_VERSION and summary["status"] == "published"
    assert {k: summary[k] for k in ("backup", "name", "id", "bytes", "stored_bytes", "chunks", "ratio", "engine")} == {
        k: done[k] for k in ("backup", "name", "id", "bytes", "stored_bytes", "chunks", "ratio", "engine")
    }
    assert summary["name"] == "db" and summary["engine"] == "local" and summary["elapsed"] > 0

    out = tmp_path / "restored"
    restored = run_braid("restore", "--repo", str(repo), summary["backup"], "--output", str(out), "--json")
    assert restored.code == 0, restored.stderr
    assert out.read_bytes() == source.read_bytes()
    events = parse_events(restored.stderr)
    assert kinds(events)[0] == "phase:restoring" and kinds(events)[-1] == "done"
    assert (events[0]["total_bytes"], events[0]["total_chunks"]) == (SIZE, 5)  # from the manifest
    assert (events[-1]["operation"], events[-1]["bytes"], events[-1]["chunks"]) == ("restore", SIZE, 5)
    assert (events[-2]["event"], events[-2]["bytes"], events[-2]["chunks"]) == ("chunk", SIZE, 5)
    result = json.loads(restored.out)
    assert (result["schema_version"], result["operation"], result["bytes"], result["backup"]) == (SCHEMA_VERSION, "restore", SIZE, summary["backup"])


def test_a_stream_of_unknown_length_has_no_totals(repo: Path) -> None:
    """stdin from a pipe: no size to take a percentage of."""
    proc = subprocess.run(
        f"cat | {BRAID} backup --repo {repo} --name db --chunk-size {CHUNK}", shell=True, input=data(), capture_output=True, env=os.environ, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    events = parse_events(proc.stderr.decode())
    assert (events[0]["phase"], events[0]["total_bytes"], events[0]["total_chunks"]) == ("reading", None, None)
    assert events[-1]["bytes"] == SIZE
    assert proc.stdout.decode().strip() == events[-1]["backup"]  # without --json: NAME@ID, as before


def test_restore_to_stdout_with_json_keeps_stdout_for_the_data(repo: Path, source: Path) -> None:
    ref = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK, "--input", str(source)).out.strip()
    restored = run_braid("restore", "--repo", str(repo), ref, "--json")
    assert (restored.code, restored.stdout) == (0, source.read_bytes())
    assert parse_events(restored.stderr)[-1]["event"] == "done"


def test_every_json_document_carries_the_schema_version(repo: Path, source: Path) -> None:
    ref = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK, "--input", str(source)).out.strip()
    documents: dict[str, Any] = {}
    for words in (["list"], ["list", "--incomplete"], ["show", ref], ["verify", ref], ["prune", "--keep-last", "1", "--dry-run"],
                  ["prune", "--show-policy"], ["prune", "--name", "db", "--delete-policy"], ["forget", ref, "--dry-run"]):
        result = run_braid(*words, "--repo", str(repo), "--json")
        assert result.code == 0, (words, result.stderr)
        documents[" ".join(words[:2])] = json.loads(result.out)
    for command, doc in documents.items():
        rows = doc if isinstance(doc, list) else [doc]
        assert all(row["schema_version"] == SCHEMA_VERSION for row in rows), (command, doc)
    assert [row["backup"] for row in documents["list"]] == [ref]
    assert documents["list --incomplete"] == []
    initialised = run_braid("init", "--repo", str(repo.parent / "another"), "--json")
    assert json.loads(initialised.out)["schema_version"] == SCHEMA_VERSION


# -- --quiet and --log-file ----------------------------------------------------------------


def test_quiet_prints_nothing_on_success_and_one_line_on_failure(repo: Path, source: Path, tmp_path: Path) -> None:
    backed = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK, "--quiet", "--input", str(source))
    assert (backed.code, backed.stdout, backed.stderr) == (0, b"", "")
    listed = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert [row["plaintext_bytes"] for row in listed] == [SIZE]  # it did back up
    restored = run_braid("restore", "--repo", str(repo), "db@latest", "--quiet", "--output", str(tmp_path / "out"))
    assert (restored.code, restored.stdout, restored.stderr) == (0, b"", "")
    assert (tmp_path / "out").read_bytes() == source.read_bytes()
    with_id = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK, "--quiet", "--json", "--input", str(source))
    assert with_id.code == 0 and with_id.stderr == "" and json.loads(with_id.out)["backup"].startswith("db@")

    missing = run_braid("backup", "--repo", str(repo), "--name", "db", "--quiet", "--input", str(tmp_path / "nope"))
    assert (missing.code, missing.stdout) == (5, b"")
    assert missing.stderr.splitlines() == [f"braid: error: input {tmp_path / 'nope'} does not exist (create the named pipe with mkfifo, or check the path)"]


def test_log_file_gets_the_events_as_json_lines_and_the_failure(repo: Path, source: Path, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "braid.jsonl"
    log.parent.mkdir()
    backed = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK, "--quiet", "--log-file", str(log), "--input", str(source))
    assert (backed.code, backed.stdout, backed.stderr) == (0, b"", "")
    events = parse_events(log.read_text())
    assert kinds(events)[0] == "phase:reading" and events[-1]["event"] == "done" and events[-1]["bytes"] == SIZE

    # appended to, run after run; a failure ends with an `error` event naming the exit code
    failed = run_braid("restore", "--repo", str(repo), "db@latest", "--output", str(source), "--log-file", str(log))
    assert failed.code == 5, failed.stderr
    events = parse_events(log.read_text())
    error = events[-1]
    assert (error["event"], error["exit_code"], error["backup"]) == ("error", 5, events[-2]["backup"]), error
    assert f"braid: error: {error['message']}" in failed.stderr

    unwritable = run_braid("backup", "--repo", str(repo), "--name", "db", "--input", str(source), "--log-file", str(tmp_path / "no" / "dir" / "log"))
    assert unwritable.code == 5 and unwritable.stderr.startswith("braid: error: cannot open --log-file "), unwritable.stderr


def test_an_interrupted_run_ends_its_log_with_an_error_event(tmp_path: Path) -> None:
    """SIGINT, SIGTERM and SIGHUP arrive as KeyboardInterrupt (braid.cli.main): the log says so, with exit code 130."""
    log = tmp_path / "braid.jsonl"
    with pytest.raises(KeyboardInterrupt), Progress("none", log=open_log(str(log))) as progress:
        progress({"event": "phase", "backup": "db@x", "phase": "reading", "total_bytes": None, "total_chunks": None})
        for n in (1, 2, 3):  # in the same half second: only the first and the last are written
            progress({"event": "chunk", "backup": "db@x", "phase": "reading", "bytes": n, "chunks": n, "total_bytes": None, "total_chunks": None})
        raise KeyboardInterrupt
    events = parse_events(log.read_text())
    assert [(e["event"], e.get("chunks"), e.get("exit_code"), e.get("message")) for e in events] == [
        ("phase", None, None, None), ("chunk", 1, None, None), ("chunk", 3, None, None), ("error", None, 130, "interrupted")
    ]
    assert events[-1]["backup"] == "db@x"


# -- docs/usage.md-------------------------------------------------------------------------------


def _tables(section: str) -> list[list[list[str]]]:
    tables: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*section.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= {"-"} for c in cells):
                rows.append(cells)
        elif rows:
            tables.append(rows[1:])  # without the header
            rows = []
    return tables


def _names(cell: str) -> list[str]:
    return re.findall(r"`([a-z_-]+)`", cell)


def test_the_docs_document_every_event_and_field_the_code_declares() -> None:
    usage = (ROOT / "docs" / "usage.md").read_text()
    section = usage[usage.index("### Progress events") :]
    section = section[: section.index("\n## ")]
    common, events, meanings = _tables(section)
    assert [row[0].strip("`") for row in common] == [f.name for f in COMMON_FIELDS]
    documented = {row[0].strip("`"): _names(row[2]) for row in events}
    declared = {name: [f.name for f in spec.fields] for name, spec in EVENTS.items()}
    assert documented == declared
    explained = {name for row in meanings for name in _names(row[0])}
    assert explained == {f.name for spec in EVENTS.values() for f in spec.fields}
    phase_row = next(row for row in meanings if row[0] == "`phase`")
    assert _names(phase_row[1]) == list(PHASES)


# -- the terminal -----------------------------------------------------------------------------


def test_progress_view_gives_percentage_eta_and_rate_when_the_total_is_known() -> None:
    view = ProgressView(started=100.0)
    view.update({"event": "phase", "backup": "db@x", "phase": "restoring", "total_bytes": 4 * 2**20, "total_chunks": 4}, now=100.0)
    view.update({"event": "chunk", "backup": "db@x", "bytes": 2**20, "chunks": 1}, now=101.0)
    line = view.line(now=102.0)
    assert line.startswith("restoring   25% ━━━╺")
    assert "1 MiB/4 MiB" in line and "512 KiB/s" in line and "1/4 chunks" in line and "ETA 0:00:06" in line and "0:00:02" in line
    view.update({"event": "phase", "backup": "db@x", "phase": "reading", "total_bytes": None, "total_chunks": None}, now=102.0)
    view.update({"event": "chunk", "backup": "db@x", "bytes": 3 * 2**20, "chunks": 3, "ratio": 0.5}, now=103.0)
    line = view.line(now=103.0)
    assert "%" not in line and "ETA" not in line and "3 MiB" in line and "3 chunks" in line and "ratio 0.500" in line


def test_the_cloud_processing_phase_counts_chunks_of_the_total() -> None:
    view = ProgressView(started=0.0)
    view.update({"event": "phase", "backup": "db@x", "phase": "processing", "total_bytes": 10 * 2**20, "total_chunks": 10}, now=5.0)
    view.update({"event": "status", "backup": "db@x", "chunks": 4, "status": "RUNNING"}, now=6.0)
    line = view.line(now=7.0)
    assert line.startswith("processing   40%") and "4/10 processed" in line and "10 MiB" in line and "RUNNING" in line and "ETA 0:00:03" in line


def test_the_summary_line_has_the_totals() -> None:
    done = {"backup": "db@x", "operation": "backup", "bytes": 3 * 2**30, "chunks": 48, "stored_bytes": 2**30, "ratio": 0.3333, "rate": 100 * 2**20, "elapsed": 30.7}
    assert summary_line(done) == "db@x: backed up 3 GiB in 48 chunks, stored 1 GiB (ratio 0.333, saved 67%), 0:00:31 (30.7 s), 100 MiB/s"
    restored = {**done, "operation": "restore"}
    assert summary_line(restored) == "db@x: restored 3 GiB in 48 chunks, 0:00:31 (30.7 s), 100 MiB/s"


def run_on_terminal(*args: str, stdin: Path, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str, str]:
    """The CLI with stderr on a pseudo-terminal (what a person sees), stdout a pipe: (code, stdout, terminal text)."""
    leader, follower = pty.openpty()
    with open(stdin, "rb") as feed:
        proc = subprocess.Popen([str(BRAID), *args], stdin=feed, stdout=subprocess.PIPE, stderr=follower, env={**(env or os.environ), "COLUMNS": "200"})
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    out = proc.stdout.read().decode() if proc.stdout else ""
    code = proc.wait(30)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace")).replace("\r", "\n")
    return code, out, text


def test_a_terminal_sees_a_live_line_and_a_correct_summary(repo: Path, source: Path) -> None:
    code, out, text = run_on_terminal("backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK, stdin=source)
    assert code == 0, text
    ref = out.strip()
    lines = [line for line in text.splitlines() if line.strip()]
    assert any(line.startswith(("reading", "finalizing")) and "/5 chunks" in line for line in lines), lines
    assert lines[-1] == lines[-1].strip() and lines[-1].startswith(f"{ref}: backed up 293 KiB in 5 chunks, stored "), lines
    assert "{" not in text  # no JSON for a person


def test_a_scripted_run_never_imports_the_terminal_library(repo: Path, source: Path) -> None:
    """Start-up time counts in every scripted backup (the 256 MiB speed target): rich is for terminals only."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import sys; from braid.cli.main import main; sys.exit(main())",
         "backup", "--repo", str(repo), "--name", "db", "--chunk-size", CHUNK, "--input", str(source)],
        capture_output=True, env=os.environ, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.decode().splitlines() if line.startswith("import time:")]
    assert "braid.cli.progress" in imported and not [m for m in imported if m.split(".")[0] == "rich"]
