"""A backup's summary: what `braid list` shows, without reading its manifest.

A manifest of a 1 TiB backup lists ~16,000 chunks (a few MB of JSON); `list`
needs a dozen numbers from it. The summary is those numbers, written by the
finalizer (local engine and cloud Finalize alike) just before the manifest,
sealed like it: HMAC-SHA256 under a key derived from the backup's data key
(label `summary-mac`), so only the data key's holder could have written it,
and SHA-256 over body and MAC, so a reader without a key (list, on a host
that holds none) detects corruption exactly as it does for manifests.

The manifest stays the source of truth: a summary is derived from it
(`BackupSummary.of`), holds nothing the manifest does not, and a reader
that finds one missing, corrupt or naming another backup or repository
reads the manifest instead (braid.ops.catalog). It names no key id, so
`braid rekey`, which rewrites only manifests, leaves it valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from braid.errors import IntegrityError
from braid.format.canonical import canonical_json
from braid.format.chain import Lineage
from braid.format.keys import DataKey
from braid.format.labels import check_labels
from braid.format.manifest import Manifest
from braid.format.pg_backup import WalInfo
from braid.format.sealed import seal, unseal
from braid.format.usage import Billed, check_billed

FORMAT = "braid-summary"
VERSION = 1
FIELD = "summary"


def catalog_stamp(moment: datetime | None = None) -> str:
    """The catalog's time stamps (log markers, snapshots): `YYYYMMDDTHHMMSS.ffffffZ`, UTC, so text order is time order."""
    return (moment or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def parse_catalog_stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)


@dataclass(frozen=True)
class BackupSummary:
    repository: str
    backup: str  # NAME@ID
    created: str
    completed: str
    engine: str
    inputs: int
    chunks: int
    plaintext_bytes: int
    stored_bytes: int
    # The billed quantities of the manifest's usage (braid.format.usage.Usage.billed), when it has one:
    # `list --json` prices them without reading the manifest; a dozen numbers, not the request map.
    usage: Billed | None = None
    # The manifest's chain fields (braid.format.chain): `list` and the cloud prune see chains without manifests.
    lineage: Lineage = field(default_factory=Lineage)
    # The manifest's `wal` (braid.format.pg_backup), when it has one: `list` shows a base backup's WAL range.
    wal: dict[str, Any] | None = None
    labels: dict[str, str] | None = None  # the manifest's (braid.format.labels), when it has any

    @classmethod
    def of(cls, manifest: Manifest) -> BackupSummary:
        return cls(
            repository=manifest.repository,
            backup=manifest.backup,
            created=manifest.created,
            completed=manifest.completed,
            engine=manifest.engine,
            inputs=len(manifest.inputs),
            chunks=manifest.chunk_count,
            plaintext_bytes=manifest.plaintext_bytes,
            stored_bytes=manifest.stored_bytes,
            usage=manifest.usage.billed() if manifest.usage is not None else None,
            lineage=manifest.lineage,
            wal=manifest.wal.to_json() if manifest.wal is not None else None,
            labels=dict(manifest.labels) if manifest.labels else None,
        )

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "repository": self.repository,
            "backup": self.backup,
            "created": self.created,
            "completed": self.completed,
            "engine": self.engine,
            "inputs": self.inputs,
            "chunks": self.chunks,
            "plaintext_bytes": self.plaintext_bytes,
            "stored_bytes": self.stored_bytes,
            **({"usage": self.usage} if self.usage is not None else {}),
            **(self.lineage.to_json() if self.lineage.is_incremental else {}),
            **({"wal": self.wal} if self.wal is not None else {}),
            **({"labels": dict(self.labels)} if self.labels else {}),
        }

    @classmethod
    def from_body(cls, doc: dict[str, Any], where: str) -> BackupSummary:
        try:
            if doc.get("format") != FORMAT or doc.get("version") != VERSION:
                raise ValueError(f"unsupported {doc.get('format')} v{doc.get('version')}")
            numbers = {k: doc[k] for k in ("inputs", "chunks", "plaintext_bytes", "stored_bytes")}
            if any(type(v) is not int or v < 0 for v in numbers.values()):
                raise ValueError("counts must be non-negative integers")
            return cls(
                repository=_text(doc, "repository"),
                backup=_text(doc, "backup"),
                created=_text(doc, "created"),
                completed=_text(doc, "completed"),
                engine=_text(doc, "engine"),
                **numbers,
                usage=check_billed(doc["usage"]) if "usage" in doc else None,
                lineage=Lineage.from_json(doc, _text(doc, "backup")) if "kind" in doc else Lineage(),
                wal=WalInfo.from_json(doc["wal"]).to_json() if "wal" in doc else None,
                labels=check_labels(doc["labels"]) if "labels" in doc else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(f"{where}: not a valid Braid summary ({exc})") from None

    def seal(self, key: DataKey) -> bytes:
        body = canonical_json(self.body())
        return seal(FIELD, body, key.summary_mac(body))

    @property
    def ratio(self) -> float:
        return self.stored_bytes / self.plaintext_bytes if self.plaintext_bytes else 1.0


def _text(doc: dict[str, Any], name: str) -> str:
    value = doc[name]
    if not isinstance(value, str):
        raise TypeError(f"{name} is not a string")
    return value


@dataclass(frozen=True)
class SealedSummary:
    """A summary as read: checksum checked; the MAC only by `authenticate`."""

    summary: BackupSummary
    body: bytes
    mac: bytes

    def authenticate(self, key: DataKey) -> BackupSummary:
        if not key.summary_mac_matches(self.body, self.mac):
            raise IntegrityError(f"summary of {self.summary.backup} failed authentication (tampered, or not written by this key)")
        return self.summary


def open_summary(raw: bytes, where: str) -> SealedSummary:
    doc, body, mac = unseal(raw, FIELD, where, with_mac=True)
    assert mac is not None
    return SealedSummary(BackupSummary.from_body(doc, where), body, mac)
