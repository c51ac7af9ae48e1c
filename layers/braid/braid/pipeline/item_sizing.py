"""How many chunks one Distributed Map item carries, and the cost model behind it.

Each *item* has a fixed cost (an EXPRESS child execution, a Lambda invoke,
a result record PUT), and a one-chunk item pays download, compress+encrypt
and upload one after another, while an item of several chunks overlaps the
next chunk's download and the previous chunk's upload with the current
chunk's compression (braid.pipeline.worker), so it bills about the CPU time.
(The cost model, priced: docs/design/2026-11-cloud-figures.md.)

So an item is *a few* chunks: while the stream arrives, `max_chunks_per_item`
(default 32: a whole 2 GiB segment at 64 MiB chunks); after stream end, as
many as keep every allowed worker busy, up to that. Each item pays its
unoverlapped first download and last upload once, so longer items cost
less; but a long item would hold back the time after stream end by up to
the round in flight. So a streaming round's items
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

MAX_ITEMS_PER_ROUND = 10_000


def chunks_per_item(ready_chunks: int, max_concurrency: int, max_chunks_per_item: int, *, streaming: bool = False) -> int:
    """Fewest items that still give every allowed worker something to do, capped at `max_chunks_per_item`.

    While the stream is still arriving, a round is about one segment (32
    chunks at 64 MiB), and sizing it to fill hundreds of workers would make
    every item one chunk: the unoverlapped, most expensive shape (see
    scripts/bench cloud-model). The agent's upload
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

