"""A ProgressFn that forwards to one chosen later.

Some parts report before their caller has a ProgressFn to give them: an AWS
client is built when the repository is opened, but its retries ("SlowDown,
retrying in 3.2 s") belong in the progress of the backup that runs later.
The client reports to a relay; whoever runs the operation points the relay
at its own ProgressFn.
"""

from __future__ import annotations

import threading
from typing import Any

from braid.ports.progress import ProgressFn, no_progress


class ProgressRelay:
    """Forwards every event to the current target (none until `send_to`); safe from any thread."""

    def __init__(self) -> None:
        self._target: ProgressFn = no_progress
        self._lock = threading.Lock()

    def send_to(self, target: ProgressFn) -> None:
        """From now on, events go to `target` (replacing the previous one)."""
        with self._lock:
            self._target = target

    def __call__(self, event: dict[str, Any]) -> None:
        with self._lock:
            target = self._target
        target(event)
