"""A verify record: what one verification of one backup found, kept beside its manifest.

Every run of `braid verify` (host-side or the cloud's verify state machine)
writes one record per backup it checked, under the backup's own prefix
`verify/NAME/ID/` (braid.format.layout.verification_key), and never
rewrites one: the history is the records, so two verifications running at
once cannot lose each other's result, and a rotating verify finds where the
previous run stopped.

The record's key carries when, the mode and the outcome
(`STAMP~MODE~OUTCOME.json`), so `braid list` learns every backup's newest
verification from one LIST of `verify/` (1,000 keys a request), never a GET
per backup; `show`, the rotation and the scheduled prune read the newest
record's body. A record is evidence for people and for prune's distrust,
never for trust: nothing treats an "ok" record as a reason to skip a check,
so it is plain JSON (no MAC) with a SHA-256 over its body to tell a damaged
record from a valid one. Readers tolerate absence: a backup never verified
simply has no record.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from braid.errors import IntegrityError
from braid.format.canonical import canonical_json
from braid.format.fields import Fields

FORMAT = "braid-verification"
VERSION = 1
MODES = ("quick", "deep")
OK = "ok"
FAILED = "failed"
OUTCOMES = (OK, FAILED)
MAX_LISTED_FAILURES = 100  # a record names at most this many problems; `failure_count` says how many there were


@dataclass(frozen=True)
class Selection:
    """Which chunks a run checked: all, a random `percent`, or part `part` of `of` of a rotation.

    A rotation checks the chunks whose index is `part - 1` modulo `of`
    (as restic's `--read-data-subset n/t`), so `of` consecutive runs, each
    taking the part after the previous record's, check every chunk once.
    """

    kind: str = "all"  # "all" | "sample" | "rotation"
    percent: float | None = None
    part: int | None = None
    of: int | None = None

    @classmethod
    def sample(cls, percent: float | None) -> Selection:
        return cls() if percent is None or percent >= 100 else cls("sample", percent=float(percent))

    @classmethod
    def rotation(cls, part: int, of: int) -> Selection:
        if of < 1 or not 1 <= part <= of:
            raise ValueError(f"rotation part {part} of {of} is out of range")
        return cls("rotation", part=part, of=of)

    def describe(self) -> str:
        if self.kind == "sample":
            return f"sample {self.percent:g}%"
        if self.kind == "rotation":
            return f"part {self.part}/{self.of}"
        return "all chunks"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": self.kind}
        if self.kind == "sample":
            doc["percent"] = self.percent
        if self.kind == "rotation":
            doc.update(part=self.part, of=self.of)
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> Selection:
        if not isinstance(doc, dict) or doc.get("kind") not in ("all", "sample", "rotation"):
            raise ValueError(f"not a chunk selection: {doc!r}")
        if doc["kind"] == "sample":
            percent = doc.get("percent")
            if isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 < percent < 100:
                raise ValueError(f"a sample's percent must be a number between 0 and 100, not {percent!r}")
            return cls("sample", percent=float(percent))
        if doc["kind"] == "rotation":
            f = Fields(doc, "a rotation", ("kind", "part", "of"))
            return cls.rotation(f.count("part"), f.count("of"))
        Fields(doc, "a selection of all chunks", ("kind",))
        return cls()


@dataclass(frozen=True)
class VerificationRecord:
    backup: str  # NAME@ID
    at: str  # when the verification finished (braid.format.timestamps)
    mode: str  # "quick" | "deep"
    selection: Selection
    engine: str  # who checked: "local" (this host) or "stepfunctions" (the verify state machine)
    chunks_total: int
    chunks_checked: int
    bytes_checked: int
    failures: list[str] = field(default_factory=list)  # the first MAX_LISTED_FAILURES, in chunk order
    failure_count: int = 0
    corrupt: bool = False  # something was read and found wrong (not only unreadable or unchecked)

    @property
    def outcome(self) -> str:
        return OK if self.failure_count == 0 else FAILED

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    def to_json(self) -> dict[str, Any]:
        return {
            "backup": self.backup,
            "at": self.at,
            "mode": self.mode,
            "selection": self.selection.to_json(),
            "engine": self.engine,
            "outcome": self.outcome,
            "chunks_total": self.chunks_total,
            "chunks_checked": self.chunks_checked,
            "bytes_checked": self.bytes_checked,
            "failure_count": self.failure_count,
            "failures": self.failures,
            "corrupt": self.corrupt,
        }

    def encode(self) -> bytes:
        body = self.to_json()
        return canonical_json({"format": FORMAT, "version": VERSION, "body": body, "sha256": _digest(body)})

    @classmethod
    def decode(cls, data: bytes, where: str) -> VerificationRecord:
        try:
            doc = json.loads(data)
            if doc.get("format") != FORMAT or doc.get("version") != VERSION:
                raise ValueError(f"not a {FORMAT} version {VERSION} document")
            body = doc["body"]
            if doc.get("sha256") != _digest(body):
                raise ValueError("its checksum does not match its body")
            if body["mode"] not in MODES:
                raise ValueError(f"unknown mode {body['mode']!r}")
            f = Fields(body, "its body", _BODY_FIELDS)
            if "corrupt" not in body:
                raise ValueError("its body is missing corrupt")
            return cls(
                backup=f.text("backup"),
                at=f.text("at"),
                mode=f.text("mode"),
                selection=Selection.from_json(body["selection"]),
                engine=f.text("engine"),
                chunks_total=f.count("chunks_total"),
                chunks_checked=f.count("chunks_checked"),
                bytes_checked=f.count("bytes_checked"),
                failures=f.texts("failures"),
                failure_count=f.count("failure_count"),
                corrupt=f.flag("corrupt"),
            )
        except IntegrityError as exc:
            raise IntegrityError(f"verify record {where} is damaged: {exc.message}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise IntegrityError(f"verify record {where} is damaged: {exc}") from None


_BODY_FIELDS = (
    "backup", "at", "mode", "selection", "engine", "outcome", "chunks_total", "chunks_checked", "bytes_checked",
    "failure_count", "failures", "corrupt",
)


def _digest(body: Any) -> str:
    return hashlib.sha256(canonical_json(body)).hexdigest()
