"""Result records: what a worker stored, written to S3 instead of returned.

One record per map item, at `results/<first chunk index>.json` (the staging
layout's result key of the item's first chunk), listing a ChunkEntry per
chunk of the item. Writing to S3 keeps every Lambda return tiny, so no
result list ever crosses the 256 KiB state payload limit, and a record per
item rather than per chunk saves a PUT per chunk (see item_sizing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from braid.errors import IntegrityError
from braid.format.ids import BackupRef
from braid.format.manifest import ChunkEntry
from braid.format.staging import result_key, results_prefix
from braid.pipeline.plan import MapItem, Round
from braid.ports.store import ObjectStore


def entry_to_json(entry: ChunkEntry) -> dict[str, Any]:
    return {**entry.to_json(), "input_index": entry.input_index}


def entry_from_json(doc: dict[str, Any]) -> ChunkEntry:
    return ChunkEntry.from_json(doc, int(doc["input_index"]))


@dataclass(frozen=True)
class ItemResult:
    first_index: int
    entries: tuple[ChunkEntry, ...]

    def to_bytes(self) -> bytes:
        doc = {"first_index": self.first_index, "count": len(self.entries), "chunks": [entry_to_json(e) for e in self.entries]}
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> ItemResult:
        try:
            doc = json.loads(raw)
            entries = tuple(entry_from_json(c) for c in doc["chunks"])
            result = cls(int(doc["first_index"]), entries)
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"result record {where} is malformed: {exc}") from None
        if int(doc.get("count", -1)) != len(entries):
            raise IntegrityError(f"result record {where} is truncated")
        return result


def write_result(store: ObjectStore, ref: BackupRef, result: ItemResult) -> str:
    """Overwrites are fine: a retried worker reports the same stored chunks (store_chunk reads them back)."""
    key = result_key(ref, result.first_index)
    store.put(key, result.to_bytes())
    return key


def check_result(ref: BackupRef, item: MapItem, result: ItemResult) -> None:
    """The record must describe exactly the chunks the plan gave the item."""
    expected = item.chunks()
    if len(result.entries) != len(expected):
        raise IntegrityError(f"result for chunks {item.first_index}.. of {ref} lists {len(result.entries)} chunks, the plan {len(expected)}")
    for planned, entry in zip(expected, result.entries):
        if (entry.index, entry.input_index, entry.offset, entry.length) != (planned.index, item.input_index, planned.offset, planned.length):
            raise IntegrityError(
                f"result for chunk {planned.index} of {ref} describes chunk {entry.index} of input {entry.input_index}"
                f" at {entry.offset}+{entry.length}; the plan says input {item.input_index} at {planned.offset}+{planned.length}"
            )


def read_results(store: ObjectStore, ref: BackupRef, rounds: list[Round]) -> list[ChunkEntry]:
    """Every planned chunk's entry, or an error naming the first chunk without a result."""
    present = {info.key for info in store.list(results_prefix(ref))}
    entries: list[ChunkEntry] = []
    for found in rounds:
        for item in found.items:
            key = result_key(ref, item.first_index)
            if key not in present:
                raise IntegrityError(
                    f"chunks {item.first_index}..{item.end_index - 1} of backup {ref} were never stored:"
                    " their worker failed or did not run (see the execution's map run)"
                )
            result = ItemResult.from_bytes(store.get(key), key)
            check_result(ref, item, result)
            entries.extend(result.entries)
    return entries


def processed_chunks(store: ObjectStore, ref: BackupRef, rounds: list[Round]) -> int:
    """Chunks with a result so far (progress for the agent): one LIST plus the round files."""
    present = {info.key for info in store.list(results_prefix(ref))}
    return sum(item.count for found in rounds for item in found.items if result_key(ref, item.first_index) in present)
