"""The one strict reader of Braid's stored JSON documents (manifests, staging records).

Every integer of a stored document is a JSON integer: `true`, `"0"` and
`4.9` are refused, never read as 1, 0 and 4 (docs/format.md). A reader in
another language then accepts exactly what Braid accepts. Each failure is
an IntegrityError naming the document and the field.
"""

from __future__ import annotations

from typing import Any

from braid.errors import IntegrityError

__all__ = ["Fields"]


class Fields:
    """Typed reads of one JSON object's fields, each failure an IntegrityError naming the record.

    `bool` is refused where an int is wanted (JSON `true` is not a count).
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

    def optional_text(self, name: str) -> str | None:
        """A string, or None when the field is absent."""
        return self.text(name) if name in self.doc else None

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

    def hex(self, name: str) -> bytes:
        """Bytes written as a hex string."""
        try:
            return bytes.fromhex(self.text(name))
        except ValueError:
            raise self._fail(name, "a hex string") from None
