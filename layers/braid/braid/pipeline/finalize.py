"""Finalize: check every planned chunk, publish the manifest, drop staging.

Correctness never rests on the map's own bookkeeping: Finalize reads the
plan rounds and the workers' results itself (StagingArea.read_results),
requires the rounds to tile every input through its stream-end length and
a result for every planned chunk that matches its place in the plan, and
`finalize_backup` then checks every stored chunk's presence and size by
LIST before it writes the manifest last, create-only, and reads it back.
Only then is staging deleted and "Backup Completed" emitted, best-effort:
the backup exists once published, so a failed PutEvents is reported
(`notify_failed`: the handler logs it and counts NotificationsFailed) and
never fails a complete backup. Re-running Finalize after it published (a
Lambda retry) is safe: the published manifest is authenticated and the
remaining steps are repeated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from braid.contract import BACKUP_COMPLETED, ENGINE_STEPFUNCTIONS
from braid.engine.capture import Captured
from braid.engine.finalize import InputRecord, finalize_backup
from braid.errors import IntegrityError, NotFoundError
from braid.format.ids import BackupRef
from braid.format.layout import manifest_key
from braid.format.manifest import Manifest, open_manifest
from braid.format.staging import StagingArea
from braid.format.usage import Usage
from braid.ops.catalog import ensure_summary
from braid.pipeline.plan import check_not_abandoned
from braid.pipeline.plan_cursor import rounds_cover_stream
from braid.pipeline.prepare import check_repository, load_data_key
from braid.pipeline.usage import execution_usage
from braid.ports.keys import KeyService
from braid.ports.pipeline import EventPublisher, StagingJanitor
from braid.ports.store import ObjectStore
from braid.ports.usage import InvocationMeter

ENGINE = ENGINE_STEPFUNCTIONS
_log = logging.getLogger(__name__)


def log_notify_failure(ref: BackupRef, exc: Exception) -> None:
    _log.warning("backup %s was published, but its %r event was not sent: %s", ref, BACKUP_COMPLETED, exc)


@dataclass(frozen=True)
class Summary:
    backup: str
    repository: str
    manifest: str
    inputs: int
    chunks: int
    plaintext_bytes: int
    stored_bytes: int
    ratio: float
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": round(self.ratio, 4), "seconds": round(self.seconds, 3)}


def summarize(manifest: Manifest, store_url: str, seconds: float) -> Summary:
    ref = BackupRef.parse(manifest.backup)
    return Summary(
        backup=manifest.backup,
        repository=store_url,
        manifest=manifest_key(ref),
        inputs=len(manifest.inputs),
        chunks=manifest.chunk_count,
        plaintext_bytes=manifest.plaintext_bytes,
        stored_bytes=manifest.stored_bytes,
        ratio=manifest.ratio,
        seconds=seconds,
    )


def published_manifest(store: ObjectStore, ref: BackupRef) -> bytes | None:
    try:
        return store.get(manifest_key(ref))
    except NotFoundError:
        return None


def finalize_step(
    store: ObjectStore,
    keys: KeyService,
    uploads: StagingJanitor,
    events: EventPublisher,
    ref: BackupRef,
    notify_failed: Callable[[BackupRef, Exception], None] = log_notify_failure,
    *,
    meter: InvocationMeter | None = None,
    carried: Sequence[Usage | None] = (),
) -> Summary:
    """`meter`: this invocation's; `carried`: the usage earlier steps left in the state (Prepare's, the Plan calls'):
    the manifest gets the backup's usage (braid.pipeline.usage), whatever of it was measured."""
    started = time.monotonic()
    area = StagingArea(store, ref)
    session = area.read_session()
    check_repository(store, session)
    key, wrapped = load_data_key(store, keys, ref, session.repository)
    existing = published_manifest(store, ref)
    if existing is not None:
        manifest = open_manifest(existing, f"backup {ref}").authenticate(key)
        ensure_summary(store, manifest, key)  # published by an earlier attempt (or an older Braid): the catalog has it too
    else:
        end = area.read_stream_end()
        if end is None:
            raise IntegrityError(f"backup {ref} reached Finalize before every staged segment was recorded")
        check_not_abandoned(ref, end)
        rounds = area.read_rounds()
        rounds_cover_stream(ref, rounds, end, session)
        items: list[Usage] = []
        entries = area.read_results(rounds, items)

        def usage(manifest: Manifest) -> Usage:
            assert end is not None
            own = meter.usage() if meter is not None else Usage()
            return execution_usage([*carried, end.usage], items, own, staged_bytes=sum(end.lengths), stored_bytes=manifest.stored_bytes)

        captured = Captured(members=area.read_captured())  # the small members the agent staged (braid.format.staging.chain)
        manifest = finalize_backup(
            store,
            ref=ref,
            repository_id=session.repository,
            key=key,
            wrapped=wrapped,
            chunk_size=session.chunk_size,
            inputs=[InputRecord(i, source, end.lengths[i]) for i, source in enumerate(session.inputs)],
            entries=entries,
            level=session.level,
            created=session.created,
            timings={"finalize_seconds": round(time.monotonic() - started, 3)},
            engine=ENGINE,
            stats={"rounds": len(rounds), "map_items": sum(len(r.items) for r in rounds)},
            usage=usage,
            lineage=session.lineage,
            wal=captured.wal,
            metadata=captured.metadata,
        )
    area.remove(uploads)  # every staged object, the captured plaintext included, and every version of each
    summary = summarize(manifest, store.url, time.monotonic() - started)
    try:
        events.publish(BACKUP_COMPLETED, summary.to_json())
    except Exception as exc:  # best-effort after publish: never fail a published backup
        notify_failed(ref, exc)
    return summary
