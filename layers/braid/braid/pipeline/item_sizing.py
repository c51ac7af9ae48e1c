"""How many chunks one Distributed Map item carries, and the cost model behind it.

At 64 MiB chunks a TiB is 16,384 chunks. What each *item* costs, whatever its
size (us-east-1 list prices):

- a child workflow execution: STANDARD children bill every state transition
  ($0.025 per 1,000; ~2 per item: the iteration and the Worker task, more on
  retries) = $0.82/TiB at one chunk per item, more than the compute. EXPRESS
  children bill $1 per million executions plus ~nothing for duration
  (64 MB, a few seconds) = $0.016/TiB; the stack uses EXPRESS children.
- a Lambda invoke ($0.20 per million) and a result record PUT ($0.005 per
  1,000 = $0.082/TiB at one chunk per item).

What each *chunk* costs whatever the grouping: its share of a pack PUT ($0.082/TiB
at one chunk per object; the worker stores CHUNKS_PER_PACK chunks per object), the
agent's UploadPart ($0.082/TiB), ranged GET and HEAD (~$0.013/TiB), and the
worker's GB-seconds. That last one is the lever grouping pulls hardest: a
one-chunk item pays for download, then compress+encrypt, then upload, one
after another (~1.3 s at 1 vCPU for 64 MiB, ~$0.50/TiB at 1,769 MB arm64),
while an item of several chunks overlaps the next chunk's download and the
previous chunk's upload with the current chunk's compression
(braid.pipeline.worker), so it bills about the CPU time (~0.35 s per
chunk, ~$0.13/TiB).

So an item is *a few* chunks: while the stream arrives, `max_chunks_per_item`
(default 32: a whole 2 GiB segment at 64 MiB chunks); after stream end, as
many as keep every allowed worker busy, up to that. Each item pays its
unoverlapped first download and last upload once, so longer items cost less:
scripts/bench cloud-model priced 1 TiB at 500 workers at k=16 ≈ $0.307 and
k=32 ≈ $0.29 at 50 MB/s. A long item used to be paid for in the time after
stream end: the round still running when the stream ended held the last one
back by up to that whole round (~17 s at k=32). So a streaming round's items
are *cut* items (braid.format.staging.MapItem.cut): each worker asks for the
stream end as its codec reaches each pack, stops there once it has ended,
and the planner gives the rest, in the same packs, to the final round, spread
over every worker. The round in flight then ends within about a pack of the
stream's end, whatever k is (scale_sim.end_phase_sizes samples the end phase).
Grouping never crosses a segment, so an item's parts are one contiguous range
of one staging object.

The round cap keeps every map's state output (a null per item) far below the
256 KiB payload limit without a ResultWriter.
"""

from __future__ import annotations

from braid import contract

MAX_ITEMS_PER_ROUND = 10_000
# The most chunks an item of an inline final round carries. A Distributed Map takes ~2 s from the
# state's start to its first child running (scripts/bench_lib/scale_sim.MAP_START_SECONDS), where an
# inline Map's iterations start at once; ~4 chunks of an item's time is what that start is worth, so
# a final round up to INLINE_MAP_MAX_ITEMS x 4 chunks finishes sooner inline, a larger one spread wide.
INLINE_MAX_CHUNKS_PER_ITEM = 4


def chunks_per_item(ready_chunks: int, max_concurrency: int, max_chunks_per_item: int, *, streaming: bool = False) -> int:
    """Fewest items that still give every allowed worker something to do, capped at `max_chunks_per_item`.

    While the stream is still arriving, a round is about one segment (32
    chunks at 64 MiB), and sizing it to fill hundreds of workers would make
    every item one chunk: the unoverlapped, most expensive shape (measured in
    scripts/bench cloud-model: ~$1.01/TiB against ~$0.5). The agent's upload
    rate, not worker count, bounds throughput then, so items stay full;
    only once the stream has ended do the last rounds spread over every
    worker to shorten the tail.
    """
    if streaming:
        return max(1, max_chunks_per_item)
    if ready_chunks <= 0:
        return 1
    wanted = -(-ready_chunks // max(1, max_concurrency))
    return max(1, min(max_chunks_per_item, wanted))


def inline_chunks_per_item(ready_chunks: int, max_concurrency: int, max_chunks_per_item: int) -> int | None:
    """Chunks per item for a final round small enough to run as an inline Map, else None.

    After stream end the tail is what the last round takes: an inline Map
    (contract.INLINE_MAP_MAX_ITEMS at once, never more than the fan-out)
    starts its items at once, where a Distributed Map first starts a map run.
    Worth it while its items stay short (INLINE_MAX_CHUNKS_PER_ITEM); the
    caller still checks the items it cut fit (they never span segments, so a
    round of many small segments may cut more).
    """
    slots = min(contract.INLINE_MAP_MAX_ITEMS, max(1, max_concurrency))
    if ready_chunks <= 0:
        return None
    per_item = max(chunks_per_item(ready_chunks, max_concurrency, max_chunks_per_item), -(-ready_chunks // slots))
    if per_item > min(INLINE_MAX_CHUNKS_PER_ITEM, max(1, max_chunks_per_item)):
        return None
    return per_item
