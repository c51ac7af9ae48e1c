"""Stopping the resident processes a test started: `wal-push --async`'s pusher and `wal-fetch`'s prefetcher.

Each writes its pid into its spool's lock file (pusher.lock, prefetch.lock)
and would otherwise idle out on its own, a minute or so after the test.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from pathlib import Path


def stop_residents(locks: Iterable[Path]) -> None:
    """SIGTERM the process named in each lock file; an empty lock or a process already gone is fine."""
    for lock in locks:
        text = lock.read_text().strip()
        if text:
            try:
                os.kill(int(text), signal.SIGTERM)
            except ProcessLookupError:
                pass
