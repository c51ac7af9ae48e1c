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

Versions (docs/format.md, "Cloud staging"):
  1  no "protocol" field (until 2026-11-28).
  2  "protocol" in session.json and the execution input; map items carry
     their "packs"; "part" renamed where it meant a chunk ("first_chunk",
     "segment_chunks", a segment record's "chunks" and "chunk_checksums").
  3  incremental chains and captured members (braid.format.staging.chain).
  4  the planner's folds are the one results index (compacted/ is gone);
     the execution input carries "policies" (braid.pipeline.policies).
"""

from __future__ import annotations

import json
from typing import Any

from braid.errors import IntegrityError, UsageError

PROTOCOL = 4


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
