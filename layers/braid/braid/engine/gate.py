"""The stream gate: the last word on a stream before anything is published.

A pipe closes the same way whether its writer finished or died, so the end
of the bytes says nothing about whether they are a backup. The driver
(braid.engine.driver) calls the gate once every input ended and before the
sink finishes: before the local engine writes a manifest, before the cloud
agent writes the stream-end record the pipeline finalizes on. A gate that
raises stops the backup there, with nothing published.

The standard gate asks, in this order: did the producer Braid ran succeed
(its verdict), and did the stream hold at least one byte. A failed producer
is named first, because an empty stream is usually its symptom.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from braid.errors import EmptyStreamError

__all__ = ["StreamGate", "Verdict", "stream_gate"]

StreamGate = Callable[[Mapping[int, int]], None]
"""Called with every input's length (by input index) once all ended; raises to refuse the stream."""

Verdict = Callable[[], None]
"""Waits for whatever produced the stream to finish and raises if it failed (braid.engine.producer)."""


def stream_gate(*, verdict: Verdict | None = None, allow_empty: bool = False) -> StreamGate:
    """The gate `braid backup` puts in front of every backup: producer verdict, then emptiness."""

    def gate(lengths: Mapping[int, int]) -> None:
        if verdict is not None:
            verdict()
        if not allow_empty and sum(lengths.values()) == 0:
            inputs = "every input" if len(lengths) > 1 else "the input"
            raise EmptyStreamError(
                f"the backup stream is empty ({inputs} ended before its first byte); nothing was published."
                " An empty stream usually means the producer failed; pass --allow-empty if empty is what you mean to back up"
            )

    return gate
