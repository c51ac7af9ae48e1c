"""VerifyWorker: deep-check one map item, a few chunks of one backup.

Each chunk is fetched, authenticated, decompressed and checked against the
manifest by braid.ops.verify.check_entries, the very code the host-side
verify runs; nothing leaves the worker but the outcome (counts and
messages), and no plaintext is written anywhere. The manifest is opened
and its data key unwrapped once per container and backup (OpenedBackups):
KMS Decrypt is billed and throttled per request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from braid.errors import IntegrityError, UsageError
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.manifest import ChunkEntry, Manifest
from braid.format.repository import Repository
from braid.ops.open import open_backup
from braid.ops.verify import check_entries
from braid.pipeline.verify_request import ItemOutcome, VerifyItem
from braid.ports.keys import KeyService
from braid.ports.store import ObjectStore


@dataclass(frozen=True)
class VerifyWorkerEvent:
    prefix: str
    item: VerifyItem

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> VerifyWorkerEvent:
        if "item" not in event:
            raise UsageError("invalid verify worker event: no item")
        return cls(str(event.get("prefix", "")), VerifyItem.from_json(event["item"]))


@dataclass(frozen=True)
class OpenedBackup:
    manifest: Manifest
    key: DataKey
    chunks: dict[int, ChunkEntry]


class OpenedBackups:
    """Authenticated manifests and unwrapped data keys by repository and backup; small, since a container serves few backups."""

    def __init__(self, keys: KeyService, capacity: int = 4) -> None:
        self._keys = keys
        self._capacity = capacity
        self._cache: OrderedDict[tuple[str, str], OpenedBackup] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store: ObjectStore, ref: BackupRef) -> OpenedBackup:
        slot = (store.url, str(ref))
        with self._lock:
            if slot in self._cache:
                self._cache.move_to_end(slot)
                return self._cache[slot]
            manifest, key = open_backup(Repository.open(store), ref, self._keys)
            opened = OpenedBackup(manifest, key, {c.index: c for c in manifest.chunks()})
            self._cache[slot] = opened
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
            return opened


def check_item(store: ObjectStore, item: VerifyItem, backups: OpenedBackups, *, workers: int = 2) -> ItemOutcome:
    """Deep-check the item's chunks; failures are reported, not raised (an error opening the backup is raised)."""
    opened = backups.get(store, BackupRef.parse(item.backup))
    missing = [i for i in item.chunks if i not in opened.chunks]
    if missing:
        raise IntegrityError(f"backup {item.backup} has no chunk {missing[0]}: the verify plan does not match its manifest")
    report = check_entries(store, opened.manifest, opened.key, [opened.chunks[i] for i in item.chunks], deep=True, workers=workers)
    first = item.chunks[0] if item.chunks else 0
    return ItemOutcome(item.backup, report.chunks_checked, report.bytes_checked, [(first, f) for f in report.failures], corrupt=report.corrupt)
