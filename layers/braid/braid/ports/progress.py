"""Port: where long operations report progress, and the one vocabulary they report in.

One dict per event (`{"event": "chunk", ...}`), never raising; the CLI
renders them as a bar or JSON lines (and a `--log-file`), tests record them.
A local backup, a cloud backup and a restore speak the same vocabulary, so
a script that follows one follows them all: the event names and their
fields are declared here, once, as `EVENTS`. docs/usage.md's table of events is
checked against it (tests/test_progress_events.py), and every event the
CLI prints is checked against it in the tests, so neither can drift.

Field names mean the same thing in every event: `bytes` is plaintext
bytes done so far (read and stored by a local backup, staged by a cloud
upload, written by a restore), `chunks` is chunks done so far, `total_*`
the amount the phase will reach when it is known (null when not: a pipe
has no length), `stored_bytes` what the repository holds for them.

`SCHEMA_VERSION` is carried by every JSON document Braid prints (events,
command output) as `schema_version`: it changes only when a field changes
meaning or disappears, never when one is added.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ProgressFn = Callable[[dict[str, Any]], None]

SCHEMA_VERSION = 1

# What a long operation is doing now, in the order a backup or restore goes through them.
PHASES = ("reading", "uploading", "processing", "finalizing", "restoring")

JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "integer or null": (int, type(None)),
    "number or null": (int, float, type(None)),
}


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # a key of JSON_TYPES
    doc: str
    required: bool = True


@dataclass(frozen=True)
class EventSpec:
    name: str
    doc: str
    fields: tuple[Field, ...]


def _phase(doc: str = "what the operation is doing: one of " + ", ".join(PHASES)) -> Field:
    return Field("phase", "string", doc)


def _totals() -> tuple[Field, ...]:
    return (
        Field("total_bytes", "integer or null", "plaintext bytes the phase will reach; null when unknown (a pipe, a command)"),
        Field("total_chunks", "integer or null", "chunks the phase will reach; null when unknown"),
    )


COMMON_FIELDS = (
    Field("schema_version", "integer", f"the vocabulary's version ({SCHEMA_VERSION})"),
    Field("event", "string", "the event type (the table below)"),
    Field("time", "string", "when it happened: ISO 8601 UTC with microseconds, e.g. 2026-11-23T01:02:03.456789Z"),
    Field("elapsed", "number", "seconds since the command started"),
    Field("backup", "string", "the backup, NAME@ID"),
)

_BYTES = Field("bytes", "integer", "plaintext bytes done so far")
_CHUNKS = Field("chunks", "integer", "chunks done so far")
_MESSAGE = Field("message", "string", "the same, as a sentence for a person")
_PARTS = (  # the cloud upload's part counts, in `upload` and `stream-end` alike
    Field("parts_uploaded", "integer", "parts uploaded by this run"),
    Field("parts_skipped", "integer", "parts already staged (--resume)"),
)

EVENTS: dict[str, EventSpec] = {
    spec.name: spec
    for spec in (
        EventSpec("phase", "the operation enters a phase (the first event of each phase)", (_phase(), *_totals())),
        EventSpec(
            "started",
            "a cloud backup's staging session exists: from now on it can be continued with --resume",
            (
                Field("resumed", "boolean", "this run continues an interrupted upload (--resume)"),
                Field("resumable", "boolean", "false for a command's stream, which a rerun would write anew"),
                _MESSAGE,
            ),
        ),
        EventSpec(
            "chunk",
            "local backup: chunks stored (read, compressed, encrypted, written); restore: chunks written",
            (
                _phase(),
                _BYTES,
                _CHUNKS,
                *_totals(),
                Field("stored_bytes", "integer", "backup: bytes the stored chunks take in the repository", required=False),
                Field("ratio", "number", "backup: stored_bytes / bytes so far (lower is better)", required=False),
            ),
        ),
        EventSpec(
            "upload",
            "cloud backup: raw parts staged in S3 (a part holds up to 4 chunks, see --concurrency)",
            (
                _phase(),
                Field("bytes", "integer", "plaintext bytes staged so far (uploaded, or already there on --resume)"),
                Field("chunks", "integer", "chunks staged so far"),
                *_totals(),
                Field("bytes_uploaded", "integer", "bytes uploaded by this run"),
                Field("bytes_skipped", "integer", "bytes already staged by an interrupted run (--resume)"),
                *_PARTS,
                Field("segments_completed", "integer", "segments handed to the pipeline"),
            ),
        ),
        EventSpec(
            "stream-end",
            "cloud backup: every input ended and is staged; the pipeline finishes the rest",
            (
                _phase(),
                Field("bytes", "integer", "plaintext bytes of the whole stream"),
                Field("bytes_read", "integer", "the same as bytes (kept for scripts that read it)"),
                Field("chunks", "integer", "chunks of the whole stream"),
                *_PARTS,
                Field("max_buffers_in_flight", "integer", "peak chunk buffers held (memory)"),
            ),
        ),
        EventSpec(
            "status",
            "cloud backup: the pipeline's progress, when its count of processed chunks changes",
            (
                _phase(),
                Field("status", "string", "the Step Functions execution's status (RUNNING, ...)"),
                Field("chunks", "integer", "chunks compressed and encrypted by the workers so far"),
                Field("chunks_done", "integer", "the same as chunks (kept for scripts that read it)"),
                *_totals(),
            ),
        ),
        EventSpec(
            "waiting",
            "a named pipe has had no process at its other end for a few seconds, or a cloud incremental waits for its parent's values",
            (
                Field("input", "string", "backup: the --input pipe waiting for a writer", required=False),
                Field("output", "string", "restore: the --output pipe waiting for a reader", required=False),
                _MESSAGE,
            ),
        ),
        EventSpec(
            "retry",
            "an AWS request failed and is about to be retried",
            (
                Field("service", "string", "S3, Step Functions, ..."),
                Field("operation", "string", "the API call, e.g. UploadPart"),
                Field("reason", "string", "the error code (SlowDown), HTTP status or exception"),
                Field("attempt", "integer", "the attempt that failed, from 1"),
                Field("delay", "number", "seconds until the next attempt"),
                _MESSAGE,
            ),
        ),
        EventSpec(
            "abandoned",
            "cloud backup: the agent told the pipeline the stream will never end (a producer failed, an empty stream)",
            (Field("reason", "string", "why"),),
        ),
        EventSpec(
            "done",
            "the operation succeeded: the last event, with the totals (the same figures as `backup --json`)",
            (
                Field("operation", "string", "backup or restore"),
                Field("bytes", "integer", "plaintext bytes backed up or restored"),
                Field("chunks", "integer", "chunks"),
                Field("stored_bytes", "integer", "bytes the backup takes in the repository"),
                Field("ratio", "number", "stored_bytes / plaintext_bytes (lower is better; 0.25 saves 75%)"),
                Field("rate", "number", "bytes per second over the whole command"),
                Field("name", "string", "the backup's name"),
                Field("id", "string", "the backup's id"),
                Field("created", "string", "when the backup started (timestamp)"),
                Field("completed", "string", "when its manifest was written (timestamp)"),
                Field("engine", "string", "local or stepfunctions"),
                Field("inputs", "integer", "number of inputs (streams)"),
                Field("plaintext_bytes", "integer", "the backup's size (equals bytes)"),
            ),
        ),
        EventSpec(
            "error",
            "the operation failed (--log-file only: on stderr the error is the `braid: error: ...` line)",
            (
                Field("message", "string", "the error line, without `braid: error: `"),
                Field("exit_code", "integer", "the exit code Braid returns"),
            ),
        ),
    )
}

# The events that report an amount done, throttled by displays and stamped with the phase.
PROGRESS_EVENTS = frozenset({"chunk", "upload", "status"})


def event_problems(event: Mapping[str, Any]) -> list[str]:
    """What is wrong with `event` against the vocabulary (empty when it conforms): for tests and log readers."""
    spec = EVENTS.get(str(event.get("event")))
    if spec is None:
        return [f"unknown event {event.get('event')!r}"]
    problems = []
    declared = {f.name: f for f in (*COMMON_FIELDS, *spec.fields)}
    for name, value in event.items():
        field = declared.get(name)
        if field is None:
            problems.append(f"{spec.name}: undeclared field {name!r}")
        elif not isinstance(value, JSON_TYPES[field.type]) or (isinstance(value, bool) and field.type != "boolean"):
            problems.append(f"{spec.name}: {name} is {value!r}, not {field.type}")
    problems += [f"{spec.name}: missing field {f.name!r}" for f in declared.values() if f.required and f.name not in event]
    if "phase" in event and event["phase"] not in PHASES:
        problems.append(f"{spec.name}: unknown phase {event['phase']!r}")
    if event.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"{spec.name}: schema_version {event.get('schema_version')!r}, not {SCHEMA_VERSION}")
    return problems


def no_progress(event: dict[str, Any]) -> None:
    """A ProgressFn that drops every event."""


class PhaseReporter:
    """A ProgressFn that stamps progress events with the current phase and its known totals.

    The parts that count (the local sink, the uploader, the restore
    writers) know what they did, not what phase the whole operation is in
    nor how much it will be: the engine that runs them says so once, here,
    and every event they report carries it. Safe from any thread.
    """

    def __init__(self, progress: ProgressFn, backup: str) -> None:
        self._progress = progress
        self._backup = backup
        self._lock = threading.Lock()
        self._stamp: dict[str, Any] = {}

    def phase(self, name: str, *, total_bytes: int | None = None, total_chunks: int | None = None) -> None:
        """Enter phase `name` (one of PHASES) and report it."""
        assert name in PHASES, name
        stamp = {"phase": name, "total_bytes": total_bytes, "total_chunks": total_chunks}
        with self._lock:
            self._stamp = stamp
        self._progress({"event": "phase", "backup": self._backup, **stamp})

    @property
    def current(self) -> str | None:
        with self._lock:
            phase: str | None = self._stamp.get("phase")
        return phase

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("event") in PROGRESS_EVENTS:
            with self._lock:
                stamp = self._stamp
            event = {"backup": self._backup, **stamp, **event}
        self._progress(event)
