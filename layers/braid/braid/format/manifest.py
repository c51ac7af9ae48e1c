"""The manifest: the one record that makes a backup exist.

It lists every input's chunks in order with their sizes and checksums, the
wrapped data key, algorithms, totals and timings. It is written last, only
after every chunk it names is stored and checked; a backup without a valid
manifest does not exist.

On disk it is one JSON document with a fixed byte layout (docs/format.md,
Manifest):

    {"mac":"<64 hex>","manifest":BODY,"sha256":"<64 hex>"}

`mac` is HMAC-SHA256 over the BODY bytes exactly as stored, under a key
derived from the backup's data key, so only someone holding that key could
have written it; `sha256` covers those same BODY bytes followed by the mac's
hex, so corruption shows without the key (list, quick verify). Verifying
slices BODY out of the stored bytes and never re-serialises it: a reader in
any language checks both values with no JSON canonicaliser, then parses BODY
with any JSON parser. Braid writes BODY with braid.format.canonical, so
sealing is reproducible, but no reader depends on that.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import Any

from braid.errors import IntegrityError
from braid.format.canonical import canonical_json
from braid.format.chain import Lineage
from braid.format.checksum import is_tagged_checksum
from braid.format.digests import sha256
from braid.format.fields import Fields
from braid.format.keys import DataKey, WrappedKey
from braid.format.labels import check_labels
from braid.format.metadata import MetadataEntry
from braid.format.pg_backup import WalInfo
from braid.format.sealed import reject_constant, unique_keys
from braid.format.timestamps import parse_timestamp
from braid.format.usage import Usage

__all__ = ["FORMAT", "VERSION", "ChunkEntry", "InputEntry", "Manifest", "SealedManifest", "canonical_json", "open_manifest", "seal_body"]

FORMAT = "braid-manifest"
# Version 2: a chunk entry says which stored object (pack) holds its frame and where (docs/format.md, Packs).
# A version-1 manifest (one object per chunk, no pack fields) is refused, not read: no repository of it needs reading.
# Version 3: an incremental backup's chain fields (`kind`, `parent`, `chain_full`; braid.format.chain). Written only
# for incrementals, so a Braid that knows no chains refuses them rather than restore or prune them as if they stood
# alone; full backups are still written as version 2, which reads as a full backup.
VERSION = 3
FULL_VERSION = 2
READABLE_VERSIONS = (2, 3)

# The sealed layout: HEAD, 64 hex (mac), MIDDLE, BODY, TAIL, 64 hex (sha256), END.
_HEAD = b'{"mac":"'
_MIDDLE = b'","manifest":'
_TAIL = b',"sha256":"'
_END = b'"}'
_HEX_DIGITS = 64
_BODY_START = len(_HEAD) + _HEX_DIGITS + len(_MIDDLE)
_AFTER_BODY = len(_TAIL) + _HEX_DIGITS + len(_END)
_LEADING = re.compile(re.escape(_HEAD) + rb"([0-9a-f]{64})" + re.escape(_MIDDLE))
_TRAILING = re.compile(re.escape(_TAIL) + rb"([0-9a-f]{64})" + re.escape(_END))


@dataclass(frozen=True)
class ChunkEntry:
    index: int  # global, in the order chunks were cut; part of the GCM header
    input_index: int
    offset: int  # within its input
    length: int  # plaintext bytes
    stored_length: int
    checksum: str  # of the stored object, tagged form (braid.format.checksum)
    mac: bytes  # keyed plaintext checksum
    compression: str  # "zstd" or "none"
    # The pack (stored object) holding this chunk's frame, named by the index of its first chunk
    # (its key is that chunk's key, braid.format.layout.chunk_key), and where the frame starts in it.
    # -1: the chunk's own object (pack = index, offset 0), as the local engine writes every chunk.
    pack: int = -1
    pack_offset: int = 0

    def __post_init__(self) -> None:
        if self.pack < 0:
            object.__setattr__(self, "pack", self.index)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "offset": self.offset,
            "length": self.length,
            "stored_length": self.stored_length,
            "checksum": self.checksum,
            "mac": self.mac.hex(),
            "compression": self.compression,
            "pack": self.pack,
            "pack_offset": self.pack_offset,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], input_index: int) -> ChunkEntry:
        """Strict (braid.format.fields): integers are JSON integers, every field is present, no other."""
        f = Fields(doc, "manifest chunk entry", _CHUNK_FIELDS, optional=("input_index",))  # a staging result names its input
        return cls(
            index=f.count("index"),
            input_index=input_index,
            offset=f.count("offset"),
            length=f.count("length"),
            stored_length=f.count("stored_length"),
            checksum=f.text("checksum"),
            mac=f.hex("mac"),
            compression=f.text("compression"),
            pack=f.count("pack"),
            pack_offset=f.count("pack_offset"),
        )


_CHUNK_FIELDS = ("index", "offset", "length", "stored_length", "checksum", "mac", "compression", "pack", "pack_offset")
_INPUT_FIELDS = ("index", "source", "length", "mac", "chunks")


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
        f = Fields(doc, "manifest input entry", _INPUT_FIELDS)
        index = f.count("index")
        chunks = f.doc["chunks"]
        if not isinstance(chunks, list):
            raise IntegrityError(f"manifest input entry is malformed: chunks must be a list, not {chunks!r}")
        return cls(
            index=index,
            source=f.text("source"),
            length=f.count("length"),
            mac=f.hex("mac"),
            chunks=tuple(ChunkEntry.from_json(c, index) for c in chunks),
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
    # Optional, written only by `braid rekey` (braid.ops.rekey): {"at": timestamp, "from": the key id that wrapped it before}.
    # `key.key_id` says which key wraps the data key now; this says since when, and instead of which.
    rekeyed: dict[str, str] | None = None
    # Optional (docs/format.md, Usage): what making the backup used, counted where it ran
    # (braid.format.usage). Absent from manifests written before it existed.
    usage: Usage | None = None
    # Its place in an incremental chain (docs/format.md, Chains); a full backup by default and in version-2 manifests.
    lineage: Lineage = field(default_factory=Lineage)
    # Optional (braid.format.pg_backup): a PostgreSQL base backup's WAL position, timeline, system and version,
    # read from its tar stream. Readers that ignore it restore the backup exactly as before.
    wal: WalInfo | None = None
    # Optional (braid.format.metadata): the encrypted metadata objects beside the chunks, by kind.
    metadata: dict[str, MetadataEntry] = field(default_factory=dict)
    # Optional: `braid backup --label KEY=VALUE` (braid.format.labels); absent without labels.
    labels: dict[str, str] | None = None
    # Optional, written only by `braid copy` (braid.ops.copy): {"at": timestamp, "from": the source repository's id}.
    copied: dict[str, str] | None = None

    @property
    def name(self) -> str:
        return self.backup.partition("@")[0]

    @property
    def id(self) -> str:
        return self.backup.partition("@")[2]

    @property
    def plaintext_bytes(self) -> int:
        return sum(i.length for i in self.inputs)

    @cached_property
    def stored_bytes(self) -> int:
        """Summed over every chunk once per manifest (it is frozen): sealing, the usage and the summary each ask."""
        return sum([c.stored_length for c in self.chunks()])

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
        chain = self.lineage.to_json() if self.lineage.is_incremental else {}
        return {
            "format": FORMAT,
            "version": VERSION if chain else FULL_VERSION,
            **chain,
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
            **({"rekeyed": self.rekeyed} if self.rekeyed is not None else {}),
            **({"usage": self.usage.to_json()} if self.usage is not None else {}),
            **({"wal": self.wal.to_json()} if self.wal is not None else {}),
            **({"metadata": {kind: entry.to_json() for kind, entry in sorted(self.metadata.items())}} if self.metadata else {}),
            **({"labels": dict(self.labels)} if self.labels else {}),
            **({"copied": self.copied} if self.copied is not None else {}),
        }

    def seal(self, key: DataKey) -> bytes:
        """Serialise, authenticate and self-checksum; the bytes that get published."""
        self.check_spellings()
        body = canonical_json(self.body())
        return seal_body(body, key.manifest_mac(body))

    def check_spellings(self) -> None:
        """Timestamps and checksums in their one documented form, so every engine writes the same shape."""
        for name, text in (("created", self.created), ("completed", self.completed)):
            try:
                parse_timestamp(text)
            except ValueError:
                raise IntegrityError(f"manifest of {self.backup}: {name} {text!r} is not a Braid timestamp (YYYY-MM-DDTHH:MM:SS.ffffffZ)") from None
        for chunk in self.chunks():
            if not is_tagged_checksum(chunk.checksum):
                raise IntegrityError(f"manifest of {self.backup}: chunk {chunk.index} checksum {chunk.checksum!r} is not crc64nvme:<base64>")

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
        self._check_packs(where)

    def _check_packs(self, where: str) -> None:
        """Each pack is a run of consecutive chunks from the one it is named by, their frames back to back from offset 0."""
        ordered = sorted(self.chunks(), key=attrgetter("index"))
        previous: ChunkEntry | None = None
        for chunk in ordered:
            if chunk.pack == chunk.index:
                expected = 0
            elif previous is not None and chunk.pack == previous.pack:
                expected = previous.pack_offset + previous.stored_length
            else:
                raise IntegrityError(f"{where}: chunk {chunk.index} names pack {chunk.pack}, which does not end just before it")
            if chunk.pack_offset != expected:
                raise IntegrityError(f"{where}: chunk {chunk.index} starts at byte {chunk.pack_offset} of pack {chunk.pack}, expected {expected}")
            previous = chunk


@dataclass(frozen=True)
class SealedManifest:
    """A manifest as read from the store: checksum checked, MAC not yet."""

    manifest: Manifest
    body: bytes
    mac: bytes

    def authenticate(self, key: DataKey) -> Manifest:
        if not key.manifest_mac_matches(self.body, self.mac):
            raise IntegrityError(f"manifest of {self.manifest.backup} failed authentication (tampered, or not written by this key)")
        return self.manifest


def _digest(body: bytes, mac_hex: bytes) -> bytes:
    return sha256(body, mac_hex).hex().encode()


def seal_body(body: bytes, mac: bytes) -> bytes:
    """The stored document for `body` (bytes, written as they are) and its MAC."""
    mac_hex = mac.hex().encode()
    return _HEAD + mac_hex + _MIDDLE + body + _TAIL + _digest(body, mac_hex) + _END


def _parse_body(body: bytes) -> Any:
    return json.loads(body.decode("utf-8"), object_pairs_hook=unique_keys, parse_constant=reject_constant)


def _rekeyed(doc: Any) -> dict[str, str] | None:
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) != {"at", "from"} or not all(isinstance(v, str) for v in doc.values()):
        raise ValueError("rekeyed must be {\"at\": timestamp, \"from\": key id}")
    parse_timestamp(doc["at"])
    return dict(doc)


def _lineage(doc: dict[str, Any], version: int) -> Lineage:
    """Version 2 knows no chains (a full backup); version 3 is an incremental's and names its chain."""
    fields = {"kind", "parent", "chain_full"} & set(doc)
    if version == FULL_VERSION:
        if fields:
            raise ValueError(f"a version-{FULL_VERSION} manifest has no {sorted(fields)[0]}")
        return Lineage()
    lineage = Lineage.from_json(doc, str(doc["backup"]))
    if not lineage.is_incremental:
        raise ValueError(f"a version-{VERSION} manifest is an incremental's")
    return lineage


