"""What a PostgreSQL base backup says about its WAL, as recorded in a manifest's `wal` field.

pg_basebackup -Ft writes, inside its tar, `backup_label` (start LSN and
segment, checkpoint, timeline, label, start time), `PG_VERSION`,
`global/pg_control` (the system identifier is its first 8 bytes) and, from
PostgreSQL 13, `backup_manifest`, whose `WAL-Ranges` give the timeline and
the start and end LSN of the WAL the backup needs (PostgreSQL 17 adds a
`System-Identifier` to it). Braid captures those members as the stream
passes (braid.engine.capture) and records (docs/format.md, Manifest):

    "wal": {"start_lsn": "0/2000028", "stop_lsn": "0/2000100", "timeline": 1,
            "system_identifier": 7441..., "pg_version": 15,
            "start_wal": "000000010000000000000002", "stop_wal": "000000010000000000000002",
            "checkpoint_lsn": "0/2000060", "label": "...", "start_time": "2026-11-28 08:12:41 UTC"}

LSNs are PostgreSQL's "X/Y" text; integers are JSON integers. A field the
stream did not reveal is absent (an old server without backup_manifest has
no stop_lsn).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["WalInfo", "format_lsn", "parse_lsn", "wal_file_name", "wal_info_from_members"]

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_WAL_FILE = re.compile(r"^([0-9A-F]{8})([0-9A-F]{8})([0-9A-F]{8})$")
DEFAULT_SEGMENT = 16 << 20


def parse_lsn(text: str) -> int:
    """`X/Y` (hex halves) to a 64-bit position; ValueError otherwise."""
    match = _LSN.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not an LSN (X/Y, hexadecimal)")
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def wal_file_name(timeline: int, lsn: int, segment_size: int = DEFAULT_SEGMENT) -> str:
    """The WAL segment file holding `lsn` on `timeline`, as PostgreSQL names it (XLogFileName)."""
    per_id = 0x100000000 // segment_size
    segno = lsn // segment_size
    return f"{timeline:08X}{segno // per_id:08X}{segno % per_id:08X}"


def _segment_size(start_lsn: int, start_wal: str) -> int:
    """The segment size that names `start_lsn`'s segment `start_wal` (1 MiB .. 1 GiB, powers of two); 16 MiB if unsure."""
    match = _WAL_FILE.match(start_wal)
    if match is None:
        return DEFAULT_SEGMENT
    fits = [1 << bits for bits in range(20, 31) if wal_file_name(int(match.group(1), 16), start_lsn, 1 << bits) == start_wal]
    return DEFAULT_SEGMENT if DEFAULT_SEGMENT in fits or len(fits) != 1 else fits[0]


@dataclass(frozen=True)
class WalInfo:
    """The manifest's `wal` field; every field optional but read as documented."""

    fields: dict[str, Any]

    @property
    def start_lsn(self) -> int | None:
        return _lsn_field(self.fields, "start_lsn")

    @property
    def stop_lsn(self) -> int | None:
        return _lsn_field(self.fields, "stop_lsn")

    @property
    def timeline(self) -> int | None:
        value = self.fields.get("timeline")
        return value if isinstance(value, int) else None

    def to_json(self) -> dict[str, Any]:
        return dict(self.fields)

    @classmethod
    def from_json(cls, doc: Any) -> WalInfo:
        """Checks the documented types; ValueError on a malformed field."""
        if not isinstance(doc, dict):
            raise ValueError("wal is not an object")
        for name in ("start_lsn", "stop_lsn", "checkpoint_lsn"):
            if name in doc:
                parse_lsn(_str(doc, name))
        for name in ("timeline", "system_identifier", "pg_version"):
            if name in doc and (type(doc[name]) is not int or doc[name] < 0):
                raise ValueError(f"wal.{name} is not a non-negative integer")
        for name in ("start_wal", "stop_wal", "label", "start_time"):
            if name in doc:
                _str(doc, name)
        return cls(dict(doc))


