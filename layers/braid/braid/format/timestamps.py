"""The one timestamp format of everything Braid writes: ISO 8601 UTC with
microseconds and a `Z` (`2026-11-23T01:02:03.456789Z`).

Manifests, staging records and reports all use it, so a reader in any
language parses one form, and the text order is the time order.
"""

from __future__ import annotations

from datetime import UTC, datetime

_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def format_timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(_FORMAT)


def utc_now() -> str:
    return format_timestamp(datetime.now(UTC))


def parse_timestamp(text: str) -> datetime:
    """The moment a Braid timestamp names; ValueError for any other form."""
    return datetime.strptime(text, _FORMAT).replace(tzinfo=UTC)
