"""Injected S3 faults for the emulated cloud: 500s, 503 SlowDown and connection resets.

S3 fails a small share of requests of every kind in normal operation: 500
InternalError, 503 SlowDown under load, and connections dropped mid-request.
Braid's answer is one retry layer per client (braid.adapters.aws.retries);
this module makes the emulator fail requests the same ways, at a rate, with a
seeded RNG, so tests and `scripts/soak` can show that a backup and a restore
come out identical through them, and fail clearly once past the budget.

A fault is decided per S3 request, before moto sees it (so the request has
no effect, as S3 promises for these errors):

  500    InternalError, the body drained first as S3 does before answering
  503    SlowDown (the throttling code botocore backs off on)
  reset  no response at all: the TCP connection is reset (RST). A WSGI app
         cannot do that, so the middleware raises `InjectedReset` and the
         request handler (`resetting_handler`) disconnects the socket with
         connect(AF_UNSPEC), which makes Linux send a RST, then drops it.

Who is failed is chosen by the SigV4 access key id of the request: "agent"
(every caller but the pipeline's in-process handlers), "pipeline" (the
handlers), or "all"; never the tests' inspector nor Step Functions itself
(moto's interpreter reading the map's items: AWS-internal traffic). The settings can change
while the emulator runs: POST JSON to /_emulator/s3-faults (GET reads the
settings and what was injected), so one emulator serves several scenarios.
"""

from __future__ import annotations

import ctypes
import json
import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("500", "503", "reset")
CALLER_GROUPS = ("agent", "pipeline", "all")
CONTROL_PATH = "/_emulator/s3-faults"
# Access keys never failed: the tests' own look at the bucket must see the truth,
# and "ak" is moto's Step Functions interpreter reading the map's items (AWS's
# own traffic, which it retries internally; no client of ours is involved).
EXEMPT_CALLERS = frozenset({"test-inspector", "ak"})

_BODIES = {
    "500": (
        "500 Internal Server Error",
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
        b"<Message>We encountered an internal error. Please try again. (injected)</Message><RequestId>emulated</RequestId></Error>",
    ),
    "503": (
        "503 Slow Down",
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
        b"<Message>Please reduce your request rate. (injected)</Message><RequestId>emulated</RequestId></Error>",
    ),
}


@dataclass(frozen=True)
class FaultSettings:
    """Fail `rate` of the chosen callers' S3 requests (of `ops`, or all), cycling through `kinds` at random."""

    rate: float = 0.0
    kinds: tuple[str, ...] = KINDS
    seed: int = 0
    callers: str = "agent"
    ops: tuple[str, ...] = ()  # S3 operation names (emulated_server.s3_operation, "GetObject (ranged)"); empty: every one
    limit: int | None = None  # stop injecting after this many faults
    first_of_each: bool = False  # also fail each caller's first request of each operation, whatever the rate

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"fault rate {self.rate} is not in [0, 1]")
        unknown = set(self.kinds) - set(KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"fault kinds must be some of {', '.join(KINDS)}, not {sorted(unknown) or 'none'}")
        if self.callers not in CALLER_GROUPS:
            raise ValueError(f"fault callers must be one of {', '.join(CALLER_GROUPS)}")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> FaultSettings:
        doc = dict(doc)
        for name in ("kinds", "ops"):
            if name in doc:
                doc[name] = tuple(doc[name])
        return cls(**doc)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kinds": list(self.kinds), "ops": list(self.ops)}


@dataclass
class FaultCounts:
    seen: int = 0  # S3 requests of the chosen callers and ops
    injected: Counter[str] = field(default_factory=Counter)  # by kind
    by_op: Counter[str] = field(default_factory=Counter)  # by S3 operation

    def to_json(self) -> dict[str, Any]:
        return {"seen": self.seen, "injected": dict(self.injected), "total": sum(self.injected.values()), "by_op": dict(self.by_op)}


