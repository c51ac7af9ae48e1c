"""Progress on stderr: a bar on a terminal, JSON lines for scripts and logs.

stdout is reserved for data (restore) and the backup id (backup), so
progress never mixes with either.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, TextIO

from braid.cli.sizes import format_size


def started_line(backup: str, resumable: bool = True) -> str:
    """What a person sees once a cloud backup is staged: the NAME@ID --resume needs, at once."""
    if not resumable:  # a command's stream (braid.engine.producer): a rerun writes a new one
        return f"braid: backup {backup} started; its command's stream cannot be resumed: if interrupted, run the backup again"
    return f"braid: backup {backup} started; if interrupted, continue with 'braid backup --resume {backup} ...'"


class Progress:
    def __init__(self, json_lines: bool, stream: TextIO | None = None, interval: float = 0.5) -> None:
        self.stream = stream or sys.stderr
        self.json_lines = json_lines
        self.interval = interval
        self._last = 0.0
        self._started = time.monotonic()
        self._lock = threading.Lock()

    @classmethod
    def for_terminal(cls, force_json: bool) -> Progress:
        """A bar only for a person watching; anything else (a pipe, a log) gets JSON lines it can parse."""
        return cls(json_lines=force_json or not sys.stderr.isatty())

    def __call__(self, event: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            final = event.get("event") not in ("chunk", "upload", "status")
            if not final and now - self._last < self.interval:
                return
            self._last = now
            elapsed = now - self._started
            if self.json_lines:
                if event.get("event") == "started":  # the same sentence for whoever reads the log
                    event = {**event, "message": started_line(str(event.get("backup", "")), event.get("resumable") is not False)}
                self.stream.write(json.dumps({"elapsed": round(elapsed, 3), **event}, sort_keys=True) + "\n")
            else:
                self._draw(event, elapsed, final)
            self.stream.flush()

    def _draw(self, event: dict[str, Any], elapsed: float, final: bool) -> None:
        if event.get("event") == "started":  # a cloud backup exists: its NAME@ID, before anything can go wrong
            self.stream.write(f"\r\033[K{started_line(str(event.get('backup', '')), event.get('resumable') is not False)}\n")
            return
        if event.get("event") == "retry":  # an AWS client waiting: "SlowDown, retrying in 3.2 s", on a line of its own
            self.stream.write(f"\r\033[K{event.get('backup', '')}  {event.get('service', '')} {event.get('message', '')}\n")
            return
        if event.get("event") == "waiting":  # a named pipe nobody opened yet: "waiting for a writer on /p1", on a line of its own
            self.stream.write(f"\r\033[K{event.get('backup', '')}  {event.get('message', '')}\n")
            return
        done = int(event.get("bytes_read", event.get("bytes_written", 0)) or 0)
        rate = done / elapsed if elapsed > 0 else 0.0
        parts = [f"{event.get('backup', '')}", f"{format_size(done)}", f"{event.get('chunks_done', 0)} chunks"]
        if "stored_bytes" in event:
            parts.append(f"stored {format_size(int(event['stored_bytes']))}")
        parts.append(f"{format_size(rate)}/s")
        line = "  ".join(parts)
        self.stream.write("\r\033[K" + line)
        if final:
            self.stream.write("\n")
