"""StagingResults: how one backup's staging is read, its worker results and the planner's results index of them.

A missing record reads as None (callers decide whether that is an error);
many small records are read READ_THREADS at once, in the order asked, each
read counted for the step that asked (braid.ports.usage). A worker's result
(ItemResult) and the planner's merge of them after each map (RoundFold: the
results index) are checked against the planned items by one reader,
`read_results`: Finalize gets every chunk's entry or an IntegrityError
naming the first chunk without one. The base of StagingArea.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from braid.errors import IntegrityError, NotFoundError
from braid.format.ids import BackupRef
from braid.format.layout import staging_prefix
from braid.format.staging.keys import FOLDS, fold_key, result_key, staging_key
from braid.ports.usage import in_context

if TYPE_CHECKING:
    # Results and the plan are the pipeline's and a waiting agent's, imported where read or written:
    # an agent that only stages never loads them (docs/design/agent-startup.md).
    from braid.format.manifest import ChunkEntry
    from braid.format.staging.rounds import ItemResult, MapItem, Round
    from braid.format.usage import Usage
    from braid.ports.store import ObjectStore

# Records read at once by _get_many; the thread name lets a counting store tell parallel reads apart.
READ_THREADS = 32
READ_THREAD_NAME = "braid-staging-read"

T = TypeVar("T")


class StagingResults:
    """One backup's staging in a store, how its records are read (one, or many at once), and its result records and
    results index (folds): written, read back and checked."""

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

    def _read(self, key: str, parse: Callable[[bytes, str], T]) -> T | None:
        """The record at `key` as `parse(raw, key)` reads it; None when there is none."""
        raw = self._get(key)
        return None if raw is None else parse(raw, key)

    def _get_many(self, keys: list[str]) -> list[bytes | None]:
        """Several small records at once (READ_THREADS in flight, not one request's latency after another), in the order asked."""
        if len(keys) <= 1:
            return [self._get(key) for key in keys]
        with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(keys)), thread_name_prefix=READ_THREAD_NAME) as pool:
            return list(pool.map(in_context(self._get), keys))  # the reads count for the step that asked (braid.ports.usage)

    # -- results -------------------------------------------------------------
    def write_result(self, result: ItemResult) -> str:
        """Overwrites are fine: a retried worker reports the same stored chunks (store_chunk reads them back)."""
        key = result_key(self.ref, result.first_index)
        self.store.put(key, result.to_bytes())
        return key

    def read_results(self, rounds: Iterable[Round], usages: list[Usage] | None = None) -> list[ChunkEntry]:
        """Every planned chunk's entry, checked against its item; an error names the first chunk without one.

        Each item's result comes from the results index (the folds: a LIST and a GET per map), else from its own
        record (one GET per item no fold covers), and is checked against its planned item either way. `usages`, if
        given, receives each result's usage (those that have one)."""
        from braid.format.staging.rounds import ItemResult

        items = [item for found in rounds for item in found.items]
        known = self._read_folds()
        missing = [item for item in items if item.first_index not in known]
        keys = [result_key(self.ref, item.first_index) for item in missing]
        for item, key, raw in zip(missing, keys, self._get_many(keys), strict=True):
            if raw is not None:  # else _item_results names the first chunk without a result
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
        """The results that store `item`'s chunks, in order, each checked against the chunks it covers: its own, and,
        after a cut one, those of the items that finished it (whole packs of its layout), followed by first chunk
        index wherever they were planned and read directly when no fold holds them.

        When none starts where the prefix the planner folded ends, the item's own record may list more (a later
        attempt stored further: a planner call retried after a late attempt); its entries are the same stored packs
        (create-only, identical layout), so only the rest is used."""
        from braid.format.staging.rounds import ItemResult

        found: list[ItemResult] = []
        done = 0
        while done < item.count:
            rest = item.piece(done, item.count - done)
            result = known.get(rest.first_index) or self._result(rest.first_index)
            if result is None and done and (own := self._result(item.first_index)) is not None and len(own.entries) > done:
                own.check(item, str(self.ref))
                result = ItemResult(rest.first_index, own.entries[done:], None)
            if result is None:
                raise IntegrityError(
                    f"chunks {rest.first_index}..{rest.end_index - 1} of backup {self.ref} were never stored:"
                    " their worker failed or did not run (see the execution's map run)"
                )
            result.check(rest, str(self.ref))
            found.append(result)
            done += len(result.entries)
        return found

    def _result(self, index: int) -> ItemResult | None:
        from braid.format.staging.rounds import ItemResult

        return self._read(result_key(self.ref, index), ItemResult.from_bytes)

    def read_item_results(self, items: Iterable[MapItem]) -> dict[int, ItemResult]:
        """The result records of `items` that exist, read back and match their item, by first chunk index.

        Anything else is left out: Finalize reads that item's record itself and refuses it there."""
        from braid.format.staging.rounds import ItemResult

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
        """Add the result records of a map's finished items to the results index as one fold; returns its key (None: nothing to fold).

        Only records that read back and match their item go in (read_item_results;
        `read`: those already read). Overwrites are fine: a retried planner folds
        the same records, and a late worker's record describes the same stored
        chunks, or, for a cut item, a prefix of them: the fold keeps the one the
        planner planned the rest after (braid.pipeline.replan)."""
        from braid.format.staging.rounds import RoundFold

        finished = list(finished)
        read = read if read is not None else self.read_item_results(finished)
        results = [read[item.first_index] for item in finished if item.first_index in read]
        if not results:
            return None
        key = fold_key(self.ref, round_number, attempt)
        self.store.put(key, RoundFold(round_number, attempt, tuple(results)).to_bytes())
        return key

    def _read_folds(self) -> dict[int, ItemResult]:
        """The results of every fold, by first chunk index (a malformed fold is an IntegrityError naming it)."""
        from braid.format.staging.rounds import RoundFold

        keys = sorted(info.key for info in self.store.list(staging_key(self.ref, FOLDS)))
        folded: dict[int, ItemResult] = {}
        for key, raw in zip(keys, self._get_many(keys), strict=True):
            if raw is None:  # deleted between LIST and GET: staging is being removed
                continue
            for result in RoundFold.from_bytes(raw, key).results:
                folded[result.first_index] = result
        return folded

    def processed_chunks(self, rounds: Iterable[Round]) -> int:
        """Chunks with a result so far (the agent's progress): one LIST, no GET.

        A cut item (MapItem.cut) counts whole once its worker wrote its result, and the items that finish it
        are not counted again: progress may run a pack or two ahead at the very end, never past the plan."""
        finished, _ = self.finished_items(item for found in rounds for item in found.items if not item.finishes_cut)
        return sum(item.count for item in finished)

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
        stored = [key in present for key in keys]
        finished = [item for item, done in zip(items, stored, strict=True) if done]
        return finished, [item for item, done in zip(items, stored, strict=True) if not done]
