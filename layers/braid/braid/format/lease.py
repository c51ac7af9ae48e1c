"""The lease: a running backup's heartbeat, so retention can tell running from abandoned.

A backup's id carries its start time, but a backup can run for days (a slow
producer, a database waiting on a lock) and still be alive. Retention must
never collect the data of a backup that may yet publish, so it measures an
unpublished backup's age from its last sign of life: the newest of the
lease's refresh time and every object's modification time (docs/format.md,
Retention). The local engine rewrites its lease every
`LEASE_REFRESH_SECONDS` while it runs and removes it once done; the cloud
agent keeps the same record at `staging/NAME/ID/lease` while it uploads
(braid.format.staging.keys.agent_lease_key), since S3 lists nothing for the
parts of an upload in progress, and leaves it for the pipeline's removal of
staging.

Stored at `data/NAME/ID/lease` (braid.format.layout.lease_key) as a small
JSON document; the store's own modification time of that object counts as
well, so neither a skewed host clock nor a store without modification
times hides a live backup.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from braid.errors import IntegrityError
from braid.format.fields import Fields
from braid.format.timestamps import parse_timestamp

LEASE_REFRESH_SECONDS = 60.0
# The cloud agent's lease is also its sign of upload progress to the planner's stall detection.
HEARTBEATS_PER_STALL_WINDOW = 4


def heartbeat_seconds(stall_seconds: float) -> float:
    """How often the cloud agent renews its lease, and the planner reads it, for a stall window of `stall_seconds`.

    The planner declares the agent dead after `stall_seconds` without a new
    segment or a renewed lease; a renewal every minute is enough for the
    default hour, but a shorter window (`braid backup --stall-timeout`) needs
    several renewals inside it, or a live upload between two segments would
    look dead."""
    return min(LEASE_REFRESH_SECONDS, stall_seconds / HEARTBEATS_PER_STALL_WINDOW)


@dataclass(frozen=True)
class LeaseRecord:
    backup: str  # NAME@ID
    refreshed: str  # Braid timestamp (braid.format.timestamps), by the backup host's clock
    host: str  # where the backup runs: what a user needs to find a stuck one
    pid: int

    def to_bytes(self) -> bytes:
        doc = {"backup": self.backup, "refreshed": self.refreshed, "host": self.host, "pid": self.pid}
        return json.dumps(doc, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_bytes(cls, raw: bytes) -> LeaseRecord:
        """ValueError for anything that is not a lease (a torn or foreign object)."""
        try:
            f = Fields(json.loads(raw), "lease", ("backup", "refreshed", "host", "pid"))
            record = cls(backup=f.text("backup"), refreshed=f.text("refreshed"), host=f.text("host"), pid=f.count("pid"))
        except IntegrityError as exc:
            raise ValueError(f"not a Braid lease: {exc.message}") from None
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a Braid lease: {exc}") from None
        record.refreshed_at  # noqa: B018 - validates the timestamp's form
        return record

    @property
    def refreshed_at(self) -> datetime:
        return parse_timestamp(self.refreshed)