class S3Faults:
    """Decides, per S3 request, whether and how it fails; thread-safe (the server is threaded)."""

    def __init__(self, settings: FaultSettings | None = None, *, pipeline_caller: str) -> None:
        self._pipeline = pipeline_caller
        self._lock = threading.Lock()
        self._enabled = False
        self.configure(settings or FaultSettings())

    def configure(self, settings: FaultSettings) -> None:
        """New settings, a fresh RNG from their seed, and counts from zero."""
        with self._lock:
            self.settings = settings
            self._rng = random.Random(settings.seed)
            self._first: set[tuple[str, str]] = set()
            self.counts = FaultCounts()

    def enable(self) -> None:
        """Start injecting (the emulator does once it is deployed: its own set-up must not fail)."""
        with self._lock:
            self._enabled = True

    def _chosen(self, caller: str) -> bool:
        group = self.settings.callers
        if caller in EXEMPT_CALLERS:
            return False
        # The handlers sign as `<pipeline>-<role>` (support.emulated_iam), the emulator itself as `<pipeline>`.
        return group == "all" or caller.startswith(self._pipeline) == (group == "pipeline")

    def decide(self, op: str, caller: str, *, ranged: bool = False) -> str | None:
        """The fault kind for this request, or None to let it through.

        A ranged GET counts as its own operation ("GetObject (ranged)"): it is
        how the pipeline reads staged parts, a different path from a whole GET.
        """
        label = f"{op} (ranged)" if ranged else op
        with self._lock:
            settings = self.settings
            if not self._enabled or (settings.rate <= 0 and not settings.first_of_each) or not self._chosen(caller):
                return None
            if settings.ops and op not in settings.ops and label not in settings.ops:
                return None
            self.counts.seen += 1
            if settings.limit is not None and sum(self.counts.injected.values()) >= settings.limit:
                return None
            first = settings.first_of_each and (caller, label) not in self._first
            self._first.add((caller, label))
            if self._rng.random() >= settings.rate and not first:
                return None
            # The first failures of each operation take the kinds in turn, so every kind is seen.
            kind = settings.kinds[(len(self._first) - 1) % len(settings.kinds)] if first else self._rng.choice(settings.kinds)
            self.counts.injected[kind] += 1
            self.counts.by_op[label] += 1
            return kind

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {"settings": self.settings.to_json(), "enabled": self._enabled, **self.counts.to_json()}

    # -- the control endpoint -------------------------------------------------------------

    def control(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """GET: settings and counts; POST {settings}: replace them (and zero the counts)."""
        status = "200 OK"
        if environ.get("REQUEST_METHOD") == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            try:
                self.configure(FaultSettings.from_json(json.loads(environ["wsgi.input"].read(length) or b"{}")))
            except (ValueError, TypeError) as exc:
                status = "400 Bad Request"
                body = json.dumps({"error": str(exc)}).encode()
                start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
                return [body]
        body = json.dumps(self.report()).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]


def drain(environ: dict[str, Any]) -> None:
    """Read the request body, as S3 does before it answers an error (keeps the connection usable)."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    stream = environ["wsgi.input"]
    while length > 0:
        got = stream.read(min(length, 1 << 20))
        if not got:
            break
        length -= len(got)


def error_response(kind: str, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """The 500 or 503 answer; `reset` raises InjectedReset instead (see resetting_handler)."""
    if kind == "reset":
        raise InjectedReset(f"injected connection reset of {environ.get('REQUEST_METHOD')} {environ.get('PATH_INFO')}")
    drain(environ)
    status, body = _BODIES[kind]
    start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
    return [body]


class InjectedReset(ConnectionResetError):
    """Raised by the middleware: the request handler answers it by resetting the connection."""


_libc: Any = None


def send_reset(sock: socket.socket) -> None:
    """Reset a connected TCP socket now: connect(AF_UNSPEC) makes Linux send a RST and drop it.

    (SO_LINGER 0 and close would too, but the server shuts the socket down
    with a FIN first, which the client reads as a clean close.)
    """
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    address = struct.pack("=H14x", socket.AF_UNSPEC)
    if _libc.connect(sock.fileno(), address, len(address)) != 0:
        # Not Linux, or already gone: an abortive close is the next best thing.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)


def resetting_handler(base: type) -> type:
    """`base` (a werkzeug request handler) that turns InjectedReset into a TCP reset."""

    class ResettingHandler(base):  # type: ignore[misc, valid-type]
        def connection_dropped(self, error: BaseException, environ: Any = None) -> None:
            if isinstance(error, InjectedReset):
                try:
                    send_reset(self.connection)
                except OSError:
                    pass  # the client went first
                self.close_connection = True
                return
            super().connection_dropped(error, environ)

    return ResettingHandler


def settings_from_args(rate: float, kinds: str, seed: int, callers: str) -> FaultSettings:
    """`--s3-faults RATE --s3-fault-kinds 500,503,reset --s3-fault-seed N --s3-fault-callers WHO`."""
    return FaultSettings(rate=rate, kinds=tuple(k for k in kinds.split(",") if k), seed=seed, callers=callers)
