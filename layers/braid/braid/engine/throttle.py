"""--rate-limit: one bytes-per-second budget, shared by the cloud agent's upload threads or the local engine's reader."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from braid.errors import UsageError


class TokenBucket:
    """Bytes-per-second limit shared by every upload thread.

    A part reserves its bytes before it is sent; when the bucket runs into
    debt the caller sleeps until the debt is paid, so over any window longer
    than a few parts the rate stays at `rate`. `burst` bounds what may go out
    at once after an idle spell.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise UsageError("--rate-limit must be a positive number of bytes per second")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else rate / 4)
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.burst
        self._last = clock()
        self._lock = threading.Lock()

    def take(self, amount: int) -> float:
        """Reserve `amount` bytes, sleeping as long as the rate needs; returns the wait."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= amount
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait
