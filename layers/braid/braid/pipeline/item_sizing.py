"""How many chunks one Distributed Map item carries (the cost model behind it: docs/design/2026-11-cloud-figures.md).

An item is *a few* chunks: one of several overlaps its reads and PUTs with
its codec (braid.pipeline.item_flow) and pays an item's fixed costs once.
While the stream arrives, an item is `max_chunks_per_item`; after stream
end, as many as keep every allowed worker busy, up to that. A streaming
round's items are *cut* (braid.format.staging.MapItem.cut), so the round in
flight ends within about a pack of the stream's end. Grouping never crosses
a segment, so an item's parts are one contiguous range of one staging
object. The round cap keeps every map's state output (a null per item) far
below the 256 KiB payload limit without a ResultWriter.
"""

from __future__ import annotations

MAX_ITEMS_PER_ROUND = 10_000


def chunks_per_item(ready_chunks: int, max_concurrency: int, max_chunks_per_item: int, *, streaming: bool = False) -> int:
    """Fewest items that still give every allowed worker something to do, capped at `max_chunks_per_item`.

    While the stream is still arriving (`streaming`) items stay full: the agent's upload rate, not worker
    count, bounds throughput then; only once it has ended do the last rounds spread over every worker.
    """
    if streaming:
        return max(1, max_chunks_per_item)
    wanted = -(-ready_chunks // max(1, max_concurrency))
    return max(1, min(max_chunks_per_item, wanted))

