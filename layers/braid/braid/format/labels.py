"""Labels: `KEY=VALUE` notes a user attaches to a backup (`braid backup --label`), like pgBackRest's annotations.

Stored in the manifest and its catalog summary as a JSON object of strings
(docs/format.md, Labels), shown by list and show, matched by
`list --label KEY=VALUE`. Optional and additive: a manifest or summary
without them reads as before, and a Braid that predates them ignores them.
A key is 1-64 letters, digits, '.', '_' or '-' (starting with a letter or
digit); a value is at most 256 printable characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from braid.errors import UsageError

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
MAX_VALUE = 256
MAX_LABELS = 32


def parse_label(text: str) -> tuple[str, str]:
    """`KEY=VALUE` as typed; UsageError naming what is wrong."""
    key, sep, value = text.partition("=")
    if not sep:
        raise UsageError(f"invalid label {text!r}: expected KEY=VALUE, e.g. --label env=prod")
    _check(key, value, f"label {text!r}")
    return key, value


def _check(key: str, value: str, where: str) -> None:
    if not _KEY.fullmatch(key):
        raise UsageError(f"invalid {where}: a key is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if len(value) > MAX_VALUE or not value.isprintable():
        raise UsageError(f"invalid {where}: a value is at most {MAX_VALUE} printable characters")


def labels_of(texts: Iterable[str]) -> dict[str, str]:
    """The labels of repeated `--label KEY=VALUE` options; a key given twice is refused."""
    labels: dict[str, str] = {}
    for text in texts:
        key, value = parse_label(text)
        if key in labels:
            raise UsageError(f"label {key!r} given twice (--label {key}={labels[key]} and --label {text})")
        labels[key] = value
    if len(labels) > MAX_LABELS:
        raise UsageError(f"at most {MAX_LABELS} labels per backup, not {len(labels)}")
    return labels


def check_labels(doc: Any) -> dict[str, str]:
    """Labels as read from a manifest or summary: an object of valid keys and string values, else ValueError."""
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in doc.items()):
        raise ValueError("labels must be an object of strings")
    try:
        for key, value in doc.items():
            _check(key, value, f"label {key!r}")
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    return dict(doc)


def matches(labels: dict[str, str] | None, wanted: dict[str, str]) -> bool:
    """Whether a backup's labels include every wanted KEY=VALUE (`list --label`, repeatable: all must hold)."""
    have = labels or {}
    return all(have.get(key) == value for key, value in wanted.items())
