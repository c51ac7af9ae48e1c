"""Counting what a piece of work used, whichever threads it ran on.

The AWS adapter reports every HTTP attempt it makes (`count_request`,
called by a botocore hook on each client: braid.adapters.aws.clients) to
two places: the client's own tally (`RequestTally`, what a host process's
store client did all run long) and the tally of the work in progress, if
any (`tallying()`, a context variable). The second is what a Lambda handler
needs: in the emulated cloud several invocations run at once in one process
and share a client, and even on AWS a container's client outlives the
invocation; a context variable belongs to this invocation alone.

Python does not carry a context into a thread pool's threads, so the
pools that work for a tallied invocation run their tasks through
`in_context` (the worker's lanes, the staging area's parallel reads): a
request made on a thread that did not is simply not counted, which the
emulated-cloud test of the manifest's usage would show as a missing count.

`InvocationMeter` turns a tally and a wall clock into one invocation's
Usage: Lambda bills the handler's duration at the function's memory.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, copy_context
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from braid.format.usage import Usage, billed_invocation

P = ParamSpec("P")
R = TypeVar("R")


class RequestTally:
    """Thread-safe counts of requests, keyed `service:Operation`."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


_current: ContextVar[RequestTally | None] = ContextVar("braid_request_tally", default=None)


def count_request(service: str, operation: str, *tallies: RequestTally) -> None:
    """One HTTP attempt of `service:operation`: into `tallies` and the current work's tally."""
    name = f"{service}:{operation}"
    for tally in tallies:
        tally.add(name)
    current = _current.get()
    if current is not None:
        current.add(name)


@contextmanager
def tallying() -> Iterator[RequestTally]:
    """Count the requests made from here on, in this context (and the tasks run `in_context` from it)."""
    tally = RequestTally()
    token = _current.set(tally)
    try:
        yield tally
    finally:
        _current.reset(token)


def in_context(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn`, run in (a copy of) the caller's context on whichever thread calls it, so its requests count for the caller."""
    context = copy_context()

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return context.copy().run(fn, *args, **kwargs)

    return run


@dataclass
class InvocationMeter:
    """One Lambda invocation's use so far: its requests (`tally`) and its billed duration at `memory_mb`."""

    function: str
    memory_mb: int
    tally: RequestTally
    started: float = field(default_factory=time.monotonic)

    def usage(self, pending: Mapping[str, int] | None = None) -> Usage:
        """Use up to now, plus `pending`: requests about to be made whose record this usage goes into (their own PUT)."""
        requests = self.tally.counts()
        for name, n in (pending or {}).items():
            requests[name] = requests.get(name, 0) + n
        return Usage(requests=requests, functions={self.function: billed_invocation(time.monotonic() - self.started, self.memory_mb)})


@contextmanager
def metering(function: str, memory_mb: int) -> Iterator[InvocationMeter]:
    """Meter one invocation of `function`: requests in this context from now on, and its wall time."""
    with tallying() as tally:
        yield InvocationMeter(function, memory_mb, tally)
