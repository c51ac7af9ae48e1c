"""The staging protocol: its version and the one strict reader of every staging document.

The agent (installed on the database host) and the pipeline (deployed by CDK)
are separate deploy units, and a backup can run for days. They agree through
the staging records (braid.format.staging) and the execution input
(braid.pipeline.execution_input), and both carry `"protocol": PROTOCOL`. A
reader refuses another number (ProtocolMismatchError, naming both) instead
of meeting records it would misread.

Decoding is strict everywhere: an integer must be a JSON integer (`true`,
`"0"` and `4.9` are refused, never coerced), a string a JSON string, and a
document names exactly its fields. Record is that rule once for the flat
records: a dataclass's fields are its document. What each version changed:
docs/format.md, "Cloud staging".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Self

from braid.errors import IntegrityError, UsageError
from braid.format.canonical import canonical_json
from braid.format.fields import Fields
from braid.format.usage import Usage

PROTOCOL = 5


class ProtocolMismatchError(UsageError):
    """A staging document or execution input of another protocol version than this code speaks."""


def check_protocol(doc: Any, what: str) -> None:
    """Refuse `doc` (a JSON object) unless its "protocol" is this code's PROTOCOL (absent: version 1)."""
    if not isinstance(doc, dict):
        return  # the document's own reader says what it is not
    found = doc.get("protocol", 1)
    if type(found) is not int:
        raise IntegrityError(f"{what} is malformed: protocol must be an integer, not {found!r}")
    if found != PROTOCOL:
        raise ProtocolMismatchError(
            f"{what} speaks staging protocol {found}; this braid speaks protocol {PROTOCOL}:"
            " finish or abandon the backup with the braid and stack that started it, or start a new backup"
        )


def document(raw: bytes, what: str) -> Any:
    """The JSON in `raw`, or an IntegrityError naming `what` (a record and its key)."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise IntegrityError(f"{what} is malformed: not JSON") from None


def optional_usage(f: Fields, name: str) -> Usage | None:
    """The Usage at `name` (braid.format.usage), or None when the field is absent."""
    try:
        return Usage.from_json(f.doc[name], name) if name in f.doc else None
    except ValueError as exc:
        raise IntegrityError(f"{f.what} is malformed: {exc}") from None


# How a Record reads a field, by its annotation.
_READERS: dict[str, Callable[[Fields, str], Any]] = {
    "int": Fields.count,
    "str": Fields.text,
    "str | None": Fields.optional_text,
    "list[int]": Fields.counts,
    "list[str]": Fields.texts,
    "Usage | None": optional_usage,
}


@dataclass(frozen=True)
class Record:
    """A flat staging record: a frozen dataclass stored as the canonical JSON object of its fields, by name.

    A None field is left out; a field with a default may be absent, any other must be there, an unknown one is
    refused. Each is read by its annotation (_READERS: an `int` is a non-negative JSON integer); an IntegrityError
    names KIND, the key and the field.
    """

    KIND: ClassVar[str]  # what the record is called in errors, before its key

    def to_bytes(self) -> bytes:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        return canonical_json({k: v.to_json() if isinstance(v, Usage) else v for k, v in doc.items() if v is not None})

    @classmethod
    def from_bytes(cls, raw: bytes, where: str = "") -> Self:
        what = f"{cls.KIND} {where}".rstrip()
        specs = fields(cls)
        optional = tuple(f.name for f in specs if f.default is not MISSING or f.default_factory is not MISSING)
        doc = Fields(document(raw, what), what, tuple(f.name for f in specs if f.name not in optional), optional)
        return cls(**{f.name: _READERS[str(f.type)](doc, f.name) for f in specs if f.name in doc.doc})
