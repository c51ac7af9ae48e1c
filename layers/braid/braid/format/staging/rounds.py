"""The records the pipeline writes to staging: plan rounds (map items), item results and their folds.

A round file `plans/round-NNNNN.json` (a JSON array of map items) is both
the ledger of chunk indexes and what the Distributed Map's ItemReader reads,
so a map item's JSON names are the state machine's contract (the worker
event carries one). Layout of the rest: docs/format.md, "Cloud staging".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Any

from braid.contract import CHUNKS_PER_PACK
from braid.errors import IntegrityError
from braid.format.canonical import canonical_json
from braid.format.fields import Fields
from braid.format.manifest import ChunkEntry
from braid.format.staging.protocol import document, optional_usage
from braid.format.usage import Usage


@dataclass(frozen=True)
class ChunkSlice:
    """One chunk of an item: where its bytes are in the segment and in the input."""

    index: int
    position: int  # 1-based, within the segment
    start: int  # within the segment object
    length: int
    offset: int  # within the input
    checksum: str  # CRC64NVME (base64) of the chunk as the agent read it


def pack_sizes(count: int, chunks_per_pack: int = CHUNKS_PER_PACK) -> list[int]:
    """Chunks per pack, in order, for an item of `count` chunks: `chunks_per_pack` at most, as even as possible, larger first.

    The fewest packs (PUTs) the limit allows (16 chunks of 5 at most: 4, 4, 4, 4). The planner writes the result
    into each item (MapItem.packs): a retried worker, and the items that finish a cut one, store the same packs.
    Smaller packs at an item's end (the taper) were measured not to pay and removed:
    docs/design/2026-11-28-optimisations.md.
    """
    limit = max(1, chunks_per_pack)
    packs = -(-count // limit) if count > 0 else 0
    return [count // packs + (1 if n < count % packs else 0) for n in range(packs)] if packs else []


@dataclass(frozen=True)
class MapItem:
    """One Distributed Map item: `count` consecutive chunks of one segment, stored as `packs`.

    `packs`: chunks per stored pack, decided by the planner (pack_sizes) and written into the round file; the
    worker and Finalize never recompute them, so a retried worker and a finishing item form the same objects
    whatever code they run.

    `layout`: the (first chunk, count) of the item whose packs these chunks are, when not this item's own: an
    item finishing what a cut item left stores exactly the cut item's packs, so a late attempt of the cut item
    and its finishing items only ever meet identical objects (create-only PUTs, braid.engine.chunk_worker.put_pack).

    `cut`: planned while the stream arrives, the item's worker stops at a pack boundary once the stream has
    ended, writing a result for the packs it stored (ItemResult.is_cut); the planner spreads the rest over the
    final round's workers, so a long streaming item never holds back the time after stream end.
    """

    segment: str  # repository-relative key of the segment object
    input_index: int
    segment_index: int
    segment_offset: int
    segment_length: int
    chunk_size: int
    first_chunk: int  # 1-based position of the item's first chunk in its segment
    count: int
    first_index: int  # global index of the item's first chunk
    checksums: tuple[str, ...]  # per chunk, from the segment record
    layout: tuple[int, int] | None = None  # (first chunk, count) whose packs these chunks are; None: this item's own
    cut: bool = False  # may stop at a pack boundary once the stream has ended
    packs: tuple[int, ...] = ()  # chunks per pack; () when the planner constructs it: pack_sizes(count)

    def __post_init__(self) -> None:
        if not self.packs:
            object.__setattr__(self, "packs", tuple(pack_sizes(self.count)))
        if sum(self.packs) != self.count or min(self.packs, default=0) < 1:
            raise IntegrityError(f"map item for chunks {self.first_index}..{self.end_index - 1} has packs {list(self.packs)} for {self.count} chunks")

    @property
    def end_index(self) -> int:
        return self.first_index + self.count

    @property
    def layout_range(self) -> tuple[int, int]:
        """(first chunk, count) of the pack layout: this item's own unless it finishes a cut item."""
        return self.layout if self.layout is not None else (self.first_chunk, self.count)

    @property
    def finishes_cut(self) -> bool:
        """Whether the item stores chunks of another item's layout (what a cut item left), not chunks of its own plan."""
        return self.layout is not None and self.layout != (self.first_chunk, self.count)

    def remainder(self, done: int) -> MapItem:
        """The item's chunks after its first `done` (a cut result), in this item's packs, never cut again."""
        if not 0 < done < self.count:
            raise IntegrityError(f"map item for chunks {self.first_index}..{self.end_index - 1} has no remainder after {done} chunks")
        return replace(self.piece(done, self.count - done), cut=False)

    def split(self, chunks: int) -> list[MapItem]:
        """The item as consecutive items of whole packs, each of about `chunks` chunks at most (one pack at least), same layout."""
        pieces: list[MapItem] = []
        start = 0
        taken = 0
        for size in self.packs:
            if taken and taken + size > max(1, chunks):
                pieces.append(self.piece(start, taken))
                start, taken = start + taken, 0
            taken += size
        if taken:
            pieces.append(self.piece(start, taken))
        return pieces

    def piece(self, start: int, count: int) -> MapItem:
        """Chunks `start`..`start + count - 1` of this item as an item of its own, in this item's packs (which it must not split)."""
        if start < 0 or count < 1 or start + count > self.count:
            raise IntegrityError(f"map item for chunks {self.first_index}..{self.end_index - 1} has no chunks {self.first_index + start}+{count}")
        return MapItem(
            self.segment, self.input_index, self.segment_index, self.segment_offset, self.segment_length, self.chunk_size,
            self.first_chunk + start, count, self.first_index + start, self.checksums[start : start + count],
            None if (start, count) == (0, self.count) and self.layout is None else self.layout_range, self.cut,
            self._packs_within(start, count),
        )

    def _packs_within(self, start: int, count: int) -> tuple[int, ...]:
        """The packs of chunks `start`..`start + count - 1`, which must begin and end on pack boundaries."""
        sizes: list[int] = []
        at = 0
        for size in self.packs:
            if start <= at and at + size <= start + count:
                sizes.append(size)
            elif at < start + count and start < at + size:
                raise IntegrityError(
                    f"map item for chunks {self.first_index + start}..{self.first_index + start + count - 1} of {self.segment} splits the pack of"
                    f" chunks {self.first_index + at}..{self.first_index + at + size - 1}"
                )
            at += size
        return tuple(sizes)

    def chunks(self) -> list[ChunkSlice]:
        slices = []
        for j in range(self.count):
            position = self.first_chunk + j
            start = (position - 1) * self.chunk_size
            length = min(self.chunk_size, self.segment_length - start)
            if length <= 0:
                raise IntegrityError(f"map item for {self.segment} names chunk {position}, beyond the segment's {self.segment_length} bytes")
            slices.append(ChunkSlice(self.first_index + j, position, start, length, self.segment_offset + start, self.checksums[j]))
        return slices

    def to_json(self) -> dict[str, Any]:
        return {
            "segment": self.segment,
            "input": self.input_index,
            "seg": self.segment_index,
            "seg_offset": self.segment_offset,
            "seg_length": self.segment_length,
            "chunk_size": self.chunk_size,
            "first_chunk": self.first_chunk,
            "count": self.count,
            "first_index": self.first_index,
            "crc": list(self.checksums),
            "packs": list(self.packs),
            **({"layout": list(self.layout)} if self.layout is not None else {}),
            **({"cut": True} if self.cut else {}),
        }

    @classmethod
    def from_json(cls, doc: Any) -> MapItem:
        """One strict validation for every reader: the round file, and the worker's event."""
        what = f"map item {doc!r}"[:300]
        names = ("segment", "input", "seg", "seg_offset", "seg_length", "chunk_size", "first_chunk", "count", "first_index", "crc", "packs")
        f = Fields(doc, what, names, optional=("layout", "cut"))
        layout = f.counts("layout") if "layout" in f.doc else None
        if layout is not None and len(layout) != 2:
            raise IntegrityError(f"{what} is malformed: layout is [first chunk, count], not {layout!r}")
        item = cls(
            f.text("segment"), f.count("input"), f.count("seg"), f.count("seg_offset"), f.count("seg_length"), f.count("chunk_size"),
            f.count("first_chunk"), f.count("count"), f.count("first_index"), tuple(f.texts("crc")),
            None if layout is None else (layout[0], layout[1]), f.flag("cut"), tuple(f.counts("packs")),
        )
        layout_first, layout_count = item.layout_range
        if (
            item.count < 1 or item.first_chunk < 1 or item.chunk_size < 1 or len(item.checksums) != item.count
            or layout_first < 1 or item.first_chunk < layout_first or item.first_chunk + item.count > layout_first + layout_count
        ):
            raise IntegrityError(f"impossible {what}")
        return item


