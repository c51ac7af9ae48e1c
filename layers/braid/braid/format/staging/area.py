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
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from braid.errors import AlreadyExistsError, IntegrityError, NotFoundError
from braid.format.canonical import canonical_json
from braid.format.ids import BackupRef
from braid.format.keys import WrappedKey, encryption_context
from braid.format.layout import staging_prefix
from braid.format.manifest import ChunkEntry
from braid.format.staging.failures import ItemFailure
from braid.format.staging.hold import HoldRecord, ResumeRequest
from braid.format.staging.keys import (
    agent_lease_key,
    compaction_key,
    compactions_prefix,
    failure_key,
    failures_prefix,
    fold_key,
    folds_prefix,
    held_key,
    parse_compaction_key,
    parse_fold_round,
    parse_round_key,
    parse_segment_key,
    result_key,
    results_prefix,
    resume_key,
    retry_key,
    round_key,
    rounds_prefix,
    segment_record_key,
    segment_records_prefix,
    segments_prefix,
    session_key,
    stream_end_key,
    wake_key,
    wrapped_key_key,
)
from braid.format.staging.records import SegmentRecord, SessionRecord, StreamEnd
from braid.format.staging.rounds import ItemResult, MapItem, Round, RoundFold, RoundsCompaction
from braid.format.staging.wake import WakeRecord
from braid.format.usage import Usage
from braid.ports.pipeline import StagingJanitor
from braid.ports.store import ObjectInfo, ObjectStore
from braid.ports.usage import in_context

# Records read at once by _get_many; the thread name lets a counting store tell parallel reads apart.
READ_THREADS = 32
READ_THREAD_NAME = "braid-staging-read"