def _str(doc: Mapping[str, Any], name: str) -> str:
    value = doc[name]
    if not isinstance(value, str):
        raise ValueError(f"wal.{name} is not a string")
    return value


def _lsn_field(doc: Mapping[str, Any], name: str) -> int | None:
    value = doc.get(name)
    return parse_lsn(value) if isinstance(value, str) else None


def parse_backup_label(text: str) -> dict[str, Any]:
    """The fields of a backup_label Braid records (those present)."""
    found: dict[str, Any] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if not sep:
            continue
        value = value.strip()
        if key == "START WAL LOCATION":
            lsn, _, rest = value.partition(" ")
            found["start_lsn"] = format_lsn(parse_lsn(lsn))
            file = re.search(r"\(file ([0-9A-F]{24})\)", rest)
            if file:
                found["start_wal"] = file.group(1)
        elif key == "CHECKPOINT LOCATION":
            found["checkpoint_lsn"] = format_lsn(parse_lsn(value))
        elif key == "START TIMELINE" and value.isdigit():
            found["timeline"] = int(value)
        elif key == "LABEL":
            found["label"] = value
        elif key == "START TIME":
            found["start_time"] = value
    return found


def parse_backup_manifest(raw: bytes) -> dict[str, Any]:
    """From PostgreSQL's backup_manifest: the WAL range (first start, last end, its timeline) and, PG 17+, the system identifier."""
    doc = json.loads(raw.decode("utf-8"))
    found: dict[str, Any] = {}
    ranges = doc.get("WAL-Ranges") or []
    if ranges:
        found["manifest_start_lsn"] = format_lsn(min(parse_lsn(r["Start-LSN"]) for r in ranges))
        last = max(ranges, key=lambda r: parse_lsn(r["End-LSN"]))
        found["stop_lsn"] = format_lsn(parse_lsn(last["End-LSN"]))
        found["stop_timeline"] = int(last["Timeline"])
    if isinstance(doc.get("System-Identifier"), int):
        found["system_identifier"] = doc["System-Identifier"]
    return found


def system_identifier_from_control(head: bytes) -> int | None:
    """pg_control's first field, read in the byte order its version field (PG 9.x..: 900..2000) shows."""
    if len(head) < 12:
        return None
    if 900 <= int.from_bytes(head[8:12], "little") < 10000:
        return int.from_bytes(head[:8], "little")
    if 900 <= int.from_bytes(head[8:12], "big") < 10000:
        return int.from_bytes(head[:8], "big")
    return None


def wal_info_from_members(members: Mapping[str, bytes]) -> WalInfo | None:
    """The `wal` field from the captured members (backup_label, backup_manifest, PG_VERSION, global/pg_control); None without a backup_label."""
    label = members.get("backup_label")
    if label is None:
        return None
    try:
        fields = parse_backup_label(label.decode("utf-8", "replace"))
    except ValueError:
        return None
    if "start_lsn" not in fields:
        return None
    version = members.get("PG_VERSION", b"").decode("ascii", "replace").strip()
    if version.isdigit():
        fields["pg_version"] = int(version)
    control = members.get("global/pg_control")
    identifier = system_identifier_from_control(control) if control is not None else None
    if identifier is not None:
        fields["system_identifier"] = identifier
    manifest = members.get("backup_manifest")
    if manifest is not None:
        try:
            from_manifest = parse_backup_manifest(manifest)
        except (ValueError, KeyError, TypeError):
            from_manifest = {}
        timeline = from_manifest.pop("stop_timeline", fields.get("timeline"))
        from_manifest.pop("manifest_start_lsn", None)
        fields.update(from_manifest)
        if "stop_lsn" in fields and isinstance(timeline, int):
            size = _segment_size(parse_lsn(fields["start_lsn"]), fields.get("start_wal", ""))
            # The segment holding the byte before the end (PostgreSQL's XLByteToPrevSeg): an end on a boundary needs only the one before.
            fields["stop_wal"] = wal_file_name(timeline, max(0, parse_lsn(fields["stop_lsn"]) - 1), size)
    return WalInfo(fields)