@dataclass(frozen=True)
class Round:
    """One planner round: the items of the segments it planned, and where it is stored."""

    number: int
    key: str
    items: tuple[MapItem, ...]

    @property
    def chunk_count(self) -> int:
        return sum(i.count for i in self.items)

    @property
    def end_index(self) -> int:
        """One past the highest chunk index the round assigns (0 for no items)."""
        return max((i.end_index for i in self.items), default=0)

    def to_bytes(self) -> bytes:
        return canonical_json([i.to_json() for i in self.items])

    @classmethod
    def from_bytes(cls, raw: bytes, number: int, key: str) -> Round:
        docs = document(raw, f"plan round {key}")
        if not isinstance(docs, list) or not docs:
            raise IntegrityError(f"plan round {key} is not a non-empty list of map items")
        try:
            return cls(number, key, tuple(MapItem.from_json(d) for d in docs))
        except IntegrityError as exc:
            raise IntegrityError(f"plan round {key}: {exc.message}") from None


_ENTRY_COUNTS = ("index", "input_index", "offset", "length", "stored_length", "pack", "pack_offset")


def entry_from_json(doc: Any, what: str) -> ChunkEntry:
    """A chunk's entry in a result record, strictly: its integers are JSON integers."""
    f = Fields(doc, what, (*_ENTRY_COUNTS, "checksum", "mac", "compression"))
    for name in _ENTRY_COUNTS:
        f.count(name)
    for name in ("checksum", "mac", "compression"):
        f.text(name)
    try:
        return ChunkEntry.from_json(f.doc, f.doc["input_index"])
    except ValueError as exc:
        raise IntegrityError(f"{what} is malformed: {exc}") from None


