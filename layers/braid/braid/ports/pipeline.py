"""Ports the pipeline steps need beyond ObjectStore and KeyService.

Kept as small Protocols so the steps stay free of boto3 and run against
in-memory fakes, moto, or AWS alike; braid.adapters.aws.lambda_env builds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from braid.ports.multipart import MultipartStore


class StagingJanitor(Protocol):
    """What removing staging needs beyond deleting its objects.

    S3 keeps the parts of incomplete multipart uploads (and bills them) until
    they are aborted, and a versioned bucket keeps every deleted object as a
    noncurrent version: staging is raw database bytes, so both must go for
    "no plaintext stays in staging" to hold.
    """

    def abort_uploads(self, prefix: str) -> int:
        """Abort every incomplete upload under the repository-relative `prefix`; returns how many."""
        ...

    def purge_versions(self, prefix: str, exact: bool = False) -> int:
        """Delete every remaining version and delete marker under `prefix` (`exact`: of that object only); returns how many."""
        ...


class EventPublisher(Protocol):
    """Announces outcomes (EventBridge) so people and automation can react."""

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None: ...


class PruneRuns(Protocol):
    """Starts a scheduled prune run (the prune state machine on AWS) without waiting for it."""

    def start(self, run: str, document: Mapping[str, Any]) -> str:
        """Start run `run` with `document` as its input; returns its id (the execution ARN)."""
        ...


class MultipartJanitor:
    """StagingJanitor over a store's MultipartStore (S3, or a fake of it)."""

    def __init__(self, uploads: MultipartStore) -> None:
        self.uploads = uploads

    def abort_uploads(self, prefix: str) -> int:
        aborted = 0
        for upload in list(self.uploads.list_uploads(prefix)):
            self.uploads.abort_upload(upload.key, upload.upload_id)
            aborted += 1
        return aborted

    def purge_versions(self, prefix: str, exact: bool = False) -> int:
        return self.uploads.purge_versions(prefix, exact)


class PlainStoreJanitor:
    """StagingJanitor for stores with neither multipart uploads nor versions (a local directory)."""

    def abort_uploads(self, prefix: str) -> int:
        return 0

    def purge_versions(self, prefix: str, exact: bool = False) -> int:
        return 0


class RecordingPublisher:
    """EventPublisher that keeps events in memory, for tests and local runs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None:
        self.events.append((detail_type, dict(detail)))
