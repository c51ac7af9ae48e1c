"""Verify records: writing one per verification, and what the repository's records say.

One module for every reader and writer of braid.format.verification:
`braid verify` (host-side) and the cloud's recorder write; `show` reads a
backup's newest record, `list` every backup's newest outcome from one LIST,
a rotating verify the part to check next, and the scheduled prune
`failed_verifications` (backups whose newest verification failed: it
distrusts them, so a corrupt latest backup never pushes out an older good
one). A missing record is never an error: most backups have none yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from braid.errors import IntegrityError, NotFoundError
from braid.format.ids import BackupRef
from braid.format.layout import parse_verification_key, verification_key, verification_prefix
from braid.format.repository import Repository
from braid.format.summary import catalog_stamp, parse_catalog_stamp
from braid.format.timestamps import format_timestamp, parse_timestamp
from braid.format.verification import FAILED, MAX_LISTED_FAILURES, OK, Selection, VerificationRecord
from braid.ops.verify import VerifyReport
from braid.ports.store import ObjectStore


@dataclass(frozen=True)
class VerificationMark:
    """What a record's key alone says: which backup, when, how, and the outcome."""

    ref: BackupRef
    key: str
    at: str  # braid.format.timestamps
    mode: str
    outcome: str

    def to_json(self) -> dict[str, str]:
        return {"at": self.at, "mode": self.mode, "outcome": self.outcome}


def new_record(
    backup: str,
    *,
    mode: str,
    selection: Selection,
    engine: str,
    chunks_total: int,
    chunks_checked: int,
    bytes_checked: int,
    failures: list[str],
    corrupt: bool,
    at: datetime,
) -> VerificationRecord:
    return VerificationRecord(
        backup=backup,
        at=format_timestamp(at),
        mode=mode,
        selection=selection,
        engine=engine,
        chunks_total=chunks_total,
        chunks_checked=chunks_checked,
        bytes_checked=bytes_checked,
        failures=failures[:MAX_LISTED_FAILURES],
        failure_count=len(failures),
        corrupt=corrupt,
    )


def write_record(store: ObjectStore, record: VerificationRecord) -> str:
    """Store `record` under its backup (create-only: a record is never rewritten); its key."""
    ref = BackupRef.parse(record.backup)
    key = verification_key(ref, catalog_stamp(parse_timestamp(record.at)), record.mode, record.outcome)
    store.put(key, record.encode(), create_only=True)
    return key


def _mark(key: str) -> VerificationMark | None:
    parsed = parse_verification_key(key)
    if parsed is None:
        return None
    ref, stamp, mode, outcome = parsed
    if outcome not in (OK, FAILED):
        return None
    try:
        at = format_timestamp(parse_catalog_stamp(stamp))
    except ValueError:
        return None
    return VerificationMark(ref, key, at, mode, outcome)


def latest_marks(store: ObjectStore, ref: BackupRef | None = None) -> dict[BackupRef, VerificationMark]:
    """Every backup's newest verification (or only `ref`'s), from record keys alone: one LIST, no GET."""
    newest: dict[BackupRef, VerificationMark] = {}
    for info in store.list(verification_prefix(ref)):
        mark = _mark(info.key)
        if mark is not None and (mark.ref not in newest or mark.key > newest[mark.ref].key):
            newest[mark.ref] = mark
    return newest


def read_record(store: ObjectStore, key: str) -> VerificationRecord | None:
    try:
        return VerificationRecord.decode(store.get(key), key)
    except NotFoundError:  # removed with its backup meanwhile
        return None


def latest_verification(store: ObjectStore, ref: BackupRef) -> VerificationRecord | None:
    """The newest verify record of `ref`, or None if it was never verified."""
    mark = latest_marks(store, ref).get(ref)
    return read_record(store, mark.key) if mark is not None else None


def verification_history(store: ObjectStore, ref: BackupRef) -> list[VerificationMark]:
    """All of `ref`'s records, oldest first."""
    marks = [m for m in (_mark(i.key) for i in store.list(verification_prefix(ref))) if m is not None]
    return sorted(marks, key=lambda m: m.key)


def failed_verifications(repository: Repository) -> dict[BackupRef, str]:
    """Backups whose newest verification failed, each with its first failure.

    For the scheduled prune: such a backup counts towards no keep rule and
    is not removed by it. A record that cannot be read still says (by its
    key) that the verification failed, so it still counts as failed.
    """
    failed: dict[BackupRef, str] = {}
    for ref, mark in sorted(latest_marks(repository.store).items()):
        if mark.outcome != FAILED:
            continue
        try:
            record = read_record(repository.store, mark.key)
        except IntegrityError as exc:
            failed[ref] = f"backup {ref} failed its {mark.mode} verification of {mark.at} (its record is unreadable: {exc})"
            continue
        if record is None:
            continue
        first = record.failures[0] if record.failures else "unknown failure"
        failed[ref] = f"backup {ref} failed its {mark.mode} verification of {mark.at}: {first}"
    return failed


def next_rotation(store: ObjectStore, ref: BackupRef, of: int) -> Selection:
    """The rotation part after the newest record's of the same size (`of`); part 1 when there is none.

    Only records of a rotation of `of` parts count, so a sampled run in
    between does not move the rotation, and changing `of` starts over.
    """
    for mark in reversed(verification_history(store, ref)):
        try:
            record = read_record(store, mark.key)
        except IntegrityError:
            continue
        if record is not None and record.selection.kind == "rotation" and record.selection.of == of:
            assert record.selection.part is not None
            return Selection.rotation(record.selection.part % of + 1, of)
    return Selection.rotation(1, of)


def record_of_report(report: VerifyReport, selection: Selection, engine: str, at: datetime) -> VerificationRecord:
    """The record of a host-side verify (braid.ops.verify)."""
    return new_record(
        report.backup,
        mode=report.mode,
        selection=selection,
        engine=engine,
        chunks_total=report.chunks_total,
        chunks_checked=report.chunks_checked,
        bytes_checked=report.bytes_checked,
        failures=report.failures,
        corrupt=report.corrupt,
        at=at,
    )
