"""Start a process with the signal dispositions a shell or a service manager gives it.

A runner that starts the suite in the background (`cmd &` in a script, `nohup`)
hands every process SIGINT or SIGHUP ignored, and Braid keeps an ignored signal
ignored (braid.cli.main): a test that sends one must start Braid with it at its
default, or it tests the runner instead of Braid.
"""

from __future__ import annotations

import signal

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def default_dispositions() -> None:
    """A subprocess preexec_fn: SIGINT, SIGTERM and SIGHUP at SIG_DFL."""
    for signum in STOPPING:
        signal.signal(signum, signal.SIG_DFL)
