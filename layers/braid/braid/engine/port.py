"""Port: the fan-out engine that turns input streams into a published backup.

The local engine cuts, encodes and stores chunks with a thread pool on this
machine; the cloud engine stages raw parts in S3 and lets Step Functions run
the same worker code in Lambda. Both end in the same `finalize_backup`, so
both write the same repository format, and the CLI drives either through
this one interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from braid.engine.stream import InputSource
from braid.format.ids import BackupRef
from braid.format.manifest import Manifest
from braid.ports.progress import ProgressFn

__all__ = ["BackupEngine", "BackupRequest"]


@dataclass(frozen=True)
class BackupRequest:
    ref: BackupRef
    sources: list[InputSource]
    chunk_size: int
    level: int
    workers: int
    resume: bool = False  # continue an interrupted upload (engines whose staging outlives the agent)


class BackupEngine(Protocol):
    name: str

    def run(self, request: BackupRequest, progress: ProgressFn) -> Manifest | None:
        """The published, verified manifest; None only when told not to wait
        for a pipeline that goes on without the caller."""
        ...
