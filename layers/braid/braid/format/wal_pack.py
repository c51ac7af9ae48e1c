"""A WAL pack: several archived segments of one directory in one object, under one data key.

Key: `wal/NAME/TTTTTTTTXXXXXXXX/pack-YYYYYYYY-YYYYYYYY-...`: the segments'
directory (their first 16 digits) and each member's last 8 digits, in
order, so a LIST names every file a pack holds without reading it (prune,
verify --wal and the WAL range check need no GET). Layout (big-endian),
docs/format.md "A WAL pack":

    magic "BRWP" | version u8 (1) | flags u8 (0) | reserved u16 (0) | wrapped key length u32
    | wrapped key (canonical JSON) | index length u32 | index (canonical JSON)
    | frames: one stored chunk per member, chunk index = its position, input 0,
      whose header's backup id is the pack's context name `NAME@wal/DIR/pack-...`

The index lists each member's name, offset (from the first frame),
stored_length, length, plaintext SHA-256 and plaintext MAC (hex), in key
order; a reader takes a member's frame by its offset and length and never
recomputes them. The key's context binds the repository and the pack key,
which lists the members; each frame authenticates its index and length.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from braid.errors import IntegrityError, UsageError
from braid.format.canonical import canonical_json
from braid.format.keys import DataKey, WrappedKey, encryption_context
from braid.format.wal import SEGMENT, WalFile
from braid.format.wal_object import read_head

MAGIC = b"BRWP"
VERSION = 1
PACK_PREFIX = "pack-"
_HEAD = struct.Struct(">4sBBHI")
_LENGTH = struct.Struct(">I")
WAL_INPUT = 0


def pack_basename(members: Sequence[WalFile]) -> str:
    """The key's last part for `members` (whole segments of one directory, ascending, no repeats)."""
    names = [m.name for m in members]
    if not names or any(m.kind != SEGMENT for m in members) or len({n[:16] for n in names}) != 1 or names != sorted(set(names)):
        raise UsageError(f"a WAL pack holds distinct whole segments of one directory, in order: not {names}")
    return PACK_PREFIX + "-".join(n[16:] for n in names)


def pack_members(directory: str, basename: str) -> list[WalFile] | None:
    """The segments a pack key's last part names in `directory` (16 hex digits), or None when it is not a pack's."""
    if not basename.startswith(PACK_PREFIX):
        return None
    parts = basename[len(PACK_PREFIX) :].split("-")
    try:
        members = [WalFile.parse(directory + low) for low in parts]
    except UsageError:
        return None
    if any(len(low) != 8 or m.kind != SEGMENT for low, m in zip(parts, members, strict=True)):
        return None
    names = [m.name for m in members]
    return members if names == sorted(set(names)) else None


def pack_context_name(name: str, directory: str, basename: str) -> str:
    """The encryption context's `braid:backup` of a pack (matches the WAL worker's grant `*@wal/*`)."""
    return f"{name}@wal/{directory}/{basename}"


@dataclass(frozen=True)
class PackEntry:
    """One member as the pack's index records it."""

    name: str
    offset: int
    stored_length: int
    length: int
    sha256: str
    mac: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "offset": self.offset, "stored_length": self.stored_length, "length": self.length,
                "sha256": self.sha256, "mac": self.mac}


