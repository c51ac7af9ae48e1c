"""S3's multipart limits, the segment size the agent picks within them, and
the largest chunk the pipeline's worker can hold.

Checked before anything is written, so a chunk size S3 or the worker would
refuse fails at once with the flag to change, not after the first segment
(or, for the worker, as an out-of-memory `Lambda.Unknown` that discards the
backup).
"""

from __future__ import annotations

import os

from braid import contract
from braid.errors import UsageError
from braid.pipeline.worker_buffers import chunk_buffers

MiB = 1024**2
# The worker (contract.WORKER_MEMORY_MB) holds at most
# braid.pipeline.worker_buffers.chunk_buffers chunk-sized buffers: those it reads
# ahead into, two packs' (each part read into its own buffer, then its stored
# frame written over it and kept until the pack's PUT), and each encoder's
# compressed payload and, for an incompressible chunk, stored form. Budgeted
# after what the runtime, libraries and clients take before any chunk.
WORKER_CHUNK_BUFFERS = chunk_buffers(contract.DEFAULT_WORKER_LANES, contract.CHUNKS_PER_PACK)
WORKER_BASE_MB = 256

MAX_PARTS = 10_000  # S3's limit per multipart upload
MIN_PART_SIZE = 5 * 1024**2  # S3's minimum for every part but the last
MAX_PART_SIZE = 5 * 1024**3
MAX_OBJECT_SIZE = 5 * 1024**4
SEGMENT_TARGET_BYTES = 2 * 1024**3
# --concurrency: chunks in flight. The agent holds (inputs + concurrency + 1) chunk buffers: at 64 MiB
# chunks and one input 13 buffers, 832 MiB (~915 MiB resident with the interpreter and clients), under
# 1 GiB; room for 256 MiB parts (PART_TARGET_BYTES) with 2 in flight beside the one being filled.
DEFAULT_CONCURRENCY = contract.DEFAULT_AGENT_CONCURRENCY
# The buffers one input gets at the default --concurrency (13: 832 MiB at 64 MiB chunks). More inputs
# (--pipes N, several --input) get fewer chunks in flight by default, so memory stays this bound.
DEFAULT_BUFFERS = 1 + DEFAULT_CONCURRENCY + 1
# A staging part of up to this many bytes holds several chunks: S3 bills each
# UploadPart, so k chunks per part cut the agent's request cost by k; the worker
# still reads one chunk per ranged GET (by byte offset).
PART_TARGET_BYTES = 256 * MiB
# Parts that must fit in flight beside every input's part being filled: fewer
# (bigger parts in the same buffers) starve the upload. Two whole parts in flight
# keep the connection busy while the next part fills; one does not. A much faster
# stream wants a larger --concurrency, which keeps the part size and adds parts in
# flight. (Measured: docs/design/2026-11-cloud-figures.md.)
MIN_PARTS_IN_FLIGHT = 2
# The part-grouping policy (off: contract.ENV_PART_GROUPING=off, one-chunk parts throughout). Grouped parts
# leave fewer connections in flight, and one connection carries at most its send buffer per round trip: the
# parts are grouped only as far as the parts in flight still carry GROUPED_RATE_FLOOR at the measured RTT.
GROUPED_RATE_FLOOR = 10 * 1000**3 / 8  # bytes/s: 10 Gbit/s, the fastest link issue 27 asks the agent to fill
# Of a socket's largest send buffer (tcp_wmem), what its connection keeps in flight: Linux sizes the buffer at
# twice the congestion window's memory (tcp_sndbuf_expand in net/ipv4/tcp_input.c). Measured here 0.65 (137 MB/s
# per connection at 20 ms with a 4 MiB buffer); how the decision moves with it: docs/design/agent-line-rate.md.
SEND_BUFFER_IN_FLIGHT = 0.5