def _integer(value: Any, name: str) -> int:
    """A JSON integer (not a boolean, a string or a float): braid.format.fields."""
    if type(value) is not int:
        raise IntegrityError(f"{name} must be an integer, not {value!r}")
    return value


def _copied(doc: Any) -> dict[str, str] | None:
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) != {"at", "from"} or not all(isinstance(v, str) for v in doc.values()):
        raise ValueError("copied must be {\"at\": timestamp, \"from\": repository id}")
    parse_timestamp(doc["at"])
    return dict(doc)


def open_manifest(raw: bytes, where: str) -> SealedManifest:
    """Slice, self-check and parse a stored manifest; needs no key."""
    end = len(raw) - _AFTER_BODY
    leading = _LEADING.match(raw)
    trailing = _TRAILING.fullmatch(raw, end) if end >= _BODY_START else None
    if leading is None or trailing is None:
        raise IntegrityError(f"{where}: manifest is not valid Braid manifest JSON (corrupt)")
    mac_hex, digest = leading.group(1), trailing.group(1)
    body = raw[_BODY_START:end]
    if _digest(body, mac_hex) != digest:  # corruption, not forgery: `authenticate` checks the MAC
        raise IntegrityError(f"{where}: manifest checksum mismatch (corrupt)")
    try:
        body_doc = _parse_body(body)
        if not isinstance(body_doc, dict):
            raise ValueError("the manifest body is not a JSON object")
    except (ValueError, RecursionError):
        raise IntegrityError(f"{where}: manifest is not valid Braid manifest JSON (corrupt)") from None
    version = body_doc.get("version", 0)
    if body_doc.get("format") != FORMAT or type(version) is not int or version not in READABLE_VERSIONS:
        raise IntegrityError(
            f"{where}: unsupported manifest format {body_doc.get('format')} v{body_doc.get('version')};"
            f" this Braid reads {FORMAT} v{READABLE_VERSIONS[0]} and v{VERSION} only (earlier versions are not read)"
        )
    try:
        manifest = Manifest(
            repository=str(body_doc["repository"]),
            backup=str(body_doc["backup"]),
            created=str(body_doc["created"]),
            completed=str(body_doc["completed"]),
            chunk_size=_integer(body_doc["chunk_size"], "chunk_size"),
            key=WrappedKey.from_json(body_doc["key"]),
            inputs=tuple(InputEntry.from_json(i) for i in body_doc["inputs"]),
            algorithms=dict(body_doc["algorithms"]),
            timings={k: float(v) for k, v in dict(body_doc["timings"]).items()},
            engine=str(body_doc["engine"]),
            stats=dict(body_doc.get("stats", {})),
            rekeyed=_rekeyed(body_doc.get("rekeyed")),
            usage=Usage.from_json(body_doc["usage"]) if "usage" in body_doc else None,
            lineage=_lineage(body_doc, version),
            wal=WalInfo.from_json(body_doc["wal"]) if "wal" in body_doc else None,
            metadata={str(k): MetadataEntry.from_json(v) for k, v in dict(body_doc.get("metadata", {})).items()},
            labels=check_labels(body_doc["labels"]) if "labels" in body_doc else None,
            copied=_copied(body_doc.get("copied")),
        )
    except IntegrityError as exc:
        raise IntegrityError(f"{where}: manifest is missing or has malformed fields ({exc.message})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"{where}: manifest is missing or has malformed fields ({exc})") from None
    manifest.check_structure()
    return SealedManifest(manifest, body, bytes.fromhex(mac_hex.decode()))
