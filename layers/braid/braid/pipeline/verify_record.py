"""RecordVerify: fold a run's outcomes into one verify record per backup, and announce failures.

The outcomes are PlanVerify's and, for a deep run, every map item's from the
map's ResultWriter export. A failed item (its worker failed past its
retries, or its EXPRESS child timed out) is a failure of each of its chunks,
with the worker's own error; chunks planned but accounted for by no outcome
(an export that lost results) are failures too: a verify that did not check
a chunk never says it did. Each backup's record goes beside it
(braid.ops.verification); a failed one is published as "Verify Failed" and
counted in the VerifyFailures metric (the handler). The run's work objects
are deleted last.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from braid.contract import ENGINE_STEPFUNCTIONS, VERIFY_FAILED
from braid.errors import NotFoundError, UsageError
from braid.format.layout import VERIFY_RUNS, verify_run_prefix
from braid.format.verification import VerificationRecord
from braid.ops.verification import new_record, write_record
from braid.pipeline.verify_request import PLAN_OBJECT, ItemOutcome, PlannedBackup, VerifyItem
from braid.ports.pipeline import EventPublisher
from braid.ports.store import ObjectStore

REPORTED_FAILURES = 20  # per backup in the execution's output (the record keeps up to MAX_LISTED_FAILURES)
EVENT_FAILURES = 10
OUTPUT_BUDGET = 200_000  # bytes of the execution's output, under Step Functions' 256 KiB with room for the state around it


@dataclass
class RunReport:
    records: list[VerificationRecord] = field(default_factory=list)
    gone: list[dict[str, str]] = field(default_factory=list)  # {"backup", "error", "mode"}: removed before they were checked

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.records) and not self.gone

    @property
    def failed(self) -> list[VerificationRecord]:
        return [r for r in self.records if not r.ok]

    def to_json(self, budget: int = OUTPUT_BUDGET) -> dict[str, Any]:
        """The execution's output (braid.cli.render.print_verify_reports prints it), under Step Functions' 256 KiB: a run
        over thousands of backups first lists fewer failures per backup, then only the failed backups, counting the rest
        ("omitted_ok"); every record beside its backup stays whole."""
        for failures, only_failed in ((REPORTED_FAILURES, False), (1, False), (1, True)):
            reports = [self._report(r, failures) for r in self.records if not (only_failed and r.ok)]
            reports += [{"backup": g["backup"], "mode": g["mode"], "ok": False, "corrupt": False, "failures": [g["error"]]} for g in self.gone]
            doc: dict[str, Any] = {"ok": self.ok, "reports": reports}
            if only_failed:
                doc["omitted_ok"] = sum(1 for r in self.records if r.ok)
            if len(json.dumps(doc)) <= budget:
                break
        return doc

    @staticmethod
    def _report(r: VerificationRecord, failures: int) -> dict[str, Any]:
        shown = {k: v for k, v in r.to_json().items() if k not in ("engine", "outcome")}
        return {**shown, "ok": r.ok, "failures": r.failures[:failures]}


def _worker_error(row: Mapping[str, Any]) -> str:
    """A failed child's error as a person reads it: the Lambda's own errorType and errorMessage when it left them."""
    error, cause = str(row.get("Error") or "error"), str(row.get("Cause") or "")
    try:
        parsed = json.loads(cause)
        if isinstance(parsed, dict) and parsed.get("errorMessage"):
            return f"{parsed.get('errorType', error)}: {parsed['errorMessage']}"
    except ValueError:
        pass
    return f"{error}: {cause}" if cause else error


def export_key(s3_key: str) -> str:
    """The repository-relative key of an object the map's ResultWriter exported: the stack points it at `verify-runs/`
    under the repository's prefix, and Step Functions names the full S3 key."""
    at = s3_key.find(VERIFY_RUNS)
    if at < 0 or (at > 0 and s3_key[at - 1] != "/"):
        raise UsageError(f"the verify map exported its results to {s3_key}, outside {VERIFY_RUNS}: redeploy the stack")
    return s3_key[at:]


