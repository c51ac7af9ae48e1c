"""How many chunk-sized buffers the pipeline's worker holds: arithmetic only.

Apart from braid.pipeline.item_flow (which holds them) so that the agent's
size checks (braid.agent.limits) can use the figure without loading the
codec and its zstandard, which the agent never runs.
"""

from __future__ import annotations

ENCODERS = 2  # one compresses while the other's Python (headers, MAC, checks) runs; more only contend for the one vCPU


def buffers_per_item(lanes: int, chunks_per_pack: int) -> int:
    """Chunk buffers one item may hold at once: `lanes` read ahead and two packs (one filling, one being sent)."""
    return max(1, lanes) + 2 * max(1, chunks_per_pack)


def chunk_buffers(lanes: int, chunks_per_pack: int, encoders: int = ENCODERS) -> int:
    """Chunk-sized buffers a worker holds at most: an item's pooled ones, and each encoder's zstd payload and stored frame
    (braid.format.chunk.ChunkCodec: the latter for a chunk that does not compress)."""
    return buffers_per_item(lanes, chunks_per_pack) + 2 * encoders
