"""The WAL archive of a backup name: its identity record, what it holds, and which ranges are whole.

`wal_range_present` is what a base backup asks before it publishes (its WAL
from start to stop must be archived) and what `verify --wal` and `prune`
build on. Nothing here needs a key: names and presence are not secret
(the bytes are, braid.format.wal_object).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from braid.errors import AlreadyExistsError, IntegrityError, NotFoundError, UsageError
from braid.format.fields import Fields
from braid.format.layout import archive_info_key, directory_prefix, timeline_prefix, wal_file_of_key, wal_prefix
from braid.format.repository import Repository
from braid.format.wal import DEFAULT_SEGMENT_SIZE, HISTORY, SEGMENT, WalFile, check_segment_size, parse_lsn, segment_before, segment_name, segment_of
from braid.ports.store import ObjectStore

INFO_FORMAT = "braid-wal-archive"
# 3: its staging may hold bundles (braid.format.wal_bundle); 2: the archive may hold packs (braid.format.wal_pack);
# 1: one object per file. All three are read; a Braid that predates bundles refuses a version 3 record.
INFO_VERSION = 3
READ_VERSIONS = (1, 2, 3)


@dataclass(frozen=True)
class ArchiveInfo:
    """`wal/NAME/archive.json`: which cluster the archive belongs to, and its segment size.

    Written create-only by the first segment pushed; every later segment's
    own page header must name the same system identifier and segment size
    (a second cluster pushing under the same name is refused, never mixed in).
    """

    name: str
    system_identifier: int
    segment_size: int
    version: int = INFO_VERSION

    @property
    def may_hold_packs(self) -> bool:
        """Whether the WAL worker may pack into this archive: a reader older than version 2 refuses its record."""
        return self.version >= 2

    @property
    def may_stage_bundles(self) -> bool:
        """Whether `wal-push --async` may stage bundles for this archive: every reader of its staging reads them."""
        return self.version >= 3

    def to_bytes(self) -> bytes:
        doc = {
            "format": INFO_FORMAT,
            "version": self.version,
            "name": self.name,
            "system_identifier": str(self.system_identifier),
            "segment_size": self.segment_size,
        }
        return json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> ArchiveInfo:
        try:
            doc = json.loads(raw)
            if doc.get("format") != INFO_FORMAT or doc.get("version") not in READ_VERSIONS:
                raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}, expected {INFO_FORMAT} {READ_VERSIONS}")
            f = Fields(doc, "record", ("format", "version", "name", "system_identifier", "segment_size"))
            system = f.text("system_identifier")  # a decimal string: 64 bits exceed what JSON readers keep exact
            if not system.isdigit():
                raise ValueError(f"system_identifier must be a decimal string, not {system!r}")
            return cls(f.text("name"), int(system), check_segment_size(f.count("segment_size")), int(doc["version"]))
        except (ValueError, KeyError, TypeError, AttributeError, UsageError) as exc:
            raise IntegrityError(f"{where} is not a valid WAL archive record: {exc}") from None


def read_archive_info(store: ObjectStore, name: str) -> ArchiveInfo | None:
    """The archive's identity record, or None before its first segment."""
    key = archive_info_key(name)
    try:
        raw = store.get(key)
    except NotFoundError:
        return None
    info = ArchiveInfo.from_bytes(raw, f"{store.url}/{key}")
    if info.name != name:
        raise IntegrityError(f"{store.url}/{key} describes the archive of {info.name!r}, not {name!r}; it was moved or copied")
    return info


def record_archive_info(store: ObjectStore, info: ArchiveInfo) -> ArchiveInfo:
    """Create the identity record, or return the one already there (which the caller compares)."""
    try:
        store.put(archive_info_key(info.name), info.to_bytes(), create_only=True)
    except AlreadyExistsError:
        found = read_archive_info(store, info.name)
        if found is None:  # pragma: no cover - removed between the two calls
            raise
        return found
    return info


def segment_size_of(store: ObjectStore, name: str) -> int:
    """The archive's recorded segment size, else PostgreSQL's default (16 MiB)."""
    info = read_archive_info(store, name)
    return info.segment_size if info is not None else DEFAULT_SEGMENT_SIZE


def archived_files(store: ObjectStore, name: str, prefix: str | None = None) -> Iterator[tuple[WalFile, str]]:
    """Every archived WAL file of `name` (under `prefix`, a key prefix inside its archive), with its key, in key order;
    each member of a pack (braid.format.wal_pack) with the pack's key. A file archived twice is yielded twice."""
    from braid.ops.wal_packed import packed_members

    for info in store.list(prefix or wal_prefix(name)):
        file = wal_file_of_key(name, info.key)
        if file is not None:
            yield file, info.key
            continue
        for member in packed_members(name, info.key) or ():
            yield member, info.key


def segments_in_range(timeline: int, first: int, last: int, segment_size: int) -> list[str]:
    """The names of segments `first`..`last` (inclusive) on `timeline`."""
    return [segment_name(timeline, segno, segment_size) for segno in range(first, last + 1)]


def present_segments(store: ObjectStore, name: str, names: Iterable[str]) -> set[str]:
    """Which of the segment `names` are archived as whole segments: one LIST per directory they fall in."""
    wanted = set(names)
    present: set[str] = set()
    for directory in sorted({directory_prefix(name, n) for n in wanted}):
        for file, _key in archived_files(store, name, directory):
            if file.kind == SEGMENT and file.name in wanted:
                present.add(file.name)
    return present


def wal_range_present(
    repository: Repository | ObjectStore, name: str, timeline: int, start_lsn: str | int, stop_lsn: str | int
) -> list[str]:
    """The segments from the one holding `start_lsn` to the one holding the byte before `stop_lsn`
    on `timeline` that are NOT archived under `name`, in order: [] when the range is whole.

    LSNs are PostgreSQL's `X/Y` text or integers. The segment size is the
    archive's recorded one (16 MiB before its first segment). A `.partial`
    file does not count: only whole segments make a range replayable.
    """
    store = repository.store if isinstance(repository, Repository) else repository
    size = segment_size_of(store, name)
    start, stop = parse_lsn(start_lsn), parse_lsn(stop_lsn)
    first = segment_of(start, size)
    last = max(first, segment_before(stop, size))
    wanted = segments_in_range(timeline, first, last, size)
    present = present_segments(store, name, wanted)
    return [n for n in wanted if n not in present]


def timeline_segments(store: ObjectStore, name: str, timeline: int) -> list[WalFile]:
    """Every archived whole segment of `timeline`, in order."""
    return [file for file, _key in archived_files(store, name, timeline_prefix(name, timeline)) if file.kind == SEGMENT]


def history_files(store: ObjectStore, name: str) -> list[WalFile]:
    """The archived `.history` files of `name`, oldest timeline first."""
    return [file for file, _key in archived_files(store, name) if file.kind == HISTORY]
