"""A backup's place in an incremental chain: `kind`, `parent` and `chain_full` (docs/format.md, Chains).

A full backup stands alone. An incremental holds only what changed since its
parent (the database's own incremental: pg_basebackup --incremental, mariadb-backup
--incremental-lsn, Db2 INCREMENTAL), so restoring it needs every ancestor down
to the chain's full. The manifest records the link, sealed and authenticated
with everything else; readers of a manifest that predates chains (version 2)
read it as a full backup.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from braid.errors import UsageError
from braid.format.ids import BackupRef

__all__ = ["FULL", "INCREMENTAL", "Lineage"]

FULL = "full"
INCREMENTAL = "incremental"


@dataclass(frozen=True)
class Lineage:
    """`parent` and `chain_full` are NAME@ID of the same name; both None for a full backup."""

    kind: str = FULL
    parent: str | None = None
    chain_full: str | None = None

    @classmethod
    def incremental(cls, parent: BackupRef, parent_lineage: Lineage) -> Lineage:
        """The lineage of a new incremental on top of `parent` (whose own lineage is `parent_lineage`)."""
        return cls(INCREMENTAL, str(parent), parent_lineage.chain_full or str(parent))

    @property
    def is_incremental(self) -> bool:
        return self.kind == INCREMENTAL

    def full_of(self, backup: str) -> str:
        """The chain's full backup for the backup with this lineage (itself, for a full one)."""
        return self.chain_full or backup

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "parent": self.parent, "chain_full": self.chain_full}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], backup: str) -> Lineage:
        """The lineage a manifest or summary body records; ValueError for anything else (the caller says where)."""
        kind, parent, full = doc.get("kind"), doc.get("parent"), doc.get("chain_full")
        if kind == FULL:
            if parent is not None or full is not None:
                raise ValueError("a full backup has no parent and no chain_full")
            return cls()
        if kind != INCREMENTAL:
            raise ValueError(f"kind must be {FULL!r} or {INCREMENTAL!r}, not {kind!r}")
        if not isinstance(parent, str) or not isinstance(full, str):
            raise ValueError("an incremental names its parent and its chain's full as NAME@ID")
        name = backup.partition("@")[0]
        for role, text in (("parent", parent), ("chain_full", full)):
            try:
                ref = BackupRef.parse(text)
            except UsageError as exc:
                raise ValueError(f"{role}: {exc}") from None
            if ref.is_latest or ref.name != name or text == backup:
                raise ValueError(f"{role} {text!r} is not another exact backup of {name}")
            if ref.id >= backup.partition("@")[2]:
                raise ValueError(f"{role} {text!r} is not older than {backup}")
        if full > parent:
            raise ValueError(f"chain_full {full!r} is newer than the parent {parent!r}")
        return cls(INCREMENTAL, parent, full)
