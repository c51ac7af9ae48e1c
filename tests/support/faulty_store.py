"""An ObjectStore that fails on purpose: by request kind, at a rate, from a seeded RNG.

Wraps a real store (LocalStore, S3Store) and, for the requests its rules
pick, does one of:

  fail     raise StorageError before the request reaches the store (the
           store's own typed error for "refused or failed"): nothing happened
  after    do the request, then raise StorageError: it happened, but the
           caller was told it failed (an answer lost on the way back)
  corrupt  (get, get_range) return the stored bytes with one bit flipped:
           what a bad disk or a bad cable hands back

Request kinds are the port's operations: put, sync, get (get and get_into),
get_range, head, list, delete. A rule may be narrowed to keys containing a
substring (`match`) and to its first `times` injections. Every injection is
counted, by "kind:mode", so a test can assert that faults really happened:
a fault suite whose faults never fire passes for the wrong reason.

The local engine has no retry layer (a disk does not throw transient
errors), so through this store a backup must fail cleanly (exit 7, nothing
published, its chunks removed) and a restore must fail without writing a
byte that is not the backup's.

Run as a program, it is the real `braid` CLI with its repository store
wrapped, for tests and scripts/soak that want a separate process:

    .venv/bin/python tests/support/faulty_store.py --fault put=0.2 --seed 7 \\
        [--fault get=1:corrupt:data/] [--stats FILE] -- backup --repo R --name db

`--fault KIND=RATE[:MODE[:MATCH[:TIMES]]]`; `--stats FILE` receives the
counts as JSON when the command ends (stderr stays the CLI's own).
"""

from __future__ import annotations

import json
import random
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from braid.errors import StorageError
from braid.ports.store import Buffer, ObjectInfo, ObjectStore

KINDS = ("put", "sync", "get", "get_range", "head", "list", "delete")
MODES = ("fail", "after", "corrupt")
T = TypeVar("T")


@dataclass(frozen=True)
class FaultRule:
    kind: str
    rate: float = 1.0
    mode: str = "fail"
    match: str = ""  # only keys (list: prefixes) containing this
    times: int | None = None  # at most this many injections by this rule

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown request kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.mode not in MODES:
            raise ValueError(f"unknown fault mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.mode == "corrupt" and self.kind not in ("get", "get_range"):
            raise ValueError("only get and get_range can return corrupt bytes")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"fault rate {self.rate} is not in [0, 1]")

    @classmethod
    def parse(cls, text: str) -> FaultRule:
        """`KIND=RATE[:MODE[:MATCH[:TIMES]]]`, e.g. `put=0.05`, `get=1:corrupt:data/:1`."""
        kind, _, rest = text.partition("=")
        fields = rest.split(":") if rest else ["1"]
        rate = float(fields[0])
        mode = fields[1] if len(fields) > 1 and fields[1] else "fail"
        match = fields[2] if len(fields) > 2 else ""
        times = int(fields[3]) if len(fields) > 3 and fields[3] else None
        return cls(kind, rate, mode, match, times)


