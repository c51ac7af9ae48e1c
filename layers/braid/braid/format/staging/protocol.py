"""The staging protocol: its version and the one strict reader of every staging document.

The agent (installed on the database host) and the pipeline (deployed by CDK)
are separate deploy units, and a backup can run for days. They agree through
the staging records (braid.format.staging) and the execution input
(braid.pipeline.execution_input), and both carry `"protocol": PROTOCOL`. A
reader refuses another number (ProtocolMismatchError, naming both) instead
of meeting records it would misread.

Decoding is strict everywhere: an integer must be a JSON integer (`true`,
`"0"` and `4.9` are refused, never coerced), a string a JSON string, and a
document names exactly its fields.

Versions:
  1  (no "protocol" field) until 2026-11-28.
  2  "protocol" in session.json and the execution input; each map item
     carries its pack sizes ("packs", decided by the planner) and names its
     first chunk "first_chunk" (was "first_chunk").
"""

from __future__ import annotations

import json
from typing import Any

from braid.errors import IntegrityError, UsageError

PROTOCOL = 2


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


class Fields:
    """Typed reads of one JSON object's fields, each failure an IntegrityError naming the record.

    `bool` is refused where an int is wanted (JSON `true` is not a count), and so are
    strings and floats: nothing is coerced.
    """

    def __init__(self, doc: Any, what: str, names: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        if not isinstance(doc, dict):
            raise IntegrityError(f"{what} is malformed: not a JSON object")
        missing = [n for n in names if n not in doc]
        unknown = sorted(set(doc) - set(names) - set(optional))
        if missing or unknown:
            detail = "; ".join(s for s in (f"missing {', '.join(missing)}" if missing else "", f"unknown {', '.join(unknown)}" if unknown else "") if s)
            raise IntegrityError(f"{what} is malformed: {detail}")
        self.doc: dict[str, Any] = doc
        self.what = what

    def _fail(self, name: str, wanted: str) -> IntegrityError:
        return IntegrityError(f"{self.what} is malformed: {name} must be {wanted}, not {self.doc.get(name)!r}")

    def count(self, name: str) -> int:
        """A non-negative integer."""
        value = self.doc[name]
        if type(value) is not int or value < 0:
            raise self._fail(name, "a non-negative integer")
        return value

    def flag(self, name: str, default: bool = False) -> bool:
        value = self.doc.get(name, default)
        if not isinstance(value, bool):
            raise self._fail(name, "true or false")
        return value

    def text(self, name: str) -> str:
        value = self.doc[name]
        if not isinstance(value, str):
            raise self._fail(name, "a string")
        return value

    def texts(self, name: str, default: list[str] | None = None) -> list[str]:
        value = self.doc.get(name, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail(name, "a list of strings")
        return list(value)

    def counts(self, name: str) -> list[int]:
        value = self.doc[name]
        if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
            raise self._fail(name, "a list of non-negative integers")
        return list(value)

    def objects(self, name: str) -> list[Any]:
        value = self.doc[name]
        if not isinstance(value, list):
            raise self._fail(name, "a list")
        return value
