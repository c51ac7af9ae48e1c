"""The staging records of a backup's captured members and of an incremental's parent (protocol 3; docs/format.md).

`captured.json` + `captured/N`: the small members the agent's stream carried
(braid.engine.capture), indexed with their size and SHA-256, for Finalize.
`parent.json` + `parent/backup_manifest`: Prepare's answer to an
incremental's agent (which holds no key), the parent values it asked for or
why the chain is refused; the agent waits for it before its producer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from braid.errors import IntegrityError
from braid.format.canonical import canonical_json
from braid.format.digests import sha256
from braid.format.fields import Fields
from braid.format.metadata import MEMBER_LIMITS
from braid.format.staging.keys import PARENT
from braid.format.staging.protocol import PROTOCOL, check_protocol, document


@dataclass(frozen=True)
class CapturedIndex:
    """Member name -> (size, sha256 hex) of its staged object; the members in sorted order are captured/0, captured/1, ..."""

    members: Mapping[str, tuple[int, str]]

    @classmethod
    def of(cls, members: Mapping[str, bytes]) -> CapturedIndex:
        for name, data in members.items():
            limit = MEMBER_LIMITS.get(name)
            if limit is None or len(data) > limit:
                raise IntegrityError(f"refusing to stage captured member {name!r} ({len(data)} bytes)")
        return cls({name: (len(data), sha256(data).hex()) for name, data in sorted(members.items())})

    @property
    def names(self) -> list[str]:
        return sorted(self.members)

    def to_bytes(self) -> bytes:
        return canonical_json({"protocol": PROTOCOL, "members": {n: {"size": s, "sha256": h} for n, (s, h) in sorted(self.members.items())}})

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> CapturedIndex:
        what = f"captured index {where}"
        doc = document(raw, what)
        check_protocol(doc, what)
        f = Fields(doc, what, ("protocol", "members"))
        if not isinstance(f.doc["members"], dict):
            raise IntegrityError(f"{what} is malformed: members must be an object")
        members: dict[str, tuple[int, str]] = {}
        for name, entry in f.doc["members"].items():
            e = Fields(entry, f"{what}, member {name!r}", ("size", "sha256"))
            size, digest = e.count("size"), e.text("sha256")
            if name not in MEMBER_LIMITS or size > MEMBER_LIMITS[name] or len(digest) != 64:
                raise IntegrityError(f"{what} is malformed: member {name!r} ({size} bytes) is not one Braid captures")
            members[name] = (size, digest)
        return cls(members)

    def check(self, name: str, data: bytes, where: str) -> bytes:
        """`data` is exactly what the index says member `name` is."""
        size, digest = self.members[name]
        if len(data) != size or sha256(data).hex() != digest:
            raise IntegrityError(f"staged captured member {where} ({name}) is not what its index records ({size} bytes, sha256 {digest})")
        return data


@dataclass(frozen=True)
class ParentRecord:
    """Prepare's answer to an incremental's agent: the parent, and its `{parent_lsn}` / `{parent_manifest}`
    (the latter as the size and SHA-256 of `parent/backup_manifest`); or `refused`: why the chain cannot be built on
    (missing, unreadable: exit 6), or `unavailable`: the placeholder value the parent does not have (exit 2)."""

    parent: str
    lsn: str | None = None
    manifest: tuple[int, str] | None = None
    refused: str | None = None
    unavailable: str | None = None

    def to_bytes(self) -> bytes:
        manifest = None if self.manifest is None else {"size": self.manifest[0], "sha256": self.manifest[1]}
        doc = {"parent_lsn": self.lsn, "parent_manifest": manifest, "refused": self.refused, "unavailable": self.unavailable}
        return canonical_json({"protocol": PROTOCOL, "parent": self.parent, **{k: v for k, v in doc.items() if v is not None}})

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> ParentRecord:
        what = f"parent record {where}"
        doc = document(raw, what)
        check_protocol(doc, what)
        f = Fields(doc, what, ("protocol", "parent"), optional=("parent_lsn", "parent_manifest", "refused", "unavailable"))
        manifest = None
        if "parent_manifest" in f.doc:
            m = Fields(f.doc["parent_manifest"], f"{what}, parent_manifest", ("size", "sha256"))
            manifest = (m.count("size"), m.text("sha256"))
        return cls(f.text("parent"), f.optional_text("parent_lsn"), manifest, f.optional_text("refused"), f.optional_text("unavailable"))

    def check_manifest(self, data: bytes, where: str) -> bytes:
        if self.manifest is None or len(data) != self.manifest[0] or sha256(data).hex() != self.manifest[1]:
            raise IntegrityError(f"the parent's backup_manifest staged at {where} is not what {PARENT} records")
        return data
