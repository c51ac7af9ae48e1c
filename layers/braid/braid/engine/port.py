"""Port: the fan-out engine that turns input streams into a published backup.

The local engine cuts, encodes and stores chunks with a thread pool on this
machine; the cloud engine stages raw parts in S3 and lets Step Functions run
the same worker code in Lambda. Both end in the same `finalize_backup`, so
both write the same repository format, and the CLI drives either through
this one interface.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from braid.engine.capture import Captured
from braid.engine.fifo_open import DEFAULT_OPEN_TIMEOUT
from braid.engine.gate import StreamGate
from braid.engine.stream import InputSource
from braid.format.chain import Lineage
from braid.format.ids import BackupRef
from braid.ports.progress import ProgressFn

if TYPE_CHECKING:
    from braid.format.manifest import Manifest  # the engines' result: loaded by what reads or writes one

__all__ = ["BackupEngine", "BackupRequest"]


@dataclass(frozen=True)
class BackupRequest:
    ref: BackupRef
    sources: list[InputSource]
    chunk_size: int
    level: int
    workers: int
    resume: bool = False  # continue an interrupted upload (engines whose staging outlives the agent)
    # Judges the stream once every input ended, before anything is published
    # (braid.engine.gate): the producer's verdict, the empty-stream check.
    gate: StreamGate | None = None
    # False when the inputs cannot be read again from their first byte (a
    # producer Braid ran): a failed upload is then abandoned, not kept for
    # --resume, so the pipeline stops at once instead of waiting to stall.
    resumable: bool = True
    # Seconds a named-pipe input may wait for its writer to open it (--open-timeout).
    open_timeout: float = DEFAULT_OPEN_TIMEOUT
    # The backup's place in a chain (braid.format.chain): an incremental names its parent, sealed into its manifest.
    lineage: Lineage = field(default_factory=Lineage)
    # Judges what the stream carried once the producer succeeded, before anything is published: a
    # PostgreSQL base backup without its WAL (-X none) waits for its WAL range in the archive (braid.ops.wal_wait).
    wal_gate: Callable[[Captured], None] | None = None
    # `--label KEY=VALUE` (braid.format.labels): sealed into the manifest and its summary.
    labels: Mapping[str, str] = field(default_factory=dict)
    # `--rate-limit` of the local engine: bytes per second read from the inputs (None: as fast as it goes).
    rate_limit: int | None = None
    # A cloud incremental (braid.agent.parent_wait): the placeholders its producer uses, which Prepare reads from the
    # parent; and the producer, not started yet: `start_sources(lsn, backup_manifest)` starts it with the values the
    # pipeline handed over and returns its inputs (`sources` is then empty; `input_labels` names them for the session).
    parent_values: tuple[str, ...] = ()
    start_sources: Callable[[str | None, bytes | None], list[InputSource]] | None = None
    input_labels: tuple[str, ...] = ()


class BackupEngine(Protocol):
    name: str

    def run(self, request: BackupRequest, progress: ProgressFn) -> Manifest | None:
        """The published, verified manifest; None only when told not to wait
        for a pipeline that goes on without the caller."""
        ...