@dataclass(frozen=True)
class StoredPack:
    """A pack's head as read: its wrapped key, its index and where its frames start (nothing authenticated yet)."""

    wrapped: WrappedKey
    entries: list[PackEntry]
    frames_at: int

    @staticmethod
    def head_length(head: bytes | memoryview) -> int | None:
        """How many bytes from the start hold the key and the index, once `head` has the first two lengths; else None."""
        view = memoryview(head)
        if len(view) < _HEAD.size:
            return None
        at = _HEAD.size + int(_HEAD.unpack_from(view)[4])
        if len(view) < at + _LENGTH.size:
            return None
        return at + _LENGTH.size + int(_LENGTH.unpack_from(view, at)[0])

    @classmethod
    def parse(cls, head: bytes | memoryview, members: Sequence[WalFile], where: str) -> StoredPack:
        """The head (at least `head_length` bytes of the object) of the pack whose key names `members`."""
        view = memoryview(head)
        try:
            key_length = read_head(view, MAGIC, VERSION, "WAL pack", where)
            at = _HEAD.size + key_length
            wrapped = WrappedKey.from_json(json.loads(bytes(view[_HEAD.size : at])))
            (index_length,) = _LENGTH.unpack_from(view, at)
            frames_at = at + _LENGTH.size + index_length
            if len(view) < frames_at:
                raise ValueError("the index is cut short")
            doc = json.loads(bytes(view[at + _LENGTH.size : frames_at]))
            entries = [PackEntry(str(e["name"]), int(e["offset"]), int(e["stored_length"]), int(e["length"]), str(e["sha256"]), str(e["mac"]))
                       for e in doc["files"]]
        except (struct.error, ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"{where}: the WAL pack's envelope is damaged ({exc})") from None
        if [e.name for e in entries] != [m.name for m in members]:
            raise IntegrityError(f"{where}: the pack's index lists {[e.name for e in entries]}, its key {[m.name for m in members]}")
        return cls(wrapped, entries, frames_at)

    def check_binding(self, repository_id: str, bound: str, where: str) -> None:
        """Refuse a key bound to another repository or pack before asking the key service to unwrap it."""
        expected = encryption_context(repository_id, bound)
        if self.wrapped.context != expected:
            raise IntegrityError(f"{where}: its key is bound to {self.wrapped.context}, not {expected}; it was moved or copied")

    def entry(self, file_name: str, where: str) -> tuple[int, PackEntry]:
        """A member's position (its frame's chunk index) and index entry."""
        for position, entry in enumerate(self.entries):
            if entry.name == file_name:
                return position, entry
        raise IntegrityError(f"{where}: the pack does not hold {file_name}")  # pragma: no cover - the key names it

    def decode(self, key: DataKey, bound: str, file_name: str, frame: bytes | memoryview, where: str) -> memoryview:
        """A member's authenticated, decompressed bytes from its `frame` (`stored_length` bytes at `frames_at + offset`),
        checked by its MAC and SHA-256 (IntegrityError otherwise)."""
        position, entry = self.entry(file_name, where)
        if len(frame) != entry.stored_length:
            raise IntegrityError(f"{where}: {file_name}: the WAL pack is truncated")
        from braid.format.chunk import ChunkCodec  # the codec (zstandard, cryptography): not for a push that stages raw bytes

        try:
            data = ChunkCodec(key).decode(frame, backup=bound, index=position, input_index=WAL_INPUT, plaintext_length=entry.length,
                                          plaintext_mac=bytes.fromhex(entry.mac))
        except (IntegrityError, ValueError) as exc:
            raise IntegrityError(f"{where}: {file_name}: {exc}") from None
        out = memoryview(bytes(data))
        if hashlib.sha256(out).hexdigest() != entry.sha256:
            raise IntegrityError(f"{where}: {file_name}: its bytes do not match the pack's SHA-256")
        return out


def encode_pack(key: DataKey, wrapped: WrappedKey, bound: str, files: Iterable[tuple[str, bytes | memoryview]], level: int = 3) -> bytearray:
    """The stored pack of `files` ((name, plaintext) in key order) under one fresh data key bound to `bound`.

    `files` may be a generator that lets go of each plaintext once taken: the frames go straight into the
    one buffer returned (the index, which follows the key, is fitted in front at the end), so a batch's
    pack never needs its frames twice in memory.
    """
    from braid.format.chunk import ChunkCodec

    codec = ChunkCodec(key, level)
    frames = bytearray()
    entries: list[PackEntry] = []
    for position, (file_name, plaintext) in enumerate(files):
        encoded = codec.encode(bound, position, WAL_INPUT, plaintext)
        entries.append(PackEntry(file_name, len(frames), len(encoded.stored), len(plaintext), hashlib.sha256(plaintext).hexdigest(), encoded.plaintext_mac.hex()))
        frames += encoded.stored
        del plaintext
    key_doc = canonical_json(wrapped.to_json())
    index = canonical_json({"files": [e.to_json() for e in entries]})
    frames[0:0] = b"".join((_HEAD.pack(MAGIC, VERSION, 0, 0, len(key_doc)), key_doc, _LENGTH.pack(len(index)), index))
    return frames