class StagingArea:
    """One backup's staging area in a store: every record read and written here."""

    def __init__(self, store: ObjectStore, ref: BackupRef) -> None:
        self.store = store
        self.ref = ref

    @property
    def prefix(self) -> str:
        """Repository-relative prefix of every object of this backup's staging."""
        return staging_prefix(self.ref)

    def _get(self, key: str) -> bytes | None:
        try:
            return self.store.get(key)
        except NotFoundError:
            return None

    def _get_many(self, keys: list[str]) -> list[bytes | None]:
        """Several small records at once (READ_THREADS in flight), in the order asked.

        Finalize reads one result record per map item and one file per round:
        thousands for a 10 TiB backup, which one at a time would take minutes
        of request latency; READ_THREADS at once make it seconds."""
        if len(keys) <= 1:
            return [self._get(key) for key in keys]
        with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(keys)), thread_name_prefix=READ_THREAD_NAME) as pool:
            return list(pool.map(in_context(self._get), keys))  # the reads count for the step that asked (braid.ports.usage)

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
        records = []
        for info in self.store.list(segment_records_prefix(self.ref)):
            raw = self._get(info.key)
            if raw is None:  # deleted between LIST and GET: staging is being removed
                continue
            record = SegmentRecord.from_bytes(raw, info.key)
            if info.key != segment_record_key(self.ref, record.input_index, record.segment):
                raise IntegrityError(f"segment record {info.key} describes in{record.input_index}/seg{record.segment}, not its own segment")
            record.check(self.ref, session)
            records.append(record)
        return sorted(records, key=lambda r: (r.input_index, r.segment))

    def read_segment_record(self, session: SessionRecord, input_index: int, segment: int) -> SegmentRecord | None:
        """One record by its key, checked as read_segment_records checks each; None until the agent wrote it.

        The planner reads records this way, one past its cursor per input, so
        what it reads grows with what is new, not with the backup."""
        key = segment_record_key(self.ref, input_index, segment)
        raw = self._get(key)
        if raw is None:
            return None
        record = SegmentRecord.from_bytes(raw, key)
        if (record.input_index, record.segment) != (input_index, segment):
            raise IntegrityError(f"segment record {key} describes in{record.input_index}/seg{record.segment}, not its own segment")
        record.check(self.ref, session)
        return record

    def write_segment_record(self, record: SegmentRecord) -> None:
        self.store.put(segment_record_key(self.ref, record.input_index, record.segment), record.to_bytes())

    def segment_objects(self) -> list[tuple[int, int, ObjectInfo]]:
        """Completed segment objects as (input, segment, info), recorded or not (a resume needs both)."""
        found = []
        for info in self.store.list(segments_prefix(self.ref)):
            parsed = parse_segment_key(self.ref, info.key)
            if parsed is not None:
                found.append((*parsed, info))
        return found

    # -- stream end ----------------------------------------------------------
    def read_stream_end(self) -> StreamEnd | None:
        """None until the agent saw every input end."""
        key = stream_end_key(self.ref)
        raw = self._get(key)
        return None if raw is None else StreamEnd.from_bytes(raw, key)

    def write_stream_end(self, end: StreamEnd) -> None:
        self.store.put(stream_end_key(self.ref), end.to_bytes())

    # -- the agent's lease ---------------------------------------------------
    def read_agent_lease(self) -> bytes | None:
        """The agent's heartbeat as stored (None if it keeps none): a change is progress."""
        return self._get(agent_lease_key(self.ref))

    # -- the sleeping pipeline's wake record ----------------------------------
    def read_wake(self) -> WakeRecord | None:
        """The token the sleeping pipeline left for the agent (None: it is not sleeping, or never slept)."""
        key = wake_key(self.ref)
        raw = self._get(key)
        return None if raw is None else WakeRecord.from_bytes(raw, key)

    # -- data key ------------------------------------------------------------
    def read_wrapped_key(self, repository_id: str) -> WrappedKey | None:
        """The staged wrapped key, checked to be bound to this backup; None before Prepare ran."""
        key = wrapped_key_key(self.ref)
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
        repository_id = wrapped.context.get("braid:repository", "")
        if wrapped.context != encryption_context(repository_id, str(self.ref)):
            raise IntegrityError(f"refusing to stage a data key bound to {wrapped.context} for {self.ref}")
        try:
            self.store.put(wrapped_key_key(self.ref), canonical_json(wrapped.to_json()), create_only=True)
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
        rounds = list(known or [])
        have = {r.number for r in rounds}
        numbered = [
            (number, info.key)
            for info in self.store.list(rounds_prefix(self.ref))
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
        found = Round(number, round_key(self.ref, number), tuple(items))
        try:
            self.store.put(found.key, found.to_bytes(), create_only=True)
            return found
        except AlreadyExistsError:
            return Round.from_bytes(self.store.get(found.key), number, found.key)

    # -- results -------------------------------------------------------------
    def write_result(self, result: ItemResult) -> str:
        """Overwrites are fine: a retried worker reports the same stored chunks (store_chunk reads them back)."""
        key = result_key(self.ref, result.first_index)
        self.store.put(key, result.to_bytes())
        return key

    def read_compactions(self) -> tuple[list[Round], dict[int, ItemResult]]:
        """The rounds the planner's compactions hold, from round 1 on, and their items' results by first chunk index.

        Only an unbroken run from round 1 is used (what follows a gap is read
        from the round files and folds): `read_rounds(known=...)` then GETs
        only the rounds after it, and `read_results(compacted=...)` only the
        folds and records of those."""
        chain = self._compaction_chain()
        keys = [compaction_key(self.ref, first, last) for first, last in chain]
        rounds: list[Round] = []
        results: dict[int, ItemResult] = {}
        for span, key, raw in zip(chain, keys, self._get_many(keys), strict=True):
            if raw is None:  # deleted between LIST and GET: staging is being removed; the rest comes from rounds and folds
                break
            found = RoundsCompaction.from_bytes(raw, key, lambda number: round_key(self.ref, number))
            if (found.first, found.last) != span:
                raise IntegrityError(f"rounds compaction {key} holds rounds {found.first}..{found.last}, not the ones its name says")
            rounds.extend(found.rounds)
            results.update((result.first_index, result) for result in found.results)
        return rounds, results

    def compacted_through(self) -> int:
        """The last round of the unbroken run of compactions from round 1 (0: none); one LIST, no GET."""
        chain = self._compaction_chain()
        return chain[-1][1] if chain else 0

    def _compaction_chain(self) -> list[tuple[int, int]]:
        ranges = sorted(
            found for info in self.store.list(compactions_prefix(self.ref)) if (found := parse_compaction_key(self.ref, info.key)) is not None
        )
        chain: list[tuple[int, int]] = []
        for first, last in ranges:
            if first == (chain[-1][1] + 1 if chain else 1) and last >= first:
                chain.append((first, last))
        return chain

    def compact_rounds(self, first: int, last: int, max_chunks: int) -> int:
        """Merge rounds `first`.. (up to `last`, and no more than `max_chunks` chunks but at least one round) with a
        checked result for each of their items into one compaction; returns the last round it took.

        Nothing is written when some item has no result that reads back and
        matches it: Finalize then reads those rounds' files and records
        itself, and refuses what is wrong there. `max_chunks` bounds the
        planner's memory (a result is ~1 KiB in memory per chunk).
        Overwrites are fine: rounds never change, and a later result
        describes the same stored chunks."""
        numbers = list(range(first, last + 1))
        round_keys = [round_key(self.ref, number) for number in numbers]
        rounds: list[Round] = []
        chunks = 0
        for number, key, raw in zip(numbers, round_keys, self._get_many(round_keys), strict=True):
            if raw is None:  # not a round of the ledger (yet): what came before it is compacted, it is passed over
                if not rounds:
                    return number
                break
            found = Round.from_bytes(raw, number, key)
            if rounds and chunks + found.chunk_count > max_chunks:
                break
            rounds.append(found)
            chunks += found.chunk_count
        taken = rounds[-1].number
        fold_keys = sorted(
            info.key for info in self.store.list(folds_prefix(self.ref)) if first <= (parse_fold_round(self.ref, info.key) or 0) <= taken
        )
        items = [item for found in rounds for item in found.items]
        wanted = {item.first_index for item in items}
        results: dict[int, ItemResult] = {}
        for key, raw in zip(fold_keys, self._get_many(fold_keys), strict=True):
            if raw is not None:
                results.update((r.first_index, r) for r in RoundFold.from_bytes(raw, key).results if r.first_index in wanted)
        missing = [item for item in items if item.first_index not in results]
        keys = [result_key(self.ref, item.first_index) for item in missing]
        for item, key, raw in zip(missing, keys, self._get_many(keys), strict=True):
            if raw is None:
                return taken
            try:
                results[item.first_index] = ItemResult.from_bytes(raw, key)
            except IntegrityError:
                return taken
        try:
            for item in items:
                results[item.first_index].check(item, str(self.ref))
        except IntegrityError:
            return taken
        compaction = RoundsCompaction(first, taken, tuple(rounds), tuple(results[item.first_index] for item in items))
        self.store.put(compaction_key(self.ref, first, taken), compaction.to_bytes())
        return taken

    def read_results(
        self, rounds: Iterable[Round], usages: list[Usage] | None = None, *, compacted: dict[int, ItemResult] | None = None
    ) -> list[ChunkEntry]:
        """Every planned chunk's entry, checked against its item; an error names the first chunk without one.

        Each item's result comes from `compacted` (read_compactions), else
        from a fold (RoundFold: the planner merged it after the item's map),
        else from the item's own record: a few compaction and fold GETs, plus
        one per item none covers (the last round's, whose planner call was
        the one that said "done"). A result from a compaction or a fold is
        checked against its planned item exactly as a record is. `usages`,
        if given, receives each result's usage (those that have one)."""
        rounds = list(rounds)
        items = [item for found in rounds for item in found.items]
        compacted = compacted or {}
        through = 0  # rounds 1..through are wholly in `compacted`: their folds need no GET
        for found in sorted(rounds, key=lambda r: r.number):
            if found.number != through + 1 or any(item.first_index not in compacted for item in found.items):
                break
            through = found.number
        known = {**self._read_folds(after_round=through), **compacted}
        missing = [item for item in items if item.first_index not in known]
        if missing:
            present = self._result_keys()
            for item in missing:
                if result_key(self.ref, item.first_index) not in present and not item.finishes_cut:
                    raise self._never_stored(item)
            # An item finishing a cut one without a record is for the cut item's chain to judge (_item_results).
            missing = [item for item in missing if result_key(self.ref, item.first_index) in present]
            keys = [result_key(self.ref, item.first_index) for item in missing]
            for item, key, raw in zip(missing, keys, self._get_many(keys), strict=True):
                if raw is None:
                    if item.finishes_cut:
                        continue
                    raise self._never_stored(item)
                known[item.first_index] = ItemResult.from_bytes(raw, key)
        entries: list[ChunkEntry] = []
        for item in items:
            if item.finishes_cut:
                continue  # its chunks are the cut item's, followed from that item below
            for result in self._item_results(item, known):
                entries.extend(result.entries)
                if usages is not None and result.usage is not None:
                    usages.append(result.usage)
        return entries

    def _item_results(self, item: MapItem, known: dict[int, ItemResult]) -> list[ItemResult]:
        """The results that store `item`'s chunks, in order: its own, and, after a cut one, the results of the items
        that finished it, each checked against its chunks of the item (whole packs of the item's layout).

        Those are followed by first chunk index, wherever they were planned (a later round, or a retry file), and
        read directly when no fold holds them: the cut result is the one the planner folded, so the rest start
        exactly where the planner planned them."""
        found: list[ItemResult] = []
        done = 0
        while done < item.count:
            index = item.first_index + done
            result = known.get(index)
            if result is None:
                raw = self._get(result_key(self.ref, index))
                if raw is None:
                    longer = self._longer_prefix(item, done)
                    if longer is None:
                        raise self._never_stored(item.piece(done, item.count - done))
                    found.append(longer)
                    done += len(longer.entries)
                    continue
                result = known[index] = ItemResult.from_bytes(raw, result_key(self.ref, index))
            if done == 0:
                result.check(item, str(self.ref))
            else:
                if not 0 < len(result.entries) <= item.count - done:
                    raise IntegrityError(
                        f"result for chunks {index}.. of {self.ref} lists {len(result.entries)} chunks, the rest of its cut item {item.count - done}"
                    )
                rest = item.piece(done, len(result.entries))
                result.check(rest, str(self.ref))
            found.append(result)
            done += len(result.entries)
        return found

    def _longer_prefix(self, item: MapItem, done: int) -> ItemResult | None:
        """The chunks of a cut item from `done` on, from its own record when that lists more than `done` (a later attempt
        that stored further than the prefix the planner read: a planner call retried after a late attempt), else None.

        Its entries before `done` are the same stored packs (create-only, identical layout), so only the rest is used."""
        raw = self._get(result_key(self.ref, item.first_index))
        if raw is None:
            return None
        own = ItemResult.from_bytes(raw, result_key(self.ref, item.first_index))
        if len(own.entries) <= done:
            return None
        own.check(item, str(self.ref))
        return ItemResult(item.first_index + done, own.entries[done:], None)

    def read_item_results(self, items: Iterable[MapItem]) -> dict[int, ItemResult]:
        """The result records of `items` that exist, read back and match their item, by first chunk index.

        Anything else is left out: Finalize reads that item's record itself and refuses it there."""
        items = list(items)
        keys = [result_key(self.ref, item.first_index) for item in items]
        found: dict[int, ItemResult] = {}
        for item, key, raw in zip(items, keys, self._get_many(keys), strict=True):
            if raw is None:
                continue
            try:
                result = ItemResult.from_bytes(raw, key)
                result.check(item, str(self.ref))
            except IntegrityError:
                continue
            found[item.first_index] = result
        return found

    def fold_results(self, round_number: int, attempt: int, finished: Iterable[MapItem], read: dict[int, ItemResult] | None = None) -> str | None:
        """Merge the result records of a map's finished items into one fold; returns its key (None: nothing to fold).

        Only records that read back and match their item go in (read_item_results;
        `read`: those already read). Overwrites are fine: a retried planner folds
        the same records, and a late worker's record describes the same stored
        chunks, or, for a cut item, a prefix of them: the fold keeps the one the
        planner planned the rest after (braid.pipeline.replan)."""
        finished = list(finished)
        read = read if read is not None else self.read_item_results(finished)
        results = [read[item.first_index] for item in finished if item.first_index in read]
        if not results:
            return None
        key = fold_key(self.ref, round_number, attempt)
        self.store.put(key, RoundFold(round_number, attempt, tuple(results)).to_bytes())
        return key

    def _read_folds(self, after_round: int = 0) -> dict[int, ItemResult]:
        """The results of every fold of a round after `after_round`, by first chunk index (a malformed fold is an IntegrityError naming it)."""
        keys = sorted(info.key for info in self.store.list(folds_prefix(self.ref)) if (parse_fold_round(self.ref, info.key) or 0) > after_round)
        folded: dict[int, ItemResult] = {}
        for key, raw in zip(keys, self._get_many(keys), strict=True):
            if raw is None:  # deleted between LIST and GET: staging is being removed
                continue
            for result in RoundFold.from_bytes(raw, key).results:
                folded[result.first_index] = result
        return folded

    def _never_stored(self, item: MapItem) -> IntegrityError:
        return IntegrityError(
            f"chunks {item.first_index}..{item.end_index - 1} of backup {self.ref} were never stored:"
            " their worker failed or did not run (see the execution's map run)"
        )

    def processed_chunks(self, rounds: Iterable[Round]) -> int:
        """Chunks with a result so far (the agent's progress): one LIST, no GET.

        A cut item (MapItem.cut) counts whole once its worker wrote its result, and the items that finish it
        are not counted again: progress may run a pack or two ahead at the very end, never past the plan."""
        present = self._result_keys()
        return sum(
            item.count for found in rounds for item in found.items
            if not item.finishes_cut and result_key(self.ref, item.first_index) in present
        )

    def _result_keys(self) -> set[str]:
        return {info.key for info in self.store.list(results_prefix(self.ref))}

    def read_items(self, key: str, number: int) -> list[MapItem]:
        """The items of a round or retry file, as the map read them."""
        return list(Round.from_bytes(self.store.get(key), number, key).items)

    def write_retry(self, round_number: int, attempt: int, items: Iterable[MapItem]) -> Round:
        """Items of a round planned again (same chunk indexes); overwrites: a retried planner writes the same."""
        found = Round(round_number, retry_key(self.ref, round_number, attempt), tuple(items))
        self.store.put(found.key, found.to_bytes())
        return found

    def finished_items(self, items: Iterable[MapItem]) -> tuple[list[MapItem], list[MapItem]]:
        """(finished, unfinished): by whether the item's result record exists.

        One LIST under the longest key prefix the items' result keys share:
        a few requests for a round, however many results the backup has."""
        items = list(items)
        if not items:
            return [], []
        keys = [result_key(self.ref, item.first_index) for item in items]
        prefix = os.path.commonprefix([min(keys), max(keys)])
        present = {info.key for info in self.store.list(prefix)}
        finished: list[MapItem] = []
        unfinished: list[MapItem] = []
        for item, key in zip(items, keys, strict=True):
            (finished if key in present else unfinished).append(item)
        return finished, unfinished

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
        self.store.put(held_key(self.ref), hold.to_bytes())

    def read_hold(self) -> HoldRecord | None:
        raw = self._get(held_key(self.ref))
        return None if raw is None else HoldRecord.from_bytes(raw, held_key(self.ref))

    def clear_hold(self) -> None:
        self.store.delete([held_key(self.ref)])

    def write_resume_request(self, request: ResumeRequest) -> None:
        self.store.put(resume_key(self.ref), request.to_bytes())

    def read_resume_request(self) -> ResumeRequest | None:
        raw = self._get(resume_key(self.ref))
        return None if raw is None else ResumeRequest.from_bytes(raw, resume_key(self.ref))

    # -- failures ------------------------------------------------------------
    def write_failure(self, failure: ItemFailure) -> str:
        """A worker's error for one item; a retry's failure overwrites its earlier attempt's."""
        key = failure_key(self.ref, failure.first_index)
        self.store.put(key, failure.to_bytes())
        return key

    def first_failure(self) -> ItemFailure | None:
        """The failure of the lowest item that never stored a result (a retry that then succeeded is no failure);
        None when no worker recorded one. A malformed record is skipped: this only explains a failure."""
        done = self._result_keys()
        for info in sorted(self.store.list(failures_prefix(self.ref)), key=lambda i: i.key):
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
        return len(keys)