@dataclass(frozen=True)
class ItemResult:
    """What a worker stored for one map item: a ChunkEntry per chunk, in chunk order.

    `usage` (optional, absent from records of older workers): what the
    invocation that wrote the record used, its own PUT included
    (braid.format.usage); Finalize adds them up into the manifest.
    """

    first_index: int
    entries: tuple[ChunkEntry, ...]
    usage: Usage | None = None

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_json())

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> ItemResult:
        return cls.from_json(document(raw, f"result record {where}"), where)

    def to_json(self) -> dict[str, Any]:
        chunks = [{**e.to_json(), "input_index": e.input_index} for e in self.entries]
        doc: dict[str, Any] = {"first_index": self.first_index, "count": len(self.entries), "chunks": chunks}
        if self.usage is not None:
            doc["usage"] = self.usage.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: Any, where: str, kind: str = "result record") -> ItemResult:
        what = f"{kind} {where}"
        f = Fields(doc, what, ("first_index", "count", "chunks"), optional=("usage",))
        entries = tuple(entry_from_json(c, f"{what} chunk {n}") for n, c in enumerate(f.objects("chunks")))
        usage = optional_usage(f, "usage")
        if f.count("count") != len(entries):
            raise IntegrityError(f"{what} is truncated")
        return cls(f.count("first_index"), entries, usage)

    def is_cut(self, item: MapItem) -> bool:
        """Whether this result stores only the item's first packs (a cut item's worker stopped at stream end)."""
        return len(self.entries) < item.count

    def check(self, item: MapItem, backup: str) -> None:
        """The record must describe exactly the chunks the plan gave the item, or, for a cut item, its first whole packs."""
        expected = item.chunks()
        if len(self.entries) != len(expected) and not (item.cut and 0 < len(self.entries) < len(expected) and len(self.entries) in accumulate(item.packs)):
            raise IntegrityError(f"result for chunks {item.first_index}.. of {backup} lists {len(self.entries)} chunks, the plan {len(expected)}")
        for planned, entry in zip(expected, self.entries, strict=False):
            if (entry.index, entry.input_index, entry.offset, entry.length) != (planned.index, item.input_index, planned.offset, planned.length):
                raise IntegrityError(
                    f"result for chunk {planned.index} of {backup} describes chunk {entry.index} of input {entry.input_index}"
                    f" at {entry.offset}+{entry.length}; the plan says input {item.input_index} at {planned.offset}+{planned.length}"
                )


@dataclass(frozen=True)
class RoundFold:
    """The results index: the result records of one map's finished items, merged by the planner right after that map.

    A faster copy for Finalize (why, measured: docs/design/2026-11-28-results-index.md): each result in it is
    checked against its planned item exactly as a record is, and an item no fold covers is read from its record,
    so a missing fold costs time, never correctness. A cut item's result (MapItem.cut) in a fold is the prefix
    the planner planned the rest after, whatever a late attempt rewrites its record to.
    """

    round: int
    attempt: int  # 0: the round's own map; A: its retry file plans/retry-RRRRR-AA.json
    results: tuple[ItemResult, ...]

    def to_bytes(self) -> bytes:
        return canonical_json({"round": self.round, "attempt": self.attempt, "items": [r.to_json() for r in self.results]})

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> RoundFold:
        what = f"result fold {where}"
        f = Fields(document(raw, what), what, ("round", "attempt", "items"))
        results = tuple(ItemResult.from_json(d, f"{where} item {n}", "result fold") for n, d in enumerate(f.objects("items")))
        return cls(f.count("round"), f.count("attempt"), results)
