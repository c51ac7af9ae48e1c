"""The manifest: the one record that makes a backup exist.

It lists every input's chunks in order with their sizes and checksums, the
wrapped data key, algorithms, totals and timings. It is written last, only
after every chunk it names is stored and checked; a backup without a valid
manifest does not exist.

On disk it is canonical JSON (sorted keys, no spaces) of

    {"manifest": {...}, "mac": "<hmac-sha256 hex>", "sha256": "<hex>"}

`sha256` covers the canonical manifest body and the MAC, so corruption shows
without the key (list, quick verify); `mac` is HMAC-SHA256 under a key derived
from the backup's data key, so only someone holding that key could have
written it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from braid.errors import IntegrityError
from braid.format.keys import DataKey, WrappedKey

FORMAT = "braid-manifest"
VERSION = 1


def canonical_json(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


@dataclass(frozen=True)
class ChunkEntry:
    index: int  # global, in the order chunks were cut; part of the GCM header
    input_index: int
    offset: int  # within its input
    length: int  # plaintext bytes
    stored_length: int
    checksum: str  # of the stored object, see stored_checksum
    mac: bytes  # keyed plaintext checksum
    compression: str  # "zstd" or "none"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "offset": self.offset,
            "length": self.length,
            "stored_length": self.stored_length,
            "checksum": self.checksum,
            "mac": self.mac.hex(),
            "compression": self.compression,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], input_index: int) -> ChunkEntry:
        return cls(
            index=int(doc["index"]),
            input_index=input_index,
            offset=int(doc["offset"]),
            length=int(doc["length"]),
            stored_length=int(doc["stored_length"]),
            checksum=str(doc["checksum"]),
            mac=bytes.fromhex(str(doc["mac"])),
            compression=str(doc["compression"]),
        )


@dataclass(frozen=True)
class InputEntry:
    index: int
    source: str  # what the user named: "stdin" or a path
    length: int
    mac: bytes  # whole-input checksum, chained from chunk MACs
    chunks: tuple[ChunkEntry, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "source": self.source,
            "length": self.length,
            "mac": self.mac.hex(),
            "chunks": [c.to_json() for c in self.chunks],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> InputEntry:
        index = int(doc["index"])
        return cls(
            index=index,
            source=str(doc["source"]),
            length=int(doc["length"]),
            mac=bytes.fromhex(str(doc["mac"])),
            chunks=tuple(ChunkEntry.from_json(c, index) for c in doc["chunks"]),
        )


@dataclass(frozen=True)
class Manifest:
    repository: str
    backup: str  # NAME@ID
    created: str  # ISO 8601 UTC, when the backup started
    completed: str
    chunk_size: int
    key: WrappedKey
    inputs: tuple[InputEntry, ...]
    algorithms: dict[str, Any]
    timings: dict[str, float]
    engine: str
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.backup.partition("@")[0]

    @property
    def id(self) -> str:
        return self.backup.partition("@")[2]

    @property
    def plaintext_bytes(self) -> int:
        return sum(i.length for i in self.inputs)

    @property
    def stored_bytes(self) -> int:
        return sum(c.stored_length for c in self.chunks())

    @property
    def chunk_count(self) -> int:
        return sum(len(i.chunks) for i in self.inputs)

    @property
    def ratio(self) -> float:
        """Stored bytes over plaintext bytes (lower is better), as zstd reports it."""
        return self.stored_bytes / self.plaintext_bytes if self.plaintext_bytes else 1.0

    def chunks(self) -> Iterator[ChunkEntry]:
        for entry in self.inputs:
            yield from entry.chunks

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "repository": self.repository,
            "backup": self.backup,
            "created": self.created,
            "completed": self.completed,
            "chunk_size": self.chunk_size,
            "key": self.key.to_json(),
            "algorithms": self.algorithms,
            "engine": self.engine,
            "inputs": [i.to_json() for i in self.inputs],
            "totals": {
                "inputs": len(self.inputs),
                "chunks": self.chunk_count,
                "plaintext_bytes": self.plaintext_bytes,
                "stored_bytes": self.stored_bytes,
            },
            "timings": self.timings,
            "stats": self.stats,
        }

    def seal(self, key: DataKey) -> bytes:
        """Serialise, authenticate and self-checksum; the bytes that get published."""
        body = canonical_json(self.body())
        mac = key.manifest_mac(body).hex()
        digest = hashlib.sha256(body + mac.encode()).hexdigest()
        return canonical_json({"manifest": self.body(), "mac": mac, "sha256": digest})

    def check_structure(self) -> None:
        """Invariants a sealed manifest must hold; violated only by a bug or forgery."""
        where = f"manifest of {self.backup}"
        seen: set[int] = set()
        for pos, entry in enumerate(self.inputs):
            if entry.index != pos:
                raise IntegrityError(f"{where}: input {pos} is recorded as input {entry.index}")
            offset = 0
            for chunk in entry.chunks:
                if chunk.offset != offset:
                    raise IntegrityError(f"{where}: chunk {chunk.index} of input {pos} starts at {chunk.offset}, expected {offset}")
                if chunk.index in seen:
                    raise IntegrityError(f"{where}: chunk {chunk.index} appears twice")
                if chunk.length <= 0 or chunk.length > self.chunk_size:
                    raise IntegrityError(f"{where}: chunk {chunk.index} has impossible length {chunk.length}")
                seen.add(chunk.index)
                offset += chunk.length
            if offset != entry.length:
                raise IntegrityError(f"{where}: input {pos} chunks cover {offset} bytes, recorded length {entry.length}")
        if seen != set(range(len(seen))):
            raise IntegrityError(f"{where}: chunk indexes are not contiguous from 0")


@dataclass(frozen=True)
class SealedManifest:
    """A manifest as read from the store: checksum checked, MAC not yet."""

    manifest: Manifest
    body: bytes
    mac: bytes

    def authenticate(self, key: DataKey) -> Manifest:
        if not hmac.compare_digest(key.manifest_mac(self.body), self.mac):
            raise IntegrityError(f"manifest of {self.manifest.backup} failed authentication (tampered, or not written by this key)")
        return self.manifest


def open_manifest(raw: bytes, where: str) -> SealedManifest:
    """Parse and self-check a stored manifest; needs no key."""
    try:
        doc = json.loads(raw)
        body_doc = doc["manifest"]
        mac_hex = str(doc["mac"])
        digest = str(doc["sha256"])
    except (ValueError, KeyError, TypeError):
        raise IntegrityError(f"{where}: manifest is not valid Braid manifest JSON (corrupt)") from None
    body = canonical_json(body_doc)
    if not hmac.compare_digest(hashlib.sha256(body + mac_hex.encode()).hexdigest(), digest):
        raise IntegrityError(f"{where}: manifest checksum mismatch (corrupt)")
    try:
        if body_doc.get("format") != FORMAT or int(body_doc.get("version", 0)) != VERSION:
            raise IntegrityError(f"{where}: unsupported manifest format {body_doc.get('format')} v{body_doc.get('version')}")
        manifest = Manifest(
            repository=str(body_doc["repository"]),
            backup=str(body_doc["backup"]),
            created=str(body_doc["created"]),
            completed=str(body_doc["completed"]),
            chunk_size=int(body_doc["chunk_size"]),
            key=WrappedKey.from_json(body_doc["key"]),
            inputs=tuple(InputEntry.from_json(i) for i in body_doc["inputs"]),
            algorithms=dict(body_doc["algorithms"]),
            timings={k: float(v) for k, v in dict(body_doc["timings"]).items()},
            engine=str(body_doc["engine"]),
            stats=dict(body_doc.get("stats", {})),
        )
        mac = bytes.fromhex(mac_hex)
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"{where}: manifest is missing or has malformed fields ({exc})") from None
    manifest.check_structure()
    return SealedManifest(manifest, body, mac)
