"""Port: where long operations report progress.

One dict per event (`{"event": "chunk"|"upload"|"status"|"done"|..., ...}`),
never raising; the CLI renders them as a bar or JSON lines, tests record them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ProgressFn = Callable[[dict[str, Any]], None]


def no_progress(event: dict[str, Any]) -> None:
    """A ProgressFn that drops every event."""
