"""Backup identity: `NAME@ID`, where ID (UTC start, to the millisecond, and
32 random bits) sorts by creation time.

The id doubles as the Step Functions execution name and a path component in
the repository, so both parts use a conservative alphabet.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from braid.errors import UsageError

# Always fullmatch: `$` also matches before a trailing newline, and "nl\n"
# would become a directory name in the repository.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,47}")
_ID = re.compile(r"\d{8}T\d{6}\.\d{3}Z-[0-9a-f]{8}", re.ASCII)
LATEST = "latest"


def validate_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"invalid backup name {name!r}: use 1-48 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


@dataclass(frozen=True, order=True)
class BackupRef:
    """A backup's full identity; `id` may be `latest` until resolved."""

    name: str
    id: str

    @classmethod
    def new(cls, name: str, now: datetime | None = None) -> BackupRef:
        moment = (now or datetime.now(UTC)).astimezone(UTC)
        stamp = moment.strftime("%Y%m%dT%H%M%S") + f".{moment.microsecond // 1000:03d}Z"
        return cls(validate_name(name), stamp + "-" + os.urandom(4).hex())  # secrets.token_hex(4), without loading secrets' hmac

    @classmethod
    def parse(cls, text: str) -> BackupRef:
        name, sep, ident = text.partition("@")
        if not sep:
            raise UsageError(f"invalid backup reference {text!r}: expected NAME@ID or NAME@latest")
        validate_name(name)
        if ident != LATEST and not _ID.fullmatch(ident):
            raise UsageError(f"invalid backup id {ident!r} in {text!r}: expected an id such as 20261123T010203.456Z-1a2b3c4d, or 'latest'")
        return cls(name, ident)

    @property
    def is_latest(self) -> bool:
        return self.id == LATEST

    @property
    def started(self) -> datetime:
        """The UTC start time the id records (to the millisecond): what retention ages a backup by."""
        if self.is_latest:
            raise UsageError(f"{self} names no particular backup; resolve it first")
        stamp = self.id  # YYYYMMDDTHHMMSS.mmmZ-..., checked by _ID (no strptime: braid.format.timestamps says why)
        return datetime(
            int(stamp[0:4]), int(stamp[4:6]), int(stamp[6:8]), int(stamp[9:11]), int(stamp[11:13]), int(stamp[13:15]),
            int(stamp[16:19]) * 1000, tzinfo=UTC,
        )

    def __str__(self) -> str:
        return f"{self.name}@{self.id}"
