"""The cloud verify's documents: its execution input, its map items and each item's outcome.

    Identify ─► PlanVerify ─► Deep? ─yes─► CheckChunks (Distributed Map, EXPRESS children: VerifyWorker) ─┐
                                  └──no (quick, or nothing to read) ─────────────────────────────────────┴─► RecordVerify

The execution input (what `braid verify` and the daily schedule start):

    {"backups": ["NAME@ID" | "NAME@latest", ...] | "all" | "latest",
     "deep": false, "sample_percent": null | PCT, "rotate": null | N, "prefix": ""}

"latest" is each name's newest backup (the daily schedule). The run's work
objects live under `verify-runs/RUN/` (RUN: the execution's name,
braid.format.layout.verify_run_prefix): `plan.json` (per backup: the
selection, totals and the outcomes known already) and `items.json` (the
map's items), whose results, failed items included, come back through the
map's ResultWriter for RecordVerify.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from braid.errors import IntegrityError, UsageError
from braid.format.fields import Fields
from braid.format.ids import BackupRef
from braid.format.verification import Selection
from braid.pipeline.failure import invalid_input

CHUNKS_PER_ITEM = 8  # a 64 MiB chunk takes ~1 s to fetch, authenticate and decompress: an item stays well inside a worker's 60 s
PLAN_OBJECT = "plan.json"
ITEMS_OBJECT = "items.json"
DEFAULT_MAX_CONCURRENCY = 100


@dataclass(frozen=True)
class VerifyRequest:
    backups: tuple[str, ...] | str  # explicit NAME@ID / NAME@latest list, or "all" | "latest"
    deep: bool = False
    sample_percent: float | None = None
    rotate: int | None = None
    prefix: str = ""
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY

    @property
    def mode(self) -> str:
        return "deep" if self.deep else "quick"

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> VerifyRequest:
        with invalid_input("invalid verify request", TypeError, ValueError, UsageError):
            backups = event.get("backups", "latest")
            if isinstance(backups, str):
                if backups not in ("all", "latest"):
                    raise ValueError(f'"backups" is a list of NAME@ID, "all" or "latest", not {backups!r}')
                chosen: tuple[str, ...] | str = backups
            else:
                chosen = tuple(str(BackupRef.parse(str(b))) for b in backups)
                if not chosen:
                    raise ValueError('"backups" names no backup')
            sample = event.get("sample_percent")
            rotate = event.get("rotate")
            request = cls(
                backups=chosen,
                deep=bool(event.get("deep", False)),
                sample_percent=float(sample) if sample is not None else None,
                rotate=int(rotate) if rotate is not None else None,
                prefix=str(event.get("prefix", "")),
                max_concurrency=int(event.get("max_concurrency", DEFAULT_MAX_CONCURRENCY)),
            )
        if request.sample_percent is not None and not 0 < request.sample_percent <= 100:
            raise UsageError(f"invalid verify request: sample_percent must be in (0, 100], not {request.sample_percent}")
        if request.rotate is not None and request.rotate < 1:
            raise UsageError(f"invalid verify request: rotate must be at least 1, not {request.rotate}")
        if request.sample_percent is not None and request.rotate is not None:
            raise UsageError("invalid verify request: sample_percent and rotate exclude each other")
        return request


@dataclass(frozen=True)
class VerifyItem:
    """One map item: a few chunks of one backup, by index; the worker takes everything else from the manifest."""

    backup: str
    chunks: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"backup": self.backup, "chunks": list(self.chunks)}

    @classmethod
    def from_json(cls, doc: Any) -> VerifyItem:
        with invalid_input("invalid verify item", KeyError, TypeError, ValueError, UsageError):
            item = cls(str(BackupRef.parse(str(doc["backup"]))), tuple(int(i) for i in doc["chunks"]))
        return item


def items_of(backup: str, indices: Iterable[int], per_item: int = CHUNKS_PER_ITEM) -> list[VerifyItem]:
    chosen = list(indices)
    return [VerifyItem(backup, tuple(chosen[i : i + per_item])) for i in range(0, len(chosen), per_item)]


@dataclass
class ItemOutcome:
    """What checking some chunks of one backup found (a worker's item, a quick check, or a backup that would not open).

    `failures` are (chunk index, message) in chunk order; `corrupt` says at
    least one was read and found wrong (not merely unreadable or unchecked).
    """

    backup: str
    chunks_checked: int = 0
    bytes_checked: int = 0
    failures: list[tuple[int, str]] = field(default_factory=list)
    corrupt: bool = False

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "failures": [[i, m] for i, m in self.failures]}

    @classmethod
    def from_json(cls, doc: Any) -> ItemOutcome:
        with invalid_input("invalid verify outcome", IntegrityError, KeyError, TypeError, ValueError):
            f = Fields(doc, "verify outcome", ("backup", "chunks_checked", "bytes_checked", "failures", "corrupt"))
            failures = [(i, m) for i, m in f.objects("failures")]
            if any(type(i) is not int or not isinstance(m, str) for i, m in failures):
                raise ValueError(f"failures must be [index, message] pairs, not {doc['failures']!r}")
            outcome = cls(f.text("backup"), f.count("chunks_checked"), f.count("bytes_checked"), failures, f.flag("corrupt"))
        return outcome


@dataclass(frozen=True)
class PlannedBackup:
    """One backup of a run, as PlanVerify left it in `plan.json`."""

    backup: str
    selection: Selection
    chunks_total: int
    chunks_selected: int

    def to_json(self) -> dict[str, Any]:
        return {"backup": self.backup, "selection": self.selection.to_json(), "chunks_total": self.chunks_total, "chunks_selected": self.chunks_selected}

    @classmethod
    def from_json(cls, doc: Any) -> PlannedBackup:
        f = Fields(doc, "planned backup", ("backup", "selection", "chunks_total", "chunks_selected"))
        return cls(f.text("backup"), Selection.from_json(doc["selection"]), f.count("chunks_total"), f.count("chunks_selected"))
