"""A staged WAL bundle: several raw segments of one slot in one staging object (`wal-push --async` at a backlog).

Key: `wal-staging/NAME/SLOT.bundle`, SLOT the name of the first segment of
the member's slot: segments sharing their first 16 digits whose last 8,
read as a number, fall in the same run of BUNDLE_FILES (`bundle_slot`). So
a reader finds the one bundle that may hold a segment from its name alone
(a HEAD, no LIST); a slot has at most one bundle (create-only), and members
staged later go one object each. Layout (big-endian), docs/format.md
"A staged WAL bundle":

    magic "BRWB" | version u8 (1) | flags u8 (0) | reserved u16 (0) | index length u32
    | index (canonical JSON: {"slot": SLOT, "members": [{name, offset, length, sha256}, ...]})
    | the index's SHA-256 (32 bytes)
    | the members' raw bytes, in index order (offsets from the first byte after the head)

The bytes are raw, as a single staged file's are: S3 checks the whole
object's SHA-256 at PUT and at GET; the index's own digest lets a reader of
the head alone (a ranged GET) trust it, and each member is checked against
its recorded SHA-256 when taken out.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from braid.errors import IntegrityError, UsageError
from braid.format.canonical import canonical_json
from braid.format.wal import SEGMENT, WalFile
from braid.format.wal_object import read_head

MAGIC = b"BRWB"
VERSION = 1
BUNDLE_FILES = 7  # the slot's width: the most segments one bundle holds (docs/design/wal-archive.md: the WAL worker's p99)
SUFFIX = ".bundle"
_HEAD = struct.Struct(">4sBBHI")
DIGEST = 32
HEAD_READ = 4096  # a first ranged read that holds a full bundle's head


class WalBundleError(IntegrityError):
    """A staged bundle that is not one this Braid reads: truncated, damaged, or of another version."""


def bundle_slot(file: WalFile) -> str:
    """The slot (its first segment's name) a whole segment falls in; UsageError for any other file."""
    if file.kind != SEGMENT or file.segment is None:
        raise UsageError(f"only whole segments are bundled, not {file.name}")
    low = int(file.name[16:24], 16)
    return f"{file.name[:16]}{low - low % BUNDLE_FILES:08X}"


@dataclass(frozen=True)
class BundleEntry:
    name: str
    offset: int
    length: int
    sha256: str


@dataclass(frozen=True)
class BundleIndex:
    """A bundle's head, parsed and checked: its slot, its members, and where their bytes start."""

    slot: str
    members: tuple[BundleEntry, ...]
    data_at: int

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def entry(self, name: str) -> BundleEntry | None:
        return next((m for m in self.members if m.name == name), None)

    @property
    def size(self) -> int:
        """The whole object's size its index implies."""
        return self.data_at + sum(m.length for m in self.members)


def _check_members(slot: str, names: Sequence[str]) -> None:
    files = [WalFile.parse(n) for n in names]
    if not names or len(names) > BUNDLE_FILES or list(names) != sorted(set(names)) or any(bundle_slot(f) != slot for f in files):
        raise UsageError(f"a WAL bundle holds 1 to {BUNDLE_FILES} distinct whole segments of slot {slot}, in order: not {list(names)}")


class BundleWriter:
    """A bundle built in one buffer: its members' bytes written in place (`member`), then its head (`finish`).

    The index's length does not depend on the members' SHA-256 (64 hex digits each), so the head's room is known
    from the names and lengths alone and no member is copied twice: a pusher holds a bundle once."""

    def __init__(self, names: Sequence[str], lengths: Sequence[int]) -> None:
        if not names or len(names) != len(lengths):
            raise UsageError("a WAL bundle holds at least one segment, each with its length")
        self.slot = bundle_slot(WalFile.parse(names[0]))
        _check_members(self.slot, names)
        self.names, self.lengths = list(names), list(lengths)
        self.offsets = [sum(self.lengths[:i]) for i in range(len(names))]
        self.head = len(self._head(["0" * 64] * len(names)))
        self.digests: list[str] = []  # each member's SHA-256, once `finish` took them
        self.buffer = bytearray(self.head + sum(self.lengths))

    def _head(self, digests: Sequence[str]) -> bytes:
        entries = [
            {"name": n, "offset": o, "length": n_bytes, "sha256": d}
            for n, o, n_bytes, d in zip(self.names, self.offsets, self.lengths, digests, strict=True)
        ]
        index = canonical_json({"slot": self.slot, "members": entries})
        return _HEAD.pack(MAGIC, VERSION, 0, 0, len(index)) + index + hashlib.sha256(index).digest()

    def member(self, position: int) -> memoryview:
        """Where member `position`'s bytes go."""
        start = self.head + self.offsets[position]
        return memoryview(self.buffer)[start : start + self.lengths[position]]

    def finish(self) -> bytearray:
        """The whole bundle: the head, with each member's SHA-256 of the bytes now in place, then the members."""
        self.digests = []
        for position in range(len(self.names)):
            with self.member(position) as view:
                self.digests.append(hashlib.sha256(view).hexdigest())
        head = self._head(self.digests)
        assert len(head) == self.head, "the index's length does not depend on the digests"
        self.buffer[: self.head] = head
        return self.buffer


def encode_bundle(members: Sequence[tuple[str, bytes]]) -> bytes:
    """The bundle of `members` ((segment name, raw bytes), ascending, one slot): head, then the bytes."""
    if not members:
        raise UsageError("a WAL bundle holds at least one segment")
    writer = BundleWriter([n for n, _ in members], [len(d) for _, d in members])
    for position, (_name, data) in enumerate(members):
        writer.member(position)[:] = data
    return bytes(writer.finish())


def head_length(raw: bytes | memoryview, where: str) -> int:
    """How many bytes the head takes, from its first bytes (magic and version checked)."""
    view = memoryview(raw)
    if len(view) < _HEAD.size:
        raise WalBundleError(f"{where}: WAL bundle is truncated ({len(view)} bytes)")
    try:
        index_length = read_head(view, MAGIC, VERSION, "WAL bundle", where)
    except IntegrityError as exc:
        raise WalBundleError(str(exc)) from None
    return _HEAD.size + index_length + DIGEST


def parse_head(raw: bytes | memoryview, where: str) -> BundleIndex:
    """The checked head of a bundle whose first bytes are `raw` (at least `head_length`); WalBundleError otherwise."""
    view = memoryview(raw)
    end = head_length(view, where)
    if len(view) < end:
        raise WalBundleError(f"{where}: WAL bundle is truncated ({len(view)} bytes, its head takes {end})")
    index = bytes(view[_HEAD.size : end - DIGEST])
    if hashlib.sha256(index).digest() != bytes(view[end - DIGEST : end]):
        raise WalBundleError(f"{where}: the WAL bundle's index does not match its SHA-256: damaged")
    try:
        doc = json.loads(index)
        slot = str(doc["slot"])
        members = tuple(BundleEntry(str(m["name"]), int(m["offset"]), int(m["length"]), str(m["sha256"])) for m in doc["members"])
        _check_members(slot, [m.name for m in members])
    except (ValueError, KeyError, TypeError, UsageError) as exc:
        raise WalBundleError(f"{where}: the WAL bundle's index is not valid: {exc}") from None
    expected = 0
    for m in members:
        if m.offset != expected or m.length < 0:
            raise WalBundleError(f"{where}: the WAL bundle's index does not lay its members end to end")
        expected += m.length
    return BundleIndex(slot, members, end)


@dataclass(frozen=True)
class WalBundle:
    """A whole bundle as read: its checked head and its bytes."""

    index: BundleIndex
    raw: memoryview
    where: str

    @classmethod
    def parse(cls, raw: bytes | memoryview, where: str) -> WalBundle:
        view = memoryview(raw)
        index = parse_head(view, where)
        if len(view) != index.size:
            raise WalBundleError(f"{where}: WAL bundle is {len(view)} bytes, its index says {index.size}: truncated or damaged")
        return cls(index, view, where)

    def member(self, entry: BundleEntry) -> bytes:
        """A member's raw bytes, checked against its recorded SHA-256 (WalBundleError otherwise)."""
        start = self.index.data_at + entry.offset
        data = bytes(self.raw[start : start + entry.length])
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise WalBundleError(f"{self.where}: member {entry.name} does not match its SHA-256 ({entry.sha256}): damaged")
        return data
