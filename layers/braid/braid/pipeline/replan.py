"""Failure keeps finished work: items without a result are planned again, then held for `--resume`.

The Plan call after each map checks the map's items file itself (the map
tolerates failed items): an item is finished when its result record
exists. Its staged segments whose chunks are all stored are deleted at
once (`--resume` trusts segment records, not the objects); the finished
results are folded into the results index while the stream arrives
(`fold`; cut results always: docs/design/2026-11-28-results-index.md);
unfinished items are planned again `MAX_REPLANS` times (each item already
had its worker's retries inside its EXPRESS child); then the backup is
*held*: a HoldRecord names the first failed worker's error, and the
execution waits up to `HOLD_SECONDS` for a ResumeRequest
(`braid backup --resume NAME@ID`) that plans them again. The end of the
hold, or an abandon, fails the execution and Cleanup removes the backup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from braid.errors import BackupError
from braid.format.staging import HoldRecord, MapItem, StagingArea
from braid.format.timestamps import format_timestamp
from braid.pipeline.plan_cursor import PlanCursor

MAX_REPLANS = 2
HOLD_SECONDS = 24 * 3600.0


class BackupHeldError(BackupError):
    """Items kept failing, and no `--resume` came before the hold ended: the backup is given up."""


def _when(epoch: float) -> str:
    return format_timestamp(datetime.fromtimestamp(epoch, UTC))


def check_of(key: str, round_number: int, attempt: int = 0, limit: int = MAX_REPLANS) -> dict[str, Any]:
    return {"key": key, "round": round_number, "attempt": attempt, "limit": limit}


@dataclass(frozen=True)
class MapChecked:
    """What checking the last map found: the cursor after it, and what is left to map."""

    state: PlanCursor
    again: list[MapItem] | None = None  # to map again now (a retry file of the same round); None: nothing
    remainders: tuple[MapItem, ...] = ()  # what cut items left: for the next round, which the same call plans


def check_last_map(area: StagingArea, state: PlanCursor, now: float, *, fold: bool = True, purge: Callable[[str], object] | None = None) -> MapChecked:
    """Check the last map's items: fold the finished items' results (unless `fold` is False), find what cut items
    left, re-plan unfinished items, and hold the backup (write the HoldRecord) when the re-plans are spent.

    What a cut item (MapItem.cut) left comes back as `remainders`, in its
    pack layout, for the final round the same Plan call plans; its cut
    result is folded even after stream end, so Finalize reads exactly the
    prefix planned after. With unfinished items, the remainders join their
    retry file.
    """
    check = state.check
    if check is None or state.held is not None:  # held: watch_hold decides
        return MapChecked(state)
    number, attempt, limit = int(check["round"]), int(check["attempt"]), int(check["limit"])
    items = area.read_items(str(check["key"]), number)
    finished, unfinished = area.finished_items(items)
    may_be_cut = [item for item in finished if item.cut]
    read = area.read_item_results(finished if fold else may_be_cut)
    cut = [item for item in may_be_cut if (result := read.get(item.first_index)) is not None and result.is_cut(item)]
    remainders = tuple(item.remainder(len(read[item.first_index].entries)) for item in cut)
    pending = {item.segment for item in [*unfinished, *remainders]}
    if fold or cut:
        area.fold_results(number, attempt, finished if fold else cut, read)
    area.remove_segments((item.segment for item in finished if item.segment not in pending), purge)
    if not unfinished:
        return MapChecked(replace(state, check=None), None, remainders)
    again = [*unfinished, *remainders]
    if attempt < limit:
        retry = area.write_retry(number, attempt + 1, again)
        return MapChecked(replace(state, check=check_of(retry.key, number, attempt + 1, limit)), again)
    failure = area.first_failure()
    first = min(unfinished, key=lambda i: i.first_index)
    cause = failure.describe() if failure is not None else f"chunks {first.first_index}..{first.end_index - 1}: no result after every retry"
    if remainders:
        # A resume maps the unfinished items of the checked file again, so the remainders join that file: held, the
        # re-plans are spent (attempt = limit >= 1), so it is this round's retry file of `attempt`, never its round file.
        area.write_retry(number, attempt, [*items, *remainders])
    return MapChecked(_hold(area, state, now, cause, len(unfinished)))


def _hold(area: StagingArea, state: PlanCursor, now: float, cause: str, items: int) -> PlanCursor:
    """Write the HoldRecord (`items` unfinished; 0: a step failed) and the cursor that watches it; a resume request
    already there does not release it (its nonce is the hold's `released_by`)."""
    request = area.read_resume_request()
    released_by = request.nonce if request is not None else ""
    until = now + HOLD_SECONDS
    area.write_hold(HoldRecord(cause, _when(now), _when(until), released_by, items))
    return replace(state, held={"until": until, "released_by": released_by})


def hold_after_failure(area: StagingArea, state: PlanCursor, now: float, step: str, error: str, message: str) -> PlanCursor:
    """A coordinating step (PlanSegments, ProcessChunks, Finalize) failed after Prepare: hold the backup, as for items.

    The HoldRecord names the step and its error; a resume continues from the
    cursor. Errors that say the backup can never finish (an abandoned stream,
    an ended hold, a stalled agent, a misnamed execution) skip the hold: the
    state machine sends those to Cleanup."""
    return _hold(area, state, now, f"{step} failed: {error}: {message}", 0)


def watch_hold(area: StagingArea, state: PlanCursor, now: float) -> tuple[PlanCursor, list[MapItem] | None]:
    """While held: a new resume request releases the hold and returns the unfinished items; the hold's end raises."""
    held, check = state.held, state.check
    if held is None:
        return state, None
    request = area.read_resume_request()
    if request is not None and request.nonce != held["released_by"]:
        # Released. A coordinator's hold, or one after its map finished, has nothing to map again: the planner carries
        # on from its cursor.
        unfinished = area.finished_items(area.read_items(str(check["key"]), int(check["round"])))[1] if check is not None else []
        area.clear_hold()
        if not unfinished or check is None:
            return replace(state, held=None, check=None, progress=now), None
        attempt = int(check["attempt"]) + 1
        retry = area.write_retry(int(check["round"]), attempt, unfinished)
        return replace(state, held=None, check=check_of(retry.key, int(check["round"]), attempt, attempt + MAX_REPLANS)), unfinished
    if now >= float(held["until"]):
        hold = area.read_hold()
        cause = hold.cause if hold is not None else "workers kept failing"
        raise BackupHeldError(
            f"backup {area.ref} was held {HOLD_SECONDS / 3600:.0f} h for 'braid backup --resume {area.ref}' after"
            f" {'workers kept failing' if hold is None or hold.items else 'a pipeline step failed'} ({cause}); nobody resumed it, so it is removed"
        )
    return state, None