def default_concurrency(inputs: int) -> int:
    """Chunks in flight when --concurrency is not given: DEFAULT_BUFFERS whatever the inputs, at least two parts.

    One input: DEFAULT_CONCURRENCY (11). Each further input takes one
    buffer to read into from the chunks in flight (four inputs: 8), down to
    MIN_PARTS_IN_FLIGHT, below which the upload starves: past ten inputs
    the memory grows by a chunk per input. A --concurrency given is kept.
    """
    return max(MIN_PARTS_IN_FLIGHT, DEFAULT_BUFFERS - inputs - 1)


def default_segment_chunks(chunk_size: int) -> int:
    """Parts per segment: about 2 GiB, so the pipeline starts after the first 2 GiB.

    Smaller segments start the fan-out sooner but cost more records and
    CompleteMultipartUpload calls; 2 GiB keeps a TiB at ~512 segments. Any
    stream fits, as segments are unlimited; each stays within 10,000 parts.
    """
    return max(1, min(MAX_PARTS, -(-SEGMENT_TARGET_BYTES // chunk_size)))


def buffers_needed(inputs: int, part_chunks: int) -> int:
    """Chunk buffers the agent needs so that grouping chunks into parts can never deadlock.

    Each input may hold the chunks of its part still being filled plus the
    one it reads into (`part_chunks` each), and one whole part must fit
    beside them to be uploaded, which frees its buffers for the next.
    """
    return (inputs + 1) * part_chunks


def part_grouping_on() -> bool:
    """Whether the part-grouping policy is on in this process (contract.ENV_PART_GROUPING unset or not "off")."""
    return os.environ.get(contract.ENV_PART_GROUPING, "").strip().lower() != "off"


def connection_rate(path: tuple[float, int] | None) -> float | None:
    """Bytes per second one connection can carry on a path of (RTT seconds, largest send buffer bytes); None if unknown."""
    if path is None:
        return None
    rtt, send_buffer = path
    return send_buffer * SEND_BUFFER_IN_FLIGHT / rtt


def default_part_chunks(chunk_size: int, inputs: int, concurrency: int, rate_per_connection: float | None = None) -> int:
    """Chunks per staging part: up to PART_TARGET_BYTES, within what the agent's buffers allow.

    --concurrency counts chunks in flight, so memory stays (inputs +
    concurrency + 1) chunks whatever the part size; a part is sent once all
    its chunks are read, from their own buffers. The part shrinks (down to
    one chunk, as before) until every input's part being filled and
    MIN_PARTS_IN_FLIGHT parts being sent fit in that bound: at the default
    --concurrency 11, 4 chunks (256 MiB parts) with one input, 3 with two,
    2 with three or four; with one input, 3 at --concurrency 8 or 9, 4 from 10.

    Given `rate_per_connection` (connection_rate of the path to the store),
    it shrinks further until the parts in flight carry GROUPED_RATE_FLOOR:
    at the defaults and a 4 MiB send buffer, 4 chunks up to 3.4 ms of RTT,
    3 to 5.0 ms, 2 to 8.4 ms, then one-chunk parts.
    """
    buffers = inputs + concurrency + 1
    chunks = max(1, min(PART_TARGET_BYTES // chunk_size, MAX_PART_SIZE // chunk_size))
    while chunks > 1 and parts_in_flight(buffers, inputs, chunks) < MIN_PARTS_IN_FLIGHT:
        chunks -= 1
    while chunks > 1 and rate_per_connection and parts_in_flight(buffers, inputs, chunks) * rate_per_connection < GROUPED_RATE_FLOOR:
        chunks -= 1
    return chunks


def parts_in_flight(buffers: int, inputs: int, chunks: int) -> int:
    """Whole parts of `chunks` chunks that can be sent at once beside every input's part being filled."""
    return buffers // chunks - inputs


def default_ramp_parts(part_chunks: int, segment_chunks: int) -> int:
    """One-chunk parts that start each input's first segment: the whole of it (2 GiB at the defaults).

    Parts of `part_chunks` chunks leave only MIN_PARTS_IN_FLIGHT of them in
    flight in the same buffers (two or three of 256 MiB at the defaults), and
    the chunks of the part being filled wait, unsent, for the rest of it:
    after a ramp of --concurrency parts, a 2 GiB stream went out three parts
    at a time, and its last 256 MiB part alone (docs/design/agent-line-rate.md,
    the timeline). A first segment of one-chunk parts keeps --concurrency of
    them in flight, so a stream of up to a segment goes out exactly as boto3's
    multipart upload at the same memory; a longer one sends the larger parts
    from its second segment on (a TiB: 4,096 + 24 UploadParts rather than
    4,096, at 64 MiB chunks). Same buffers: a one-chunk part never needs more
    than the larger parts do.
    """
    if part_chunks <= 1:
        return 0
    return segment_chunks


def check_part_chunks(part_chunks: int, inputs: int, concurrency: int) -> None:
    """A resumed upload keeps its session's parts: refuse a --concurrency too small to fill them."""
    buffers = inputs + concurrency + 1
    if buffers_needed(inputs, part_chunks) > buffers:
        needed = buffers_needed(inputs, part_chunks) - inputs - 1
        raise UsageError(
            f"this upload's staging parts hold {part_chunks} chunks each, which --concurrency {concurrency} with {inputs} input(s)"
            f" cannot fill without running out of buffers; use --concurrency {needed} or more"
        )


def check_sizes(chunk_size: int, segment_chunks: int, min_part_size: int = MIN_PART_SIZE, part_chunks: int = 1) -> None:
    """Refuse chunk, part and segment sizes S3's multipart uploads cannot hold."""
    if not 0 < chunk_size <= MAX_PART_SIZE:
        raise UsageError(f"chunk size {chunk_size} is outside S3's part sizes (up to 5 GiB)")
    if not 1 <= part_chunks or part_chunks * chunk_size > MAX_PART_SIZE:
        raise UsageError(f"staging parts of {part_chunks} x {chunk_size} bytes are outside S3's part sizes (up to 5 GiB)")
    if segment_chunks > 1 and chunk_size < min_part_size:
        raise UsageError(f"chunk size {chunk_size} is below S3's minimum part size of {min_part_size} bytes; use --chunk-size 5MiB or more")
    if not 1 <= segment_chunks <= MAX_PARTS:
        raise UsageError(f"{segment_chunks} parts per segment: S3 allows 1 to {MAX_PARTS}")
    if segment_chunks * chunk_size > MAX_OBJECT_SIZE:
        raise UsageError(f"segments of {segment_chunks} x {chunk_size} bytes exceed S3's 5 TiB object limit")


def max_worker_chunk_size(memory_mb: int = contract.WORKER_MEMORY_MB, lanes: int = contract.DEFAULT_WORKER_LANES) -> int:
    """The largest chunk size (whole MiB) whose buffers the worker holds in its memory: 67 MiB for the stack's worker."""
    per_chunk = (memory_mb - WORKER_BASE_MB) * MiB // chunk_buffers(lanes, contract.CHUNKS_PER_PACK)
    return per_chunk // MiB * MiB


def check_worker_chunk_size(chunk_size: int) -> None:
    """Refuse, on s3:// repositories, a chunk size the pipeline's worker would run out of memory on."""
    largest = max_worker_chunk_size()
    if chunk_size > largest:
        raise UsageError(
            f"--chunk-size {chunk_size / MiB:g} MiB is more than the cloud pipeline's worker can hold"
            f" (up to {WORKER_CHUNK_BUFFERS} chunk-sized buffers at once: read-ahead, two packs, the encoders),"
            f" in {contract.WORKER_MEMORY_MB} MB); the largest allowed is {largest // MiB} MiB: use --chunk-size {largest // MiB}MiB or less"
        )
