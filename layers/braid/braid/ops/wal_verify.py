"""`verify --wal`: is the WAL archive continuous from each backup's start to the newest segment?

The newest segment is the highest-numbered one on the newest timeline. Its
history file (decrypted: every archived file is) names the timelines before
it and where each one switched, so from a backup's start the WAL needed is:
on the backup's timeline, its start segment up to the segment before the
one the next timeline on the path begins with; on each later timeline, from
its first segment (the one holding the switch position) up to the next
switch; on the newest, up to the newest segment. A backup on a timeline off
that path is checked on its own timeline, to that timeline's newest segment.
Every run of missing segments is a gap, named by its first and last file.
A backup whose manifest records no WAL start is listed and not checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from braid.errors import BackupError
from braid.format.ids import BackupRef
from braid.format.repository import Repository
from braid.format.wal import HISTORY, SEGMENT, WalFile, parse_lsn, segment_name, segment_of
from braid.ops.open import read_manifest
from braid.ops.wal import archived_files, segment_size_of
from braid.ops.wal_fetch import fetch_wal_bytes
from braid.ops.wal_retention import wal_start
from braid.ports.keys import KeyService


@dataclass
class BackupWal:
    """One backup's WAL from its start: the ranges checked and the gaps found."""

    backup: str
    start: str | None  # its first needed segment, None when its manifest records no start
    ranges: list[tuple[str, str]] = field(default_factory=list)  # (first, last) segment checked, per timeline
    gaps: list[tuple[str, str, int]] = field(default_factory=list)  # (first, last, count) of each run of missing segments
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "backup": self.backup, "start": self.start, "ranges": [list(r) for r in self.ranges],
            "gaps": [{"first": a, "last": b, "missing": n} for a, b, n in self.gaps], **({"note": self.note} if self.note else {}),
        }


@dataclass
class WalReport:
    name: str
    newest: str | None
    timelines: list[int]
    backups: list[BackupWal]

    @property
    def gaps(self) -> list[tuple[str, tuple[str, str, int]]]:
        return [(b.backup, gap) for b in self.backups for gap in b.gaps]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "newest": self.newest, "timelines": self.timelines, "ok": not self.gaps,
                "backups": [b.to_json() for b in self.backups]}


def parse_history(text: str, where: str) -> list[tuple[int, int]]:
    """A timeline history file's (parent timeline, switch LSN) lines, oldest first."""
    entries = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        try:
            entries.append((int(fields[0]), parse_lsn(fields[1])))
        except (IndexError, ValueError, BackupError):
            raise BackupError(f"{where}: not a timeline history line: {line[:80]!r}") from None
    return entries


def verify_wal(repository: Repository, keys: KeyService, name: str) -> WalReport:
    store = repository.store
    size = segment_size_of(store, name)
    segments: dict[int, set[int]] = {}
    histories: list[WalFile] = []
    for file, _key in archived_files(store, name):
        if file.kind == SEGMENT:
            segments.setdefault(file.timeline, set()).add(file.segno(size))
        elif file.kind == HISTORY:
            histories.append(file)
    timelines = sorted(set(segments) | {h.timeline for h in histories})
    if not segments:
        return WalReport(name, None, timelines, [_nothing_archived(repository, ref, size) for ref in repository.backups(name)])
    newest_timeline = max(segments)
    newest = max(segments[newest_timeline])
    # The path to the newest timeline: (timeline, first segment on it or None, switch LSN out of it or None).
    path: list[tuple[int, int | None]] = [(newest_timeline, None)]
    history = next((h for h in histories if h.timeline == newest_timeline), None)
    if history is not None:
        text = bytes(fetch_wal_bytes(repository, keys, name, history.name)).decode(errors="replace")
        entries = parse_history(text, f"archived {history.name}")
        path = [(parent, switch) for parent, switch in entries] + [(newest_timeline, None)]
    on_path = {timeline: i for i, (timeline, _switch) in enumerate(path)}
    report = WalReport(name, segment_name(newest_timeline, newest, size), timelines, [])
    for ref in repository.backups(name):
        report.backups.append(_check(repository, ref, path, on_path, segments, size))
    return report


def _nothing_archived(repository: Repository, ref: BackupRef, size: int) -> BackupWal:
    """A backup of an archive that holds no segment: its start segment is the gap (if its manifest says where it starts)."""
    try:
        start = wal_start(read_manifest(repository, ref))
    except BackupError as exc:
        return BackupWal(str(ref), None, note=f"not checked: {exc}")
    if start is None:
        return BackupWal(str(ref), None, note="not checked: its manifest records no WAL start")
    first = segment_name(start[0], segment_of(start[1], size), size)
    return BackupWal(str(ref), first, gaps=[(first, first, 1)], note="the archive holds no segment")


def _check(
    repository: Repository, ref: BackupRef, path: list[tuple[int, int | None]], on_path: dict[int, int], segments: dict[int, set[int]], size: int
) -> BackupWal:
    try:
        start = wal_start(read_manifest(repository, ref))
    except BackupError as exc:
        return BackupWal(str(ref), None, note=f"not checked: {exc}")
    if start is None:
        return BackupWal(str(ref), None, note="not checked: its manifest records no WAL start")
    timeline, lsn = start
    first = segment_of(lsn, size)
    result = BackupWal(str(ref), segment_name(timeline, first, size))
    if timeline not in on_path:  # off the newest timeline's path: its own timeline, to its newest segment
        result.note = "its timeline is not on the path to the newest timeline: checked to its own timeline's newest segment"
        _range(result, timeline, first, max(segments.get(timeline, {first})), segments, size)
        return result
    begin = first
    for index in range(on_path[timeline], len(path)):
        line, switch = path[index]
        if index > on_path[timeline]:
            begin = segment_of(path[index - 1][1] or 0, size)  # a new timeline starts with the segment holding the switch
        end = segment_of(switch, size) - 1 if switch is not None else max(segments.get(line, {begin}))
        _range(result, line, begin, max(begin, end) if switch is None else end, segments, size)
    return result


def _range(result: BackupWal, timeline: int, first: int, last: int, segments: dict[int, set[int]], size: int) -> None:
    if last < first:
        return
    result.ranges.append((segment_name(timeline, first, size), segment_name(timeline, last, size)))
    present = segments.get(timeline, set())
    run: list[int] = []
    for segno in range(first, last + 1):
        if segno not in present:
            run.append(segno)
            continue
        if run:
            result.gaps.append((segment_name(timeline, run[0], size), segment_name(timeline, run[-1], size), len(run)))
            run = []
    if run:
        result.gaps.append((segment_name(timeline, run[0], size), segment_name(timeline, run[-1], size), len(run)))


def describe(report: WalReport) -> list[str]:
    lines = []
    for backup in report.backups:
        if backup.start is None:
            lines.append(f"{backup.backup}: {backup.note}")
            continue
        spans = ", ".join(f"{a} .. {b}" for a, b in backup.ranges) or "nothing archived after its start"
        state = "continuous" if not backup.gaps else f"{len(backup.gaps)} gap(s)"
        lines.append(f"{backup.backup}: from {backup.start}: {spans}: {state}" + (f" ({backup.note})" if backup.note else ""))
        lines += [f"  gap: {a} .. {b} ({n} segment(s) missing)" for a, b, n in backup.gaps]
    newest = report.newest or "none"
    lines.append(f"WAL archive of {report.name}: newest segment {newest}, timelines {', '.join(map(str, report.timelines)) or 'none'}")
    return lines