def map_outcomes(store: ObjectStore, results: Mapping[str, Any] | None) -> tuple[list[ItemOutcome], list[str]]:
    """Every item's outcome from the map's ResultWriter export, and the export's keys (to delete)."""
    if not results:
        return [], []
    details = results.get("ResultWriterDetails") or {}
    manifest_key = export_key(str(details["Key"]))
    manifest = json.loads(store.get(manifest_key))
    keys = [manifest_key]
    outcomes: list[ItemOutcome] = []
    files = manifest.get("ResultFiles", {})
    for status in ("SUCCEEDED", "FAILED"):
        for entry in files.get(status, []):
            key = export_key(str(entry["Key"]))
            keys.append(key)
            for row in json.loads(store.get(key)):
                if status == "SUCCEEDED":
                    outcomes.append(ItemOutcome.from_json(json.loads(row["Output"])))
                    continue
                given = json.loads(row["Input"])
                # The child's input is the ItemSelector's {"prefix", "item"}; accept the bare item too
                # (the emulator records the item before the selector applies).
                item = VerifyItem.from_json(given["item"] if isinstance(given, dict) and "item" in given else given)
                error = _worker_error(row)
                outcomes.append(
                    ItemOutcome(
                        item.backup,
                        failures=[(i, f"chunk {i} of backup {item.backup} was not checked: the verify worker failed: {error}") for i in item.chunks],
                        corrupt=str(row.get("Error")) == "IntegrityError",
                    )
                )
    return outcomes, keys


def fold(planned: PlannedBackup, outcomes: list[ItemOutcome], mode: str, at: datetime) -> VerificationRecord:
    mine = [o for o in outcomes if o.backup == planned.backup]
    failures = sorted((f for o in mine for f in o.failures), key=lambda f: f[0])  # stable: each outcome's own order kept
    checked = sum(o.chunks_checked for o in mine)
    accounted = checked + sum(1 for f in failures if 0 <= f[0] < planned.chunks_total) if mode == "deep" else planned.chunks_selected
    messages = [m for _, m in failures]
    if planned.chunks_total and accounted < planned.chunks_selected:
        missing = planned.chunks_selected - accounted
        messages.append(f"{missing} selected chunk(s) of backup {planned.backup} were not checked: the verify map reported no result for them")
    return new_record(
        planned.backup,
        mode=mode,
        selection=planned.selection,
        engine=ENGINE_STEPFUNCTIONS,
        chunks_total=planned.chunks_total,
        chunks_checked=checked,
        bytes_checked=sum(o.bytes_checked for o in mine),
        failures=messages,
        corrupt=any(o.corrupt for o in mine),
        at=at,
    )


def record_run(store: ObjectStore, run: str, results: Mapping[str, Any] | None, events: EventPublisher, now: datetime) -> RunReport:
    prefix = verify_run_prefix(run)
    try:
        plan = json.loads(store.get(f"{prefix}{PLAN_OBJECT}"))
    except NotFoundError:
        raise UsageError(f"verify run {run} has no plan ({prefix}{PLAN_OBJECT}): was it recorded already?") from None
    planned = [PlannedBackup.from_json(b) for b in plan["backups"]]
    outcomes = [ItemOutcome.from_json(o) for o in plan["outcomes"]]
    found, export_keys = map_outcomes(store, results)
    outcomes.extend(found)
    report = RunReport(gone=[{"backup": str(g["backup"]), "error": str(g["error"]), "mode": str(plan["mode"])} for g in plan.get("gone", [])])
    for backup in planned:
        record = fold(backup, outcomes, str(plan["mode"]), now)
        write_record(store, record)
        report.records.append(record)
    # Announced once recorded: whoever reacts finds the record beside the backup.
    for record in report.failed:
        events.publish(VERIFY_FAILED, {"repository": store.url, "backup": record.backup, "failures": record.failures[:EVENT_FAILURES]})
    store.delete([*(i.key for i in store.list(prefix)), *export_keys])
    return report
