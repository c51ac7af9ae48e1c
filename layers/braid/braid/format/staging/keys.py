"""Every key of a backup's staging area, and the parsers listings need (layout: docs/format.md, "Cloud staging").

One builder per kind of object named by number, and `staging_key(ref, NAME)`
for the objects of fixed name and the folders of one kind (the names
below), so the agent, the pipeline and the cleanup name the same objects
the same way; the parsers invert the builders of the kinds found by listing
(segment objects and plan rounds).
"""

from __future__ import annotations

import re

from braid.format.ids import BackupRef
from braid.format.layout import STAGING, staging_prefix

# Objects of fixed name.
SESSION = "session.json"
STREAM_END = "stream-end.json"
WRAPPED_KEY = "key.json"
AGENT_LEASE = "lease"  # the agent's heartbeat while it uploads (braid.format.lease): S3 lists nothing for the parts in progress
WAKE = "wake"  # the sleeping pipeline's task token for the agent (WakeRecord, braid.agent.wake)
HELD = "held.json"  # the planner's hold: the backup waits for `--resume` (HoldRecord)
RESUME = "resume.json"  # `braid backup --resume`: a new request (its nonce) releases a hold (ResumeRequest)
CAPTURED = "captured.json"  # this and the parent's: braid.format.staging.chain (protocol 3)
PARENT = "parent.json"
PARENT_MANIFEST = "parent/backup_manifest"
# Folders of one kind: what every key of that kind starts with (and nothing else of the area's).
SEGMENTS = "in"
SEGMENT_RECORDS = "segments/"
ROUNDS = "plans/round-"
RESULTS = "results/"
FAILURES = "failures/"
FOLDS = "folds/"

# Relative to the staging prefix: `in<I>/seg<SSSSS>`, as segment_key writes them.
_SEGMENT = re.compile(r"in(\d+)/seg(\d{5,})", re.ASCII)
_ROUND = re.compile(r"plans/round-(\d{5,})\.json", re.ASCII)


def staging_key(ref: BackupRef, name: str) -> str:
    """The key of the object of fixed name `name` in the staging of `ref`, or the prefix of its folder `name`."""
    return f"{staging_prefix(ref)}{name}"


def session_key(ref: BackupRef) -> str:
    return staging_key(ref, SESSION)


def stream_end_key(ref: BackupRef) -> str:
    return staging_key(ref, STREAM_END)


def agent_lease_key(ref: BackupRef) -> str:
    return staging_key(ref, AGENT_LEASE)


def wake_key(ref: BackupRef) -> str:
    return staging_key(ref, WAKE)


def segment_key(ref: BackupRef, input_index: int, segment: int) -> str:
    return staging_key(ref, f"{SEGMENTS}{input_index}/seg{segment:05d}")


def parse_segment_key(ref: BackupRef, key: str) -> tuple[int, int] | None:
    """(input, segment) of a segment object's repository-relative key (S3Store.object_key is the inverse), or None
    for any other key."""
    match = _relative_match(ref, key, _SEGMENT)
    return (int(match.group(1)), int(match.group(2))) if match else None


def segment_record_key(ref: BackupRef, input_index: int, segment: int) -> str:
    return staging_key(ref, f"{SEGMENT_RECORDS}in{input_index}-seg{segment:05d}.json")


def round_key(ref: BackupRef, number: int) -> str:
    return staging_key(ref, f"{ROUNDS}{number:05d}.json")


def parse_round_key(ref: BackupRef, key: str) -> int | None:
    """The round number of a round file's key, or None for any other key."""
    match = _relative_match(ref, key, _ROUND)
    return int(match.group(1)) if match else None


def _relative_match(ref: BackupRef, key: str, pattern: re.Pattern[str]) -> re.Match[str] | None:
    """`pattern` matched against the part of `key` after the backup's staging prefix (None for a key outside it)."""
    prefix = staging_prefix(ref)
    return pattern.fullmatch(key[len(prefix) :]) if key.startswith(prefix) else None


def retry_key(ref: BackupRef, round_number: int, attempt: int) -> str:
    """Items of round `round_number` without a result after its map, planned again (`attempt` 1, 2, ...): not under
    ROUNDS, since they reuse their round's chunk indexes."""
    return staging_key(ref, f"plans/retry-{round_number:05d}-{attempt:02d}.json")


def result_key(ref: BackupRef, index: int) -> str:
    """A worker's result for the map item starting at chunk `index` (ItemResult)."""
    return staging_key(ref, f"{RESULTS}{index:010d}.json")


def failure_key(ref: BackupRef, index: int) -> str:
    """A worker's failure record for the map item starting at chunk `index` (ItemFailure)."""
    return staging_key(ref, f"{FAILURES}{index:010d}.json")


def fold_key(ref: BackupRef, round_number: int, attempt: int) -> str:
    """The results of round `round_number`'s map (attempt 0) or of its retry `attempt`, merged (RoundFold)."""
    return staging_key(ref, f"{FOLDS}round-{round_number:05d}-{attempt:02d}.json")


def captured_member_key(ref: BackupRef, number: int) -> str:
    """The `number`th member of the captured index, in the index's (sorted) order."""
    return staging_key(ref, f"captured/{number}")


# -- the running backups' registrations (braid.pipeline.account_budget) -------------------------------------------------
# Beside every backup's staging, never inside one: a name starts with a letter or digit (braid.format.ids).
RUNNING = f"{STAGING}_running/"
_RUNNING = re.compile(r"([^/]+)/([^/]+)/(\d{12})", re.ASCII)


def running_key(ref: BackupRef, stamp: int) -> str:
    """A running backup's planner was there at epoch second `stamp` (each key is one registration, the stamp in its name)."""
    return f"{running_prefix(ref)}{stamp:012d}"


def running_prefix(ref: BackupRef | None = None) -> str:
    """Every registration (None), or one backup's."""
    return RUNNING if ref is None else f"{RUNNING}{ref.name}/{ref.id}/"


def parse_running_key(key: str) -> tuple[str, int] | None:
    """("NAME@ID", stamp) of a registration's key, or None for any other key."""
    match = _RUNNING.fullmatch(key[len(RUNNING) :]) if key.startswith(RUNNING) else None
    return (f"{match.group(1)}@{match.group(2)}", int(match.group(3))) if match else None
