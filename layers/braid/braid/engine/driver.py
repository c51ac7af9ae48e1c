"""The one loop that reads a backup's inputs into a sink, shared by both engines.

Reader threads (braid.engine.stream) cut the inputs into pool buffers; this
loop, on the caller's thread, numbers the pieces in arrival order, hands
each to a `ChunkSink` (the local engine stores chunks on a thread pool, the
cloud agent uploads staging parts) and tells the sink when each input ends.
Keeping this in one place means both engines agree on what a chunk index
is, on the 2^32-chunk limit, and on how a failure stops the readers.

Memory is bounded by the pool: `buffers` chunk buffers, whatever the
stream length. A sink returns each buffer through the `release` callback
it is given, so a reader blocks only while every buffer is in flight.
Engines size it with `pool_size(inputs, in_flight)`: one buffer per input
to read into, so a writer that feeds its pipes in turn never deadlocks
(braid.engine.stream), and `in_flight` more for the chunks being stored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from braid.engine.capture import Captured, StreamCapture, merge_captures
from braid.engine.fifo_open import DEFAULT_OPEN_TIMEOUT
from braid.engine.gate import StreamGate
from braid.engine.stream import BufferPool, InputEnd, InputSource, Piece, StreamCutter, expected_chunks, pool_size
from braid.errors import LimitError
from braid.format.buffers import WritableBuffer
from braid.format.keys import MAX_CHUNKS_PER_KEY
from braid.ports.progress import ProgressFn

__all__ = ["ChunkSink", "Release", "StreamResult", "drive", "pool_size"]

Release = Callable[[], None]
"""Gives a piece's buffer back to the pool: call exactly once, from any thread."""

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class ChunkSink(Protocol[R_co]):
    """Where the driver sends the pieces of a stream.

    `accept` owns the buffer from the call on: it must `release` it exactly
    once, also when it raises. It may block (that is the back-pressure that
    bounds memory) and raises once the sink has failed, so the stream stops
    at the next piece after a failure rather than at its end.
    """

    def accept(self, index: int, piece: Piece, release: Release) -> None:
        """Take chunk `index` (global, in arrival order) of the backup."""
        ...

    def end_input(self, input_index: int, length: int) -> None:
        """Input `input_index` ended after `length` bytes; all its pieces were accepted."""
        ...

    def finish(self) -> R_co:
        """Every input ended: wait for the work in flight and return its outcome, or raise its first error."""
        ...

    def abort(self, error: BaseException) -> None:
        """Stop after `error`: drop queued work, wait for running work; must not raise."""
        ...


@dataclass(frozen=True)
class StreamResult(Generic[R]):
    """What the loop saw, and what the sink made of it."""

    outcome: R  # the sink's `finish`
    input_lengths: dict[int, int]  # by input index
    chunks: int
    ended_at: float  # time.monotonic() when the last input ended, before the sink drained
    max_buffers_in_flight: int
    captured: Captured = field(default_factory=Captured)  # small members of a tar stream (braid.engine.capture)


def drive(
    sources: Sequence[InputSource],
    sink: ChunkSink[R],
    *,
    buffers: int,
    chunk_size: int,
    backup: str,
    gate: StreamGate | None = None,
    open_timeout: float = DEFAULT_OPEN_TIMEOUT,
    progress: ProgressFn | None = None,
    throttle: Callable[[int], object] | None = None,
    on_captured: Callable[[Captured], None] | None = None,
) -> StreamResult[R]:
    """Read every source to its end through `sink`.

    Each input's pieces are shown to a StreamCapture (braid.engine.capture)
    as they pass: `StreamResult.captured` holds a PostgreSQL base backup's
    backup_label, backup_manifest, PG_VERSION and pg_control head.

    `gate` (braid.engine.gate) judges the whole stream once every input
    ended and before `sink.finish()`, which is what publishes (the local
    manifest, the cloud stream-end record): a gate that raises is a failure
    like any other, so the sink is aborted and nothing is published.

    On any failure (a reader's, the sink's, the limit, KeyboardInterrupt)
    the readers are told to stop, the sink is aborted with the error, the
    reader threads are joined, and the error is re-raised unchanged: what
    the caller does next (discard chunks, point at --resume) is its own.

    A named pipe with no writer after a few seconds is reported to
    `progress` ("waiting for a writer on P"), and fails the backup with an
    InputError after `open_timeout` seconds. `throttle(n)` (--rate-limit)
    is called with each piece's length before it is handed on and may sleep:
    the readers then wait for free buffers, and so does the producer.
    `on_captured` is given what the capture kept once the gate passed, before
    `sink.finish()` (the cloud agent stages it ahead of its stream-end record).
    """
    pool = BufferPool(buffers, chunk_size)
    expected = expected_chunks(list(sources), chunk_size)
    if expected is not None:  # each reader makes its first buffer; the others are made while they read
        pool.make_ahead(min(expected, buffers) - len(sources))
    cancelled = threading.Event()
    cutter = StreamCutter(list(sources), pool, cancelled, open_timeout=open_timeout, waiting=_waiting_note(progress, backup, open_timeout))
    lengths: dict[int, int] = {}
    captures = {source.index: StreamCapture(source.label) for source in sources}
    count = 0
    try:
        for event in cutter:
            if isinstance(event, InputEnd):
                lengths[event.input_index] = event.length
                captures[event.input_index].end()
                sink.end_input(event.input_index, event.length)
                continue
            release = _releaser(pool, event.buffer)
            if count >= MAX_CHUNKS_PER_KEY:
                release()
                raise LimitError(f"backup {backup} would exceed 2^32 chunks under one data key; use a larger --chunk-size")
            captures[event.input_index].feed(event.data)  # before the sink owns the buffer
            if throttle is not None:
                throttle(event.length)
            sink.accept(count, event, release)
            count += 1
        if gate is not None:
            gate(dict(lengths))
        ended_at = time.monotonic()
        captured = merge_captures(captures)
        if on_captured is not None:
            on_captured(captured)
        outcome = sink.finish()
    except BaseException as exc:
        cancelled.set()
        sink.abort(exc)
        cutter.join()
        raise
    return StreamResult(outcome, lengths, count, ended_at, pool.max_in_use, captured)


def _releaser(pool: BufferPool, buffer: WritableBuffer) -> Release:
    return lambda: pool.release(buffer)


def _waiting_note(progress: ProgressFn | None, backup: str, timeout: float) -> Callable[[InputSource], None] | None:
    if progress is None:
        return None
    report = progress

    def note(source: InputSource) -> None:
        report(
            {
                "event": "waiting",
                "backup": backup,
                "input": source.label,
                "message": f"waiting for a writer on {source.label} (giving up after {timeout:g} s, --open-timeout)",
            }
        )

    return note


def after_stream(wal_gate: Callable[[Captured], None] | None, stage: Callable[[Mapping[str, bytes]], None]) -> Callable[[Captured], None]:
    """The cloud agent's `on_captured`: a -X none base backup's WAL range must be archived or staged first
    (`wal_gate`, braid.ops.wal_wait: its error abandons the backup), then what the stream carried is staged for Finalize."""

    def captured(found: Captured) -> None:
        if wal_gate is not None:
            wal_gate(found)
        if found.members:
            stage(found.members)

    return captured
