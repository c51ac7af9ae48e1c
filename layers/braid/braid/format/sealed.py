"""Self-checked small records: the catalog's summaries and snapshots.

The same fixed byte layout as the manifest (docs/format.md, Manifest), with
the record's own field name in place of `manifest`:

    {"mac":"<64 hex>","FIELD":BODY,"sha256":"<64 hex>"}   a summary (MAC by a data-key holder)
    {"FIELD":BODY,"sha256":"<64 hex>"}                     a snapshot (written by a reader with no key)

`sha256` is SHA-256 of BODY followed by the MAC's 64 hex digits (nothing
when there is no MAC), so corruption shows without a key; the MAC, where
present, shows who wrote it. Both cover BODY exactly as stored: a reader
slices it out and never re-serialises it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from braid.errors import IntegrityError
from braid.format.digests import sha256

_HEX = rb"([0-9a-f]{64})"
_TRAILING = re.compile(rb',"sha256":"' + _HEX + rb'"\}')
_TRAILER_BYTES = len(b',"sha256":"') + 64 + len(b'"}')


def _head(field: str, mac_hex: bytes | None) -> bytes:
    mac_part = b'"mac":"' + mac_hex + b'",' if mac_hex is not None else b""
    return b"{" + mac_part + b'"' + field.encode() + b'":'


def _digest(body: bytes, mac_hex: bytes) -> bytes:
    return sha256(body, mac_hex).hex().encode()


def seal(field: str, body: bytes, mac: bytes | None) -> bytes:
    """The stored record for `body` (written as it is) and its MAC, if any."""
    mac_hex = mac.hex().encode() if mac is not None else None
    return _head(field, mac_hex) + body + b',"sha256":"' + _digest(body, mac_hex or b"") + b'"}'


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are all distinct: duplicate keys mean different things to different parsers."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise ValueError("duplicate key in a JSON object")
    return doc


def reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def unseal(raw: bytes, field: str, where: str, *, with_mac: bool, strict: bool = True) -> tuple[dict[str, Any], bytes, bytes | None]:
    """(parsed BODY, BODY bytes, MAC or None) after checking the layout and the checksum; needs no key.

    `strict` refuses duplicate keys in any object (different parsers take
    different ones, which matters for what a MAC vouches for); a snapshot,
    a keyless cache of 10,000 objects, is parsed without that per-object
    hook, which costs more than the rest of its parse.
    """
    mac_hex: bytes | None = None
    if with_mac:
        match = re.match(rb'\{"mac":"' + _HEX + rb'",', raw)
        mac_hex = match.group(1) if match else None
        if mac_hex is None:
            raise IntegrityError(f"{where}: not a valid Braid record (corrupt)")
    head = _head(field, mac_hex)
    end = len(raw) - _TRAILER_BYTES
    trailing = _TRAILING.fullmatch(raw, end) if end >= len(head) else None
    if not raw.startswith(head) or trailing is None:
        raise IntegrityError(f"{where}: not a valid Braid record (corrupt)")
    body = raw[len(head) : end]
    if _digest(body, mac_hex or b"") != trailing.group(1):  # corruption, not forgery: the MAC, where present, is checked by its key
        raise IntegrityError(f"{where}: checksum mismatch (corrupt)")
    try:
        hook = unique_keys if strict else None
        doc = json.loads(body.decode("utf-8"), object_pairs_hook=hook, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        raise IntegrityError(f"{where}: not a valid Braid record (corrupt)")
    return doc, body, bytes.fromhex(mac_hex.decode()) if mac_hex is not None else None
