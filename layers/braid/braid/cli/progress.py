"""Progress on stderr: a live line on a terminal, JSON lines for scripts, and an optional log file.

stdout is reserved for data (restore) and the result (backup's NAME@ID or
its `--json` summary), so progress never mixes with either.

Every event leaves here stamped with the vocabulary's common fields
(braid.ports.progress: `schema_version`, `time`, `elapsed`), so the JSON
lines on stderr and the `--log-file` lines are the same documents. Events
that only count (chunk, upload, status) are thinned to one every
`interval` seconds; every other event is written as it comes.

The terminal line is drawn with rich, imported only when stderr is a
terminal: a scripted run pays no start-up time for it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal, TextIO

from braid.cli.progress_view import ProgressView
from braid.errors import BackupError, InputError
from braid.format.timestamps import format_timestamp
from braid.ports.progress import PROGRESS_EVENTS, SCHEMA_VERSION

Display = Literal["bar", "json", "none"]
REFRESH_PER_SECOND = 2  # the terminal line, whether or not an event came


def started_line(backup: str, resumable: bool = True) -> str:
    """What a person sees once a cloud backup is staged: the NAME@ID --resume needs, at once."""
    if not resumable:  # a command's stream (braid.engine.producer): a rerun writes a new one
        return f"braid: backup {backup} started; its command's stream cannot be resumed: if interrupted, run the backup again"
    return f"braid: backup {backup} started; if interrupted, continue with 'braid backup --resume {backup} ...'"


def _notice(event: dict[str, Any]) -> str | None:
    """The events a person reads as a line of their own, above the progress line."""
    kind = event.get("event")
    if kind == "started":  # a cloud backup exists: its NAME@ID, before anything can go wrong
        return str(event["message"])
    if kind == "retry":  # an AWS client waiting: "SlowDown, retrying in 3.2 s"
        return f"{event.get('backup', '')}  {event.get('service', '')} {event.get('message', '')}"
    if kind == "waiting":  # a named pipe nobody opened yet: "waiting for a writer on /p1"
        return f"{event.get('backup', '')}  {event.get('message', '')}"
    if kind == "abandoned":
        return f"{event.get('backup', '')}  abandoned: {event.get('reason', '')}"
    return None


def exit_code_of(error: BaseException) -> int:
    """The code braid.cli.main returns for `error` (for the log's `error` event)."""
    if isinstance(error, BackupError):
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        return 130
    if isinstance(error, BrokenPipeError):
        return 5
    return 1


class Progress:
    """A ProgressFn for one command; use it as a context manager so the terminal line and the log are closed.

    `display`: "bar" (a live line, for a person), "json" (JSON lines on
    `stream`), "none" (--quiet). `log`: a text file for JSON lines of every
    event, whatever the display (--log-file).
    """

    def __init__(self, display: Display = "json", *, stream: TextIO | None = None, log: TextIO | None = None, interval: float = 0.5) -> None:
        self.stream = stream or sys.stderr
        self.display = display
        self.log = log
        self.interval = interval
        self._started = time.monotonic()
        self._started_wall = time.time()
        self._last = -interval
        self._lock = threading.Lock()
        self._view = ProgressView(self._started)
        self._held: tuple[dict[str, Any], float] | None = None  # the last counting event thinned out, and when it came
        self._live: Any = None  # rich.live.Live, started at the first event on a terminal
        self._live_ended = False
        self._console: Any = None  # rich.console.Console, for the line and the notices above it
        self.backup = ""  # the operation's NAME@ID once known (the log's `error` event names it)
        self._echoed = ""  # the producer's stderr not yet ended by a newline or a carriage return
        self._producer_line = ""  # its latest `\r` update (pg_basebackup -P), drawn above the live line
        self._echo_lock = threading.Lock()

    @classmethod
    def for_command(cls, args: Any) -> Progress:
        """From the common options: --quiet, --json, --log-file; a bar only for a person watching a terminal."""
        display: Display = "none" if getattr(args, "quiet", False) else "json" if args.json or not sys.stderr.isatty() else "bar"
        return cls(display, log=open_log(getattr(args, "log_file", None)))

    def estimate(self, total_bytes: int | None) -> None:
        """The expected size of a stream of unknown size (a command's): the live line shows `~%` and `~ETA` from it."""
        self._view.estimate = total_bytes

    def echo(self, data: bytes) -> None:
        """The producer's stderr (braid.engine.child): as it comes, except under a live line, where a finished
        line is printed above it and a `\r` update (pg_basebackup -P) is drawn on a line of its own, so the two
        never overwrite each other."""
        if self.display != "bar" or self._live_ended:
            os.write(2, data)
            return
        from rich.text import Text

        with self._echo_lock:
            text = self._echoed + data.decode(errors="replace")
            *done, self._echoed = text.split("\n")
            for line in done:
                last = [part for part in line.split("\r") if part.strip()]
                if last:
                    self._producer_line = ""
                    self._terminal().print(Text(last[-1]), soft_wrap=True)
            if "\r" in self._echoed:
                updates = [part for part in self._echoed.split("\r") if part.strip()]
                self._echoed = ""
                if updates:
                    self._producer_line = updates[-1]

    @property
    def quiet(self) -> bool:
        return self.display == "none"

    def stamp(self, event: dict[str, Any], now: float) -> dict[str, Any]:
        """The event as a JSON document: the vocabulary's common fields first."""
        moment = datetime.fromtimestamp(self._started_wall + (now - self._started), UTC)  # when it came, not when written
        stamped = {"schema_version": SCHEMA_VERSION, "event": event.get("event"), "time": format_timestamp(moment), "elapsed": round(now - self._started, 3), **event}
        if event.get("event") == "started" and "message" not in event:  # the same sentence for whoever reads the log
            stamped["message"] = started_line(str(event.get("backup", "")), event.get("resumable") is not False)
        return stamped

    def __call__(self, event: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            self.backup = str(event.get("backup") or self.backup)
            if event.get("event") == "done":
                event = {**event, "elapsed": round(now - self._started, 3)}
            if self.display == "bar":
                self._view.update(event, now)
            if event.get("event") in PROGRESS_EVENTS:
                if now - self._last < self.interval:
                    self._held = (event, now)  # written before the next other event: each phase's last count is kept
                    return
                self._last = now
                self._held = None
            elif self._held is not None:
                (held, at), self._held = self._held, None
                self._write(held, at)
            self._write(event, now)

    def _write(self, event: dict[str, Any], now: float) -> None:
        if self.display == "none" and self.log is None:
            return
        document = self.stamp(event, now)
        if self.log is not None:
            self.log.write(json.dumps(document) + "\n")
            self.log.flush()
        if self.display == "json":
            self.stream.write(json.dumps(document) + "\n")
            self.stream.flush()
        elif self.display == "bar":
            self._draw(document)

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    # -- the terminal -----------------------------------------------------------------

    def _draw(self, event: dict[str, Any]) -> None:
        if self._live_ended:
            return
        notice = _notice(event)
        if notice is not None:
            from rich.text import Text

            self._terminal().print(Text(notice), soft_wrap=True)  # above the progress line, which follows it down
            return
        if self._live is None:
            self._start_live()
        if event.get("event") == "done":
            self._stop_live()  # its last drawing is the summary line, which stays

    def _terminal(self) -> Any:
        """The rich Console on `stream`, made at the first drawing."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.stream, highlight=False)
        return self._console

    def _start_live(self) -> None:
        from rich.live import Live

        self._live = Live(
            get_renderable=self._renderable,
            console=self._terminal(),
            refresh_per_second=REFRESH_PER_SECOND,
            redirect_stdout=False,  # stdout is data (a restore's bytes, a backup's id): never touch it
            redirect_stderr=False,
        )
        self._live.start(refresh=True)  # the first drawing now, not at the first tick

    def _renderable(self) -> Any:
        """The line (cut to the terminal's width while it changes; the summary wraps, it stays)."""
        from rich.text import Text

        line = self._view.line(time.monotonic())
        if self._view.finished:
            return Text(line)
        if self._producer_line:
            from rich.console import Group

            return Group(Text(self._producer_line, no_wrap=True, overflow="ellipsis"), Text(line, no_wrap=True, overflow="ellipsis"))
        return Text(line, no_wrap=True, overflow="ellipsis")

    def _stop_live(self) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            self._live_ended = True  # later events draw nothing more
            live.stop()

    # -- the command's end ----------------------------------------------------------

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        with self._lock:
            if self._held is not None:  # the last count before a failure: where it stopped
                (held, at), self._held = self._held, None
                self._write(held, at)
            self._stop_live()
            if self.log is not None:
                if error is not None:
                    message = str(error) if isinstance(error, BackupError) else "interrupted" if isinstance(error, KeyboardInterrupt) else f"{type(error).__name__}: {error}"
                    failed = {"event": "error", "backup": self.backup, "message": message, "exit_code": exit_code_of(error)}
                    self.log.write(json.dumps(self.stamp(failed, time.monotonic())) + "\n")
                self.log.close()
                self.log = None


def open_log(path: str | None) -> TextIO | None:
    """`--log-file PATH`: appended to (a cron job's runs follow each other), one JSON line per event."""
    if not path:
        return None
    try:
        return open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot open --log-file {path}: {exc.strerror}") from None
