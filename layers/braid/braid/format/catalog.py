"""The catalog snapshot: every published backup's summary in one object.

`list` on a repository of 10,000 backups cannot afford one request per
backup (a LIST of 10,000 manifest keys alone takes seconds on an emulated
S3, and a GET per summary far longer). A snapshot folds the summaries known
at its `through` time into one object; a reader adds the log markers written
since (braid.format.layout: `catalog/log/`), which are few, and so touches a
handful of objects whatever the repository's size.

A snapshot is a cache, never a source of truth: it is rebuilt from
manifests and summaries (braid.ops.catalog), written by whichever reader
finds the log long (a host without a key may write it: it holds no MAC,
only a SHA-256 against corruption, like everything `list` reads), and
create-only under a unique key, so concurrent writers never overwrite each
other; a reader takes the newest one that checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from braid.errors import IntegrityError
from braid.format.canonical import canonical_json
from braid.format.sealed import seal, unseal
from braid.format.summary import BackupSummary, parse_catalog_stamp

FORMAT = "braid-catalog"
VERSION = 1
FIELD = "catalog"


@dataclass(frozen=True)
class CatalogSnapshot:
    repository: str
    through: str  # catalog stamp: every log marker written before it is folded in
    backups: tuple[BackupSummary, ...]
    unreadable: tuple[str, ...] = ()  # NAME@ID of backups whose manifest did not read: a reader tries them again

    def to_bytes(self) -> bytes:
        body = {
            "format": FORMAT,
            "version": VERSION,
            "repository": self.repository,
            "through": self.through,
            "backups": [s.body() for s in sorted(self.backups, key=lambda s: s.backup)],
            "unreadable": sorted(self.unreadable),
        }
        return seal(FIELD, canonical_json(body), None)


def open_snapshot(raw: bytes, where: str) -> CatalogSnapshot:
    doc, _body, _mac = unseal(raw, FIELD, where, with_mac=False, strict=False)
    try:
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ValueError(f"unsupported {doc.get('format')} v{doc.get('version')}")
        through = doc["through"]
        parse_catalog_stamp(through)
        entries = doc["backups"]
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise TypeError("backups is not a list of objects")
        unreadable = doc["unreadable"]
        if not isinstance(unreadable, list) or not all(isinstance(u, str) for u in unreadable):
            raise TypeError("unreadable is not a list of strings")
        summaries = tuple(BackupSummary.from_body(e, where) for e in entries)
        return CatalogSnapshot(str(doc["repository"]), through, summaries, tuple(unreadable))
    except (KeyError, TypeError, ValueError) as exc:
        raise IntegrityError(f"{where}: not a valid Braid catalog snapshot ({exc})") from None
