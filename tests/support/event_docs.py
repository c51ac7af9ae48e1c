"""docs/cloud.md's table of EventBridge events, read back so tests can hold the code to it."""

from __future__ import annotations

import re
from pathlib import Path

CLOUD_DOC = Path(__file__).resolve().parents[2] / "docs" / "cloud.md"


def documented_events() -> dict[str, set[str]]:
    """detail-type -> the detail fields docs/cloud.md lists for it (the `### Events` table)."""
    text = CLOUD_DOC.read_text()
    header = text.index("| detail-type", text.index("### Events"))
    table = text[header : text.index("\n\n", header)]
    found: dict[str, set[str]] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        (detail_type,) = re.findall(r"`([^`]+)`", cells[0])
        found[detail_type] = set(re.findall(r"`([^`]+)`", cells[-1]))
    return found
