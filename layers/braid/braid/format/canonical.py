"""The one JSON encoder for bytes that are authenticated or bound into a key.

Compact (no whitespace), keys sorted by code point, non-ASCII escaped as
`\\uXXXX`: the same document always encodes to the same bytes, so a sealed
manifest is reproducible and the local key file's associated data (the
encryption context) is a fixed byte string.

Verifying never re-encodes: the manifest MAC and checksum cover the body
bytes exactly as stored (braid.format.manifest), so a reader in another
language needs no JSON canonicaliser at all. The encryption context, the one
place where these bytes are rebuilt, holds only the `[A-Za-z0-9._@:-]`
strings of braid.format.ids and a uuid, for which this encoding is simply
`{"braid:backup":"NAME@ID","braid:repository":"<uuid>"}` (docs/format.md).
"""

from __future__ import annotations

import json
from typing import Any


def canonical_json(doc: Any) -> bytes:
    """`doc` as compact, key-sorted, ASCII-only JSON."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
