"""Ports the pipeline steps need beyond ObjectStore and KeyService.

Kept as small Protocols so the steps stay free of boto3 and run against
in-memory fakes, moto, or AWS alike; braid.cloud.aws_pipeline implements them.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

EVENT_SOURCE = "braid"
BACKUP_COMPLETED = "Backup Completed"
BACKUP_FAILED = "Backup Failed"
VERIFY_FAILED = "Verify Failed"


class UploadAborter(Protocol):
    """Aborts incomplete multipart uploads; S3 keeps their parts (and bills them) otherwise."""

    def abort_uploads(self, prefix: str) -> int:
        """Abort every incomplete upload under the repository-relative `prefix`; returns how many."""
        ...


class EventPublisher(Protocol):
    """Announces outcomes (EventBridge) so people and automation can react."""

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None: ...


class NoUploads:
    """UploadAborter for stores without multipart uploads (the local directory store)."""

    def abort_uploads(self, prefix: str) -> int:
        return 0


class RecordingPublisher:
    """EventPublisher that keeps events in memory, for tests and local runs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None:
        self.events.append((detail_type, dict(detail)))