class FaultyStore:
    """The ObjectStore port around `inner`, failing what `rules` pick; thread-safe."""

    def __init__(self, inner: ObjectStore, rules: Iterable[FaultRule], seed: int = 0) -> None:
        self.inner = inner
        self.rules = list(rules)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._fired: Counter[int] = Counter()  # per rule index
        self.calls: Counter[str] = Counter()  # by kind
        self.injected: Counter[str] = Counter()  # by "kind:mode"

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def total_injected(self) -> int:
        return sum(self.injected.values())

    def counts(self) -> dict[str, Any]:
        with self._lock:
            return {"calls": dict(self.calls), "injected": dict(self.injected), "total": sum(self.injected.values())}

    def _draw(self, kind: str, key: str) -> str | None:
        """The mode of the fault this request gets, or None."""
        with self._lock:
            self.calls[kind] += 1
            for index, rule in enumerate(self.rules):
                if rule.kind != kind or rule.match not in key:
                    continue
                if rule.times is not None and self._fired[index] >= rule.times:
                    continue
                if self._rng.random() < rule.rate:
                    self._fired[index] += 1
                    self.injected[f"{kind}:{rule.mode}"] += 1
                    return rule.mode
            return None

    def _error(self, kind: str, key: str, mode: str) -> StorageError:
        lost = " after it was done (the answer was lost)" if mode == "after" else ""
        return StorageError(f"injected fault: {kind} of {key} in {self.url} failed{lost}")

    def _call(self, kind: str, key: str, request: Callable[[], T]) -> T:
        mode = self._draw(kind, key)
        if mode == "fail":
            raise self._error(kind, key, mode)
        result = request()
        if mode == "after":
            raise self._error(kind, key, mode)
        return result

    @staticmethod
    def _flip(data: Buffer) -> bytes:
        corrupted = bytearray(data)
        if corrupted:
            corrupted[len(corrupted) // 2] ^= 0x01
        return bytes(corrupted)

    # -- the port ---------------------------------------------------------------------

    def put(
        self, key: str, data: Buffer, *, checksum: str | None = None, create_only: bool = False, durable: bool = True, replacing: str | None = None
    ) -> None:
        self._call("put", key, lambda: self.inner.put(key, data, checksum=checksum, create_only=create_only, durable=durable, replacing=replacing))

    def sync(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._call("sync", keys[0] if keys else "", lambda: self.inner.sync(keys))

    def get(self, key: str) -> bytes:
        mode = self._draw("get", key)
        if mode == "fail":
            raise self._error("get", key, mode)
        data = self.inner.get(key)
        if mode == "after":
            raise self._error("get", key, mode)
        return self._flip(data) if mode == "corrupt" else data

    def get_into(self, key: str, buffer: bytearray) -> memoryview | bytes:
        """As the inner store's `get_into` (or `get`), so restore takes its usual path."""
        mode = self._draw("get", key)
        if mode == "fail":
            raise self._error("get", key, mode)
        get_into = getattr(self.inner, "get_into", None)
        data = get_into(key, buffer) if get_into else self.inner.get(key)
        if mode == "after":
            raise self._error("get", key, mode)
        return self._flip(data) if mode == "corrupt" else data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        mode = self._draw("get_range", key)
        if mode == "fail":
            raise self._error("get_range", key, mode)
        data = self.inner.get_range(key, start, length)
        if mode == "after":
            raise self._error("get_range", key, mode)
        return self._flip(data) if mode == "corrupt" else data

    def head(self, key: str) -> ObjectInfo | None:
        return self._call("head", key, lambda: self.inner.head(key))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        mode = self._draw("list", prefix)
        if mode == "fail":
            raise self._error("list", prefix, mode)
        yield from self.inner.list(prefix)
        if mode == "after":
            raise self._error("list", prefix, mode)

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._call("delete", keys[0] if keys else "", lambda: self.inner.delete(keys))

    def __getattr__(self, name: str) -> Any:
        """Optional capabilities of the inner store (e.g. list_temporary), unfaulted."""
        return getattr(self.inner, name)


# -- the CLI with a faulty store ------------------------------------------------------------


def install(rules: list[FaultRule], seed: int) -> list[FaultyStore]:
    """Make the CLI's composition root wrap every store it opens; returns the stores made."""
    from braid.cli import compose

    opened: list[FaultyStore] = []
    real_open = compose.open_store

    def open_faulty(url: str) -> ObjectStore:
        store = FaultyStore(real_open(url), rules, seed + len(opened))
        opened.append(store)
        return store

    compose.open_store = open_faulty  # type: ignore[assignment]
    return opened


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="faulty_store", description="the braid CLI over a fault-injecting store")
    parser.add_argument("--fault", action="append", type=FaultRule.parse, default=[], metavar="KIND=RATE[:MODE[:MATCH[:TIMES]]]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stats", type=Path, help="write the injection counts here (JSON) when the command ends")
    parser.add_argument("braid_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    braid_args = args.braid_args[1:] if args.braid_args[:1] == ["--"] else args.braid_args
    opened = install(args.fault, args.seed)
    from braid.cli.main import main as braid_main

    try:
        return braid_main(braid_args)
    finally:
        if args.stats:
            totals: Counter[str] = Counter()
            calls: Counter[str] = Counter()
            for store in opened:
                totals.update(store.injected)
                calls.update(store.calls)
            args.stats.write_text(json.dumps({"calls": dict(calls), "injected": dict(totals), "total": sum(totals.values())}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
