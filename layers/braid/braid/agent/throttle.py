"""--rate-limit for the cloud agent's uploads: the token bucket of braid.engine.throttle, which the local engine uses too."""

from __future__ import annotations

from braid.engine.throttle import TokenBucket

__all__ = ["TokenBucket"]
