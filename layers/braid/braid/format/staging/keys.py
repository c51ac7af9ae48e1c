"""Every key of a backup's staging area, and the parsers listings need (layout: docs/format.md).

One builder per kind of object, so the agent, the pipeline and the cleanup
name the same objects the same way; the parsers invert the builders of the
kinds found by listing (segment objects and plan rounds).
"""

from __future__ import annotations

import re

from braid.format.ids import BackupRef
from braid.format.layout import STAGING, staging_prefix

SESSION = "session.json"
STREAM_END = "stream-end.json"
AGENT_LEASE = "lease"
SEGMENT_RECORDS = "segments/"
ROUNDS = "plans/round-"
RESULTS = "results/"
FAILURES = "failures/"
FOLDS = "folds/"
WAKE = "wake"

# Relative to the staging prefix: `in<I>/seg<SSSSS>`, as segment_key writes them.
_SEGMENT = re.compile(r"in(\d+)/seg(\d{5,})", re.ASCII)
_ROUND = re.compile(r"plans/round-(\d{5,})\.json", re.ASCII)


def session_key(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}{SESSION}"


def segment_key(ref: BackupRef, input_index: int, segment: int) -> str:
    return f"{staging_prefix(ref)}in{input_index}/seg{segment:05d}"


def segments_prefix(ref: BackupRef) -> str:
    """What every segment object's key starts with (and nothing else of the area's)."""
    return f"{staging_prefix(ref)}in"


def parse_segment_key(ref: BackupRef, key: str) -> tuple[int, int] | None:
    """(input, segment) of a segment object's key, or None for any other key.

    Takes repository-relative keys; a caller listing raw S3 keys strips the
    store's own prefix first (S3Store.object_key is the inverse).
    """
    match = _relative_match(ref, key, _SEGMENT)
    return (int(match.group(1)), int(match.group(2))) if match else None


def segment_record_key(ref: BackupRef, input_index: int, segment: int) -> str:
    return f"{staging_prefix(ref)}{SEGMENT_RECORDS}in{input_index}-seg{segment:05d}.json"


def segment_records_prefix(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}{SEGMENT_RECORDS}"


def stream_end_key(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}{STREAM_END}"


def wrapped_key_key(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}key.json"


def agent_lease_key(ref: BackupRef) -> str:
    """The agent's heartbeat while it uploads (braid.format.lease): rewritten every minute, it shows activity that
    S3 lists nothing for (the parts of a multipart upload in progress). It goes with the rest of staging."""
    return f"{staging_prefix(ref)}{AGENT_LEASE}"


def wake_key(ref: BackupRef) -> str:
    """Where the sleeping pipeline's state machine leaves its task token for the agent (WakeRecord, braid.agent.wake)."""
    return f"{staging_prefix(ref)}{WAKE}"


def rounds_prefix(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}{ROUNDS}"


def round_key(ref: BackupRef, number: int) -> str:
    return f"{staging_prefix(ref)}{ROUNDS}{number:05d}.json"


def parse_round_key(ref: BackupRef, key: str) -> int | None:
    """The round number of a round file's key, or None for any other key."""
    match = _relative_match(ref, key, _ROUND)
    return int(match.group(1)) if match else None


def result_key(ref: BackupRef, index: int) -> str:
    return f"{staging_prefix(ref)}{RESULTS}{index:010d}.json"


def results_prefix(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}{RESULTS}"


def failure_key(ref: BackupRef, index: int) -> str:
    """A worker's failure record for the map item starting at chunk `index` (ItemFailure)."""
    return f"{staging_prefix(ref)}{FAILURES}{index:010d}.json"


def failures_prefix(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}{FAILURES}"


def retry_key(ref: BackupRef, round_number: int, attempt: int) -> str:
    """Items of round `round_number` that had no result after its map, planned again (`attempt` 1, 2, ...).

    Not under `plans/round-`: they reuse their round's chunk indexes, so they are no round of the ledger."""
    return f"{staging_prefix(ref)}plans/retry-{round_number:05d}-{attempt:02d}.json"


def fold_key(ref: BackupRef, round_number: int, attempt: int) -> str:
    """The results of round `round_number`'s map (attempt 0) or of its retry `attempt`, merged (RoundFold)."""
    return f"{staging_prefix(ref)}{FOLDS}round-{round_number:05d}-{attempt:02d}.json"


def folds_prefix(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}{FOLDS}"


def _relative_match(ref: BackupRef, key: str, pattern: re.Pattern[str]) -> re.Match[str] | None:
    """`pattern` matched against the part of `key` after the backup's staging prefix (None for a key outside it)."""
    prefix = staging_prefix(ref)
    return pattern.fullmatch(key[len(prefix) :]) if key.startswith(prefix) else None


def held_key(ref: BackupRef) -> str:
    """Written by the planner when items still fail after its re-plans: the backup waits for `--resume` (HoldRecord)."""
    return f"{staging_prefix(ref)}held.json"


def resume_key(ref: BackupRef) -> str:
    """Written by `braid backup --resume`: a new request (its nonce) releases a hold (ResumeRequest)."""
    return f"{staging_prefix(ref)}resume.json"


# -- an incremental's records (braid.format.staging.chain, protocol 3) --------------------------------------------------
PARENT = "parent.json"


def captured_index_key(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}captured.json"


def captured_member_key(ref: BackupRef, number: int) -> str:
    """The `number`th member of the captured index, in the index's (sorted) order."""
    return f"{staging_prefix(ref)}captured/{number}"


def parent_record_key(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}{PARENT}"


def parent_manifest_key(ref: BackupRef) -> str:
    return f"{staging_prefix(ref)}parent/backup_manifest"


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
