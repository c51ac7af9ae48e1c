"""The scheduled copy (`braid:copyTo`): every backup the second repository is missing, within one run's time.

What is pending, per backup name: each published backup of the source
newer than the newest one of that name in the target (all of them when the
target holds none of it), oldest first. Older ones the target lacks are
not copied again: its own retention let them go (retention runs per
repository), and copying them back would undo it every run. A chain's
ancestors are copied first whatever their age (braid.ops.copy).

One run copies pending backups one after another (braid.ops.copy:
verified, published last) until `stop` says the run's time is up: the
backup being copied then stays unpublished (CopyInterrupted) and the next
run resumes it, sending only the objects the target lacks. A backup that
fails is reported; the name's later backups wait for the next run, so
none is skipped over, unless the failure is a corrupt source
(IntegrityError): that backup is reported and passed over, since no rerun
can copy it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from braid.errors import BackupError, IntegrityError, NotFoundError, UsageError
from braid.format.ids import BackupRef
from braid.format.layout import manifest_key
from braid.format.repository import Repository
from braid.ops.copy import DEFAULT_WORKERS, CopyInterrupted, CopyReport, CopyTarget, copy_backup
from braid.ports.keys import KeyService


@dataclass
class CopyRun:
    """One scheduled run: what it copied, what it found there, what failed, and what is left for the next run."""

    report: CopyReport
    pending: int = 0  # backups found pending at the start
    interrupted: str | None = None  # the backup whose copy `stop` cut short (unpublished)
    remaining: list[str] = field(default_factory=list)  # pending backups not finished, for the next run

    @property
    def ok(self) -> bool:
        return not self.report.failed

    def to_json(self) -> dict[str, Any]:
        return {**self.report.to_json(), "ok": self.ok, "pending": self.pending, "interrupted": self.interrupted, "remaining": self.remaining}


def pending_copies(source: Repository, target: Repository) -> list[BackupRef]:
    """The source's backups newer than the target's newest of the same name, oldest first (module docstring)."""
    newest: dict[str, str] = {}
    for ref in target.backups():
        newest[ref.name] = max(newest.get(ref.name, ""), ref.id)
    return [ref for ref in source.backups() if ref.id > newest.get(ref.name, "")]


def copy_pending(
    source: Repository,
    source_keys: KeyService,
    target: CopyTarget,
    *,
    stop: Callable[[], bool],
    workers: int = DEFAULT_WORKERS,
) -> CopyRun:
    """Copy what `pending_copies` finds until `stop()`; never raises for one backup (see CopyRun)."""
    if source.config.id == target.repository.config.id:
        raise UsageError(f"{target.repository.url} is the source repository itself (id {source.config.id}): copy to another repository")
    pending = pending_copies(source, target.repository)
    run = CopyRun(CopyReport(target.repository.url), pending=len(pending))
    held: set[str] = set()  # names whose earlier backup failed: their later ones wait, in order
    for index, ref in enumerate(pending):
        if ref.name in held:
            run.remaining.append(str(ref))
            continue
        if stop():
            run.remaining.extend(str(r) for r in pending[index:])
            break
        try:
            copy_backup(source, source_keys, target, ref, run.report, workers=workers, stop=stop)
        except CopyInterrupted as exc:
            run.interrupted = exc.backup
            run.remaining.extend(str(r) for r in pending[index:])
            break
        except NotFoundError as exc:
            if source.store.head(manifest_key(ref)) is None:
                continue  # pruned from the source since the listing: nothing to copy
            run.report.failed.append((str(ref), exc))  # a chain's ancestor is missing: no rerun can copy it
        except IntegrityError as exc:
            run.report.failed.append((str(ref), exc))
        except BackupError as exc:
            run.report.failed.append((str(ref), exc))
            run.remaining.append(str(ref))
            held.add(ref.name)
    return run
