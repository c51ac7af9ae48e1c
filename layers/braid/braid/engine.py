"""Port: the fan-out engine that turns input streams into a published backup.

The local engine cuts, encodes and stores chunks with a thread pool on this
machine; the cloud engine stages raw parts in S3 and lets Step Functions run
the same worker code in Lambda. Both end in the same `finalize_backup`, so
both write the same repository format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from braid.backup_id import BackupRef
from braid.manifest import Manifest
from braid.stream_reader import InputSource

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class BackupRequest:
    ref: BackupRef
    sources: list[InputSource]
    chunk_size: int
    level: int
    workers: int


class BackupEngine(Protocol):
    name: str

    def run(self, request: BackupRequest, progress: ProgressFn) -> Manifest: ...
