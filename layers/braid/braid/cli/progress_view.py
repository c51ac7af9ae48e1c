"""What a person watching a backup or restore sees: one line, recomputed from the events.

Pure state, no terminal: braid.cli.progress feeds it every event and asks
for the line (about twice a second, whether or not an event came, so the
elapsed time and ETA move on while the cloud pipeline works), and at the
end for the summary. Kept apart from the drawing so tests can check what
the line says without a terminal.
"""

from __future__ import annotations

import threading
from typing import Any

from braid.cli.sizes import format_size

# Phases whose progress is bytes moving through this host: they have a rate.
_BYTE_PHASES = ("reading", "uploading", "restoring")
_BAR = 12


def format_duration(seconds: float) -> str:
    """`0:01:05`, as h:mm:ss (hours unbounded)."""
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def summary_line(done: dict[str, Any]) -> str:
    """The last line of a successful backup or restore: what was done, how big, how long, how fast."""
    elapsed = float(done.get("elapsed", 0.0))
    took = f"{format_duration(elapsed)} ({elapsed:.1f} s), {format_size(float(done.get('rate', 0.0)))}/s"
    amount = f"{format_size(int(done['bytes']))} in {done['chunks']} chunks"
    if done.get("operation") == "restore":
        return f"{done['backup']}: restored {amount}, {took}"
    ratio = float(done["ratio"])
    saving = round(100 * (1 - ratio))
    saved = f"saved {saving}%" if saving >= 0 else f"grew {-saving}%"
    return f"{done['backup']}: backed up {amount}, stored {format_size(int(done['stored_bytes']))} (ratio {ratio:.3f}, {saved}), {took}"


class ProgressView:
    """The state of one operation as its events tell it; `line(now)` renders it."""

    def __init__(self, started: float) -> None:
        self._lock = threading.Lock()
        self._started = started
        self._backup = ""
        self._phase = ""
        self._phase_started = started
        self._phase_bytes = 0  # `bytes` when the phase began: the phase's rate counts from there
        self._bytes = 0
        self._chunks = 0
        self._total_bytes: int | None = None
        self._total_chunks: int | None = None
        self._ratio: float | None = None
        self._status = ""
        self._summary: str | None = None
        # A command's stream has no known size: the previous backup of the name (or --expected-size) estimates
        # it, shown as `~45%` and `~ETA` (braid.cli.commands.backup).
        self.estimate: int | None = None

    def update(self, event: dict[str, Any], now: float) -> None:
        with self._lock:
            self._backup = str(event.get("backup", self._backup))
            kind = event.get("event")
            if kind == "phase":
                self._phase = str(event["phase"])
                self._phase_started = now
                self._total_bytes = event.get("total_bytes")
                self._total_chunks = event.get("total_chunks")
                if self._phase in ("reading", "uploading", "restoring"):
                    self._bytes = self._chunks = 0
                elif self._phase == "processing":
                    self._chunks = 0  # now chunks processed by the workers, not parts staged
                    self._bytes = self._total_bytes if self._total_bytes is not None else self._bytes
                self._phase_bytes = self._bytes
                return
            if kind == "done":
                self._summary = summary_line(event)
                return
            if "bytes" in event:
                self._bytes = int(event["bytes"])
            if "chunks" in event:
                self._chunks = int(event["chunks"])
            if "ratio" in event:
                self._ratio = float(event["ratio"])
            if "status" in event:
                self._status = str(event["status"])

    def fraction(self) -> float | None:
        """How far the current phase is, 0..1, when its total is known."""
        with self._lock:
            return self._fraction()

    def _fraction(self) -> float | None:
        if self._phase in _BYTE_PHASES and self._total_bytes:
            return min(1.0, self._bytes / self._total_bytes)
        if self._estimated():
            assert self.estimate is not None
            return min(0.99, self._bytes / self.estimate)
        if self._total_chunks:
            return min(1.0, self._chunks / self._total_chunks)
        if self._phase in _BYTE_PHASES and self._total_bytes == 0:
            return 1.0
        return None

    def _estimated(self) -> bool:
        """Reading a stream of unknown size, with an estimate of it."""
        return self._phase == "reading" and self._total_bytes is None and bool(self.estimate)

    def line(self, now: float) -> str:
        """Most important first, since a narrow terminal cuts the end off: phase, %, amount, rate, ETA, then the rest."""
        with self._lock:
            if self._summary is not None:
                return self._summary
            in_phase = now - self._phase_started
            if self._phase == "reading" and self._total_bytes is None and not self._bytes and not self._chunks:
                # The producer has written nothing yet (pg_basebackup waiting for its checkpoint): not "0 B 0 B/s".
                return "  ".join([f"waiting for the producer's first byte ({format_duration(in_phase)})", format_duration(now - self._started), self._backup])
            parts = [self._phase or "starting"]
            fraction = self._fraction()
            about = "~" if self._estimated() else ""
            if fraction is not None:
                filled = round(fraction * _BAR)
                parts.append((f"~{100 * fraction:.0f}% " if about else f"{100 * fraction:3.0f}% ") + ("━" * filled + "╺" + "─" * (_BAR - filled - 1) if filled < _BAR else "━" * _BAR))
            moving = self._phase in _BYTE_PHASES
            if moving and self._total_bytes is not None:
                parts.append(f"{format_size(self._bytes)}/{format_size(self._total_bytes)}")
            elif about:
                parts.append(f"{format_size(self._bytes)}/~{format_size(self.estimate or 0)}")
            else:
                parts.append(format_size(self._bytes))
            if moving:
                parts.append(f"{format_size((self._bytes - self._phase_bytes) / in_phase if in_phase > 0 else 0.0)}/s")
            if fraction is not None and 0 < fraction < 1 and in_phase > 0:
                parts.append(f"{about}ETA {format_duration(in_phase * (1 - fraction) / fraction)}")
            chunk_word = "processed" if self._phase == "processing" else "chunks"
            parts.append(f"{self._chunks}/{self._total_chunks} {chunk_word}" if self._total_chunks is not None else f"{self._chunks} {chunk_word}")
            if self._ratio is not None:
                parts.append(f"ratio {self._ratio:.3f}")
            if self._status:
                parts.append(self._status)
            parts.append(format_duration(now - self._started))
            parts.append(self._backup)
            return "  ".join(parts)

    @property
    def finished(self) -> bool:
        with self._lock:
            return self._summary is not None
