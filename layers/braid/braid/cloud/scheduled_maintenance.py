"""Scheduled maintenance: deep-verify recent backups and prune what never completed.

Run by an EventBridge schedule (functions/verify). Deep verify of the latest
backup of each name (or a sample of its chunks) catches silent corruption
while an older good backup still exists. Prune removes the chunks of backups
that never got a manifest (a backup without a valid manifest does not exist)
once they are older than the staging lifetime, so a backup still in flight
is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from braid.backup_id import BackupRef
from braid.cloud.pipeline_ports import VERIFY_FAILED, EventPublisher
from braid.errors import BackupError
from braid.finalize import discard_backup_data
from braid.keys import KeyService
from braid.layout import DATA, manifest_key, staging_prefix
from braid.object_store import ObjectStore
from braid.repository import Repository
from braid.verification import verify_backup


@dataclass
class MaintenanceReport:
    verified: list[dict[str, Any]] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.get("ok") for r in self.verified)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "verified": self.verified, "pruned": self.pruned}


def latest_per_name(repository: Repository) -> list[BackupRef]:
    latest: dict[str, BackupRef] = {}
    for ref in repository.backups():
        latest[ref.name] = ref  # backups() is oldest first
    return sorted(latest.values())


def verify_latest(repository: Repository, keys: KeyService, sample_percent: float | None) -> list[dict[str, Any]]:
    reports = []
    for ref in latest_per_name(repository):
        try:
            sealed = repository.load(ref)
            key = keys.unwrap(sealed.manifest.key)
            report = verify_backup(repository.store, sealed.authenticate(key), key, deep=True, sample_percent=sample_percent)
            reports.append(report.to_json())
        except BackupError as exc:
            reports.append({"backup": str(ref), "mode": "deep", "ok": False, "failures": [str(exc)]})
    return reports


def backup_created(ref: BackupRef) -> datetime:
    return datetime.strptime(ref.id.split("-")[0], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)


def orphaned_backups(store: ObjectStore, older_than: timedelta, now: datetime) -> list[BackupRef]:
    """Backups with chunks but no manifest and no staging, created before `now - older_than`."""
    seen: set[BackupRef] = set()
    for info in store.list(DATA):
        parts = info.key[len(DATA) :].split("/")
        if len(parts) == 3:
            try:
                seen.add(BackupRef.parse(f"{parts[0]}@{parts[1]}"))
            except BackupError:
                continue
    orphans = []
    for ref in sorted(seen):
        if now - backup_created(ref) < older_than:
            continue
        if store.head(manifest_key(ref)) is not None:
            continue
        if next(iter(store.list(staging_prefix(ref))), None) is not None:
            continue
        orphans.append(ref)
    return orphans


def run_maintenance(
    repository: Repository,
    keys: KeyService,
    events: EventPublisher,
    *,
    sample_percent: float | None,
    prune_after: timedelta,
    now: datetime | None = None,
) -> MaintenanceReport:
    report = MaintenanceReport(verified=verify_latest(repository, keys, sample_percent))
    for ref in orphaned_backups(repository.store, prune_after, now or datetime.now(timezone.utc)):
        discard_backup_data(repository.store, ref)
        report.pruned.append(str(ref))
    for failed in (r for r in report.verified if not r.get("ok")):
        events.publish(VERIFY_FAILED, {"repository": repository.url, "backup": failed["backup"], "failures": failed["failures"][:10]})
    return report
