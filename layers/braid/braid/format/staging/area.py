"""StagingArea: one backup's staging area in a store, every record read and written here.

The agent (writing the stream, resuming it), the pipeline steps and the
agent's progress polling all go through this one class, so each record has
one reader with one validation and each failure one typed error:

    missing session           NotFoundError   (never staged, or staging removed)
    any malformed record      IntegrityError  naming the record's key
    a record that disagrees   IntegrityError  (another backup, impossible sizes,
      with the backup/session                  a key bound elsewhere, a gap in rounds)
    create-only write lost    AlreadyExistsError (session), or the winner is
                              adopted (wrapped key, rounds)

How records are read (one, or many at once), the worker results and the
planner's results index (folds) of them are its base's, StagingResults
(braid.format.staging.results).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from braid.errors import AlreadyExistsError, BackupError, IntegrityError, NotFoundError
from braid.format.canonical import canonical_json
from braid.format.staging.keys import (
    CAPTURED,
    FAILURES,
    HELD,
    PARENT,
    PARENT_MANIFEST,
    RESULTS,
    RESUME,
    ROUNDS,
    SEGMENT_RECORDS,
    SEGMENTS,
    WRAPPED_KEY,
    agent_lease_key,
    captured_member_key,
    failure_key,
    parse_round_key,
    parse_segment_key,
    result_key,
    retry_key,
    round_key,
    running_prefix,
    segment_record_key,
    session_key,
    staging_key,
    stream_end_key,
    wake_key,
)
from braid.format.staging.records import SegmentRecord, SessionRecord, StreamEnd
from braid.format.staging.results import StagingResults
from braid.format.staging.wake import WakeRecord

if TYPE_CHECKING:
    # The plan (rounds), a chain's records (captured members, the parent), a stopped backup's (holds) and the data key are imported where used:
    # an agent that only stages (--no-wait, wal-push) loads none of them (docs/design/agent-startup.md).
    from braid.format.keys import WrappedKey
    from braid.format.staging.chain import ParentRecord
    from braid.format.staging.holds import HoldRecord, ItemFailure, ResumeRequest
    from braid.format.staging.rounds import MapItem, Round
    from braid.ports.pipeline import StagingJanitor
    from braid.ports.store import ObjectInfo


class StagingArea(StagingResults):
    """One backup's staging area in a store: every record read and written here."""

    # -- session -------------------------------------------------------------
    def read_session(self) -> SessionRecord:
        key = session_key(self.ref)
        raw = self._get(key)
        if raw is None:
            raise NotFoundError(
                f"no staged session for {self.ref} in {self.store.url}: the backup was never staged"
                f" (the agent writes {key} first) or its staging was removed"
            )
        session = SessionRecord.from_bytes(raw, key)
        session.check(self.ref, key)
        return session

    def session_staged(self) -> bool:
        """Whether the session record is still staged (one HEAD); False once Finalize or Cleanup removed it, and on a
        failed look, so a caller asks the execution rather than wait on a guess."""
        try:
            return self.store.head(session_key(self.ref)) is not None
        except BackupError:
            return False

    def write_session(self, session: SessionRecord) -> None:
        """Create-only: a backup is staged once; a second start must resume instead."""
        key = session_key(self.ref)
        session.check(self.ref, key)
        try:
            self.store.put(key, session.to_bytes(), create_only=True)
        except AlreadyExistsError:
            raise AlreadyExistsError(f"{self.ref} already has a staging session in {self.store.url}; continue it with --resume {self.ref}") from None

    # -- segments ------------------------------------------------------------
    def read_segment_records(self, session: SessionRecord) -> list[SegmentRecord]:
        """Every record, each checked against the session, sorted by (input, segment)."""
        records = [self._segment_record(session, info.key) for info in self.store.list(staging_key(self.ref, SEGMENT_RECORDS))]
        return sorted((r for r in records if r is not None), key=lambda r: (r.input_index, r.segment))

    def read_segment_record(self, session: SessionRecord, input_index: int, segment: int) -> SegmentRecord | None:
        """One record by its key, checked as read_segment_records checks each; None until the agent wrote it.

        The planner reads records this way, one past its cursor per input, so
        what it reads grows with what is new, not with the backup."""
        return self._segment_record(session, segment_record_key(self.ref, input_index, segment))

    def _segment_record(self, session: SessionRecord, key: str) -> SegmentRecord | None:
        """The record at `key`, checked to be that segment's and the session's (None: not there, or deleted since a LIST)."""
        record = self._read(key, SegmentRecord.from_bytes)
        if record is None:
            return None
        if key != segment_record_key(self.ref, record.input_index, record.segment):
            raise IntegrityError(f"segment record {key} describes in{record.input_index}/seg{record.segment}, not its own segment")
        record.check(self.ref, session)
        return record

    def write_segment_record(self, record: SegmentRecord) -> None:
        self.store.put(segment_record_key(self.ref, record.input_index, record.segment), record.to_bytes())

    def segment_objects(self) -> list[tuple[int, int, ObjectInfo]]:
        """Completed segment objects as (input, segment, info), recorded or not (a resume needs both)."""
        listed = ((parse_segment_key(self.ref, info.key), info) for info in self.store.list(staging_key(self.ref, SEGMENTS)))
        return [(*parsed, info) for parsed, info in listed if parsed is not None]

    # -- stream end ----------------------------------------------------------
    def read_stream_end(self) -> StreamEnd | None:
        """None until the agent saw every input end."""
        return self._read(stream_end_key(self.ref), StreamEnd.from_bytes)

    def write_stream_end(self, end: StreamEnd) -> None:
        self.store.put(stream_end_key(self.ref), end.to_bytes())

    # -- captured members and the parent's values (braid.format.staging.chain) --
    def write_captured(self, members: Mapping[str, bytes]) -> None:
        """The members the stream carried, each its own object, then their index (what Finalize looks for)."""
        from braid.format.staging.chain import CapturedIndex

        index = CapturedIndex.of(members)
        for number, name in enumerate(index.names):
            self.store.put(captured_member_key(self.ref, number), members[name])
        self.store.put(staging_key(self.ref, CAPTURED), index.to_bytes())

    def read_captured(self) -> dict[str, bytes]:
        """The staged members, each checked against its index; empty when the agent staged none."""
        from braid.format.staging.chain import CapturedIndex

        index = self._read(staging_key(self.ref, CAPTURED), CapturedIndex.from_bytes)
        if index is None:
            return {}
        keys = [captured_member_key(self.ref, number) for number in range(len(index.names))]
        found: dict[str, bytes] = {}
        for name, member_key, data in zip(index.names, keys, self._get_many(keys), strict=True):
            if data is None:
                raise IntegrityError(f"staged captured member {member_key} ({name}) of {self.ref} is missing")
            found[name] = index.check(name, data, member_key)
        return found

    def write_parent(self, record: ParentRecord, manifest: bytes | None = None) -> None:
        """Prepare's answer for an incremental: the parent's backup_manifest first, then the record naming it."""
        if manifest is not None:
            self.store.put(staging_key(self.ref, PARENT_MANIFEST), manifest)
        self.store.put(staging_key(self.ref, PARENT), record.to_bytes())

    def read_parent(self) -> tuple[ParentRecord, bytes | None] | None:
        """Prepare's answer and the parent's backup_manifest (checked against it); None until Prepare wrote it."""
        from braid.format.staging.chain import ParentRecord

        record = self._read(staging_key(self.ref, PARENT), ParentRecord.from_bytes)
        if record is None:
            return None
        if record.manifest is None:
            return record, None
        manifest_key = staging_key(self.ref, PARENT_MANIFEST)
        data = self._get(manifest_key)
        if data is None:
            raise IntegrityError(f"the parent's backup_manifest of {self.ref} is missing from staging ({manifest_key})")
        return record, record.check_manifest(data, manifest_key)

    # -- the agent's lease ---------------------------------------------------
    def read_agent_lease(self) -> bytes | None:
        """The agent's heartbeat as stored (None if it keeps none): a change is progress."""
        return self._get(agent_lease_key(self.ref))

    # -- the sleeping pipeline's wake record ----------------------------------
    def read_wake(self) -> WakeRecord | None:
        """The token the sleeping pipeline left for the agent (None: it is not sleeping, or never slept)."""
        return self._read(wake_key(self.ref), WakeRecord.from_bytes)

    # -- data key ------------------------------------------------------------
    def read_wrapped_key(self, repository_id: str) -> WrappedKey | None:
        """The staged wrapped key, checked to be bound to this backup; None before Prepare ran."""
        from braid.format.keys import WrappedKey, encryption_context

        key = staging_key(self.ref, WRAPPED_KEY)
        raw = self._get(key)
        if raw is None:
            return None
        try:
            wrapped = WrappedKey.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise IntegrityError(f"staged data key {key} of {self.ref} is malformed: {exc}") from None
        if wrapped.context != encryption_context(repository_id, str(self.ref)):
            raise IntegrityError(f"staged data key of {self.ref} is bound to {wrapped.context}, not to this backup")
        return wrapped

    def write_wrapped_key(self, wrapped: WrappedKey) -> WrappedKey:
        """Create-only, so every worker of a backup uses one key: a racing writer's key wins and is returned."""
        from braid.format.keys import encryption_context

        repository_id = wrapped.context.get("braid:repository", "")
        if wrapped.context != encryption_context(repository_id, str(self.ref)):
            raise IntegrityError(f"refusing to stage a data key bound to {wrapped.context} for {self.ref}")
        try:
            self.store.put(staging_key(self.ref, WRAPPED_KEY), canonical_json(wrapped.to_json()), create_only=True)
            return wrapped
        except AlreadyExistsError:
            winner = self.read_wrapped_key(repository_id)
            if winner is None:
                raise IntegrityError(f"the staged data key of {self.ref} vanished after a racing write: its staging is being removed") from None
            return winner

    # -- plan rounds ---------------------------------------------------------
    def read_rounds(self, known: list[Round] | None = None) -> list[Round]:
        """Every round so far, checked to chain: round N's indexes follow round N-1's.

        `known`: rounds read before (rounds are written once, never changed), so
        a poll GETs only the new ones: the agent's progress reads each round once."""
        from braid.format.staging.rounds import Round

        rounds = list(known or [])
        have = {r.number for r in rounds}
        numbered = [
            (number, info.key)
            for info in self.store.list(staging_key(self.ref, ROUNDS))
            if (number := parse_round_key(self.ref, info.key)) is not None and number not in have
        ]
        for (number, key), raw in zip(numbered, self._get_many([key for _, key in numbered]), strict=True):
            if raw is not None:
                rounds.append(Round.from_bytes(raw, number, key))
        rounds.sort(key=lambda r: r.number)
        next_index = 0
        for expected, found in enumerate(rounds, start=1):
            if found.number != expected:
                raise IntegrityError(f"plan rounds of {self.ref} skip from {expected - 1} to {found.number}")
            for item in found.items:
                if item.finishes_cut:
                    continue  # a cut item's last packs, planned again (MapItem.layout): no new indexes
                if item.first_index != next_index:
                    raise IntegrityError(f"plan round {found.key} of {self.ref} starts chunk indexes at {item.first_index}, expected {next_index}")
                next_index = item.end_index
        return rounds

    def write_round(self, number: int, items: Iterable[MapItem]) -> Round:
        """Persist round `number` create-only; a round already there wins and is adopted."""
        from braid.format.staging.rounds import Round

        found = Round(number, round_key(self.ref, number), tuple(items))
        try:
            self.store.put(found.key, found.to_bytes(), create_only=True)
            return found
        except AlreadyExistsError:
            return Round.from_bytes(self.store.get(found.key), number, found.key)

    # -- retries -------------------------------------------------------------
    def read_items(self, key: str, number: int) -> list[MapItem]:
        """The items of a round or retry file, as the map read them."""
        from braid.format.staging.rounds import Round

        return list(Round.from_bytes(self.store.get(key), number, key).items)

    def write_retry(self, round_number: int, attempt: int, items: Iterable[MapItem]) -> Round:
        """Items of a round planned again (same chunk indexes); overwrites: a retried planner writes the same."""
        from braid.format.staging.rounds import Round

        found = Round(round_number, retry_key(self.ref, round_number, attempt), tuple(items))
        self.store.put(found.key, found.to_bytes())
        return found

    def remove_segments(self, keys: Iterable[str], purge: Callable[[str], object] | None = None) -> None:
        """Staged segments whose every chunk is stored: their raw bytes need not wait for Finalize.

        `purge(key)` removes every version of exactly that object (S3: deletes by version id, so
        a versioned bucket keeps neither a noncurrent copy nor a delete marker); without it, a
        plain delete (a store that keeps no versions)."""
        doomed = sorted(set(keys))
        if purge is None:
            self.store.delete(doomed)
            return
        for key in doomed:
            purge(key)

    # -- hold and resume -----------------------------------------------------
    def write_hold(self, hold: HoldRecord) -> None:
        self.store.put(staging_key(self.ref, HELD), hold.to_bytes())

    def read_hold(self) -> HoldRecord | None:
        from braid.format.staging.holds import HoldRecord

        return self._read(staging_key(self.ref, HELD), HoldRecord.from_bytes)

    def clear_hold(self) -> None:
        self.store.delete([staging_key(self.ref, HELD)])

    def write_resume_request(self, request: ResumeRequest) -> None:
        self.store.put(staging_key(self.ref, RESUME), request.to_bytes())

    def request_resume(self, nonce: str) -> None:
        """`braid backup --resume`'s request (a new nonce) that releases a hold: the pipeline plans the unfinished items again."""
        from braid.format.staging.holds import ResumeRequest

        self.write_resume_request(ResumeRequest(nonce))

    def read_resume_request(self) -> ResumeRequest | None:
        from braid.format.staging.holds import ResumeRequest

        return self._read(staging_key(self.ref, RESUME), ResumeRequest.from_bytes)

    # -- failures ------------------------------------------------------------
    def write_failure(self, failure: ItemFailure) -> str:
        """A worker's error for one item; a retry's failure overwrites its earlier attempt's."""
        key = failure_key(self.ref, failure.first_index)
        self.store.put(key, failure.to_bytes())
        return key

    def first_failure(self) -> ItemFailure | None:
        """The failure of the lowest item that never stored a result (a retry that then succeeded is no failure);
        None when no worker recorded one. A malformed record is skipped: this only explains a failure."""
        from braid.format.staging.holds import ItemFailure

        done = {info.key for info in self.store.list(staging_key(self.ref, RESULTS))}
        for info in sorted(self.store.list(staging_key(self.ref, FAILURES)), key=lambda i: i.key):
            raw = self._get(info.key)
            if raw is None:
                continue
            try:
                failure = ItemFailure.from_bytes(raw, info.key)
            except IntegrityError:
                continue
            if info.key == failure_key(self.ref, failure.first_index) and result_key(self.ref, failure.first_index) not in done:
                return failure
        return None

    # -- removal -------------------------------------------------------------
    def remove(self, janitor: StagingJanitor) -> int:
        """Abort stray multipart uploads, delete every staging object, then purge
        the versions a versioned bucket keeps of them; returns objects deleted.

        The session record goes first, on its own: an agent resuming meanwhile
        that still finds it after its other reads read staging whole
        (braid.agent.resume.load_staged checks it last)."""
        janitor.abort_uploads(self.prefix)
        keys = [info.key for info in self.store.list(self.prefix)]
        first = [key for key in keys if key == session_key(self.ref)]
        self.store.delete(first)
        self.store.delete([key for key in keys if key not in first])
        janitor.purge_versions(self.prefix)
        # Its planner's registrations beside it (braid.pipeline.account_budget), when it did not end "done".
        running = [info.key for info in self.store.list(running_prefix(self.ref))]
        self.store.delete(running)
        if running:
            janitor.purge_versions(running_prefix(self.ref))
        return len(keys) + len(running)
