"""What the CLI prints: text for people, JSON for scripts.

Output is a contract (scripts parse the JSON, people grep the tables), so
every layout lives here, apart from the commands that decide what to show.
Data (JSON, tables, backup ids) goes to stdout; notes meant only for the
person at the terminal go to stderr, so `braid list > file` keeps just data.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from braid.cli.sizes import format_size
from braid.cli.storage_render import storage_line
from braid.format.ids import BackupRef
from braid.format.lock import ObjectLock
from braid.format.manifest import Manifest
from braid.format.prices import DEFAULT, UNITS, PriceTable, cost_totals, price
from braid.format.repository import RepositoryConfig
from braid.format.storage_class import PRICE_KEYS
from braid.format.summary import BackupSummary
from braid.format.timestamps import format_timestamp, parse_timestamp
from braid.format.usage import Billed, Usage
from braid.ports.progress import SCHEMA_VERSION

if TYPE_CHECKING:  # annotations only: `braid backup` need not import init's, rekey's and verify's modules
    from braid.format.verification import VerificationRecord
    from braid.ops.init import LocalInit
    from braid.ops.rekey import RekeyReport


def document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON document as Braid prints it: `schema_version` first (braid.ports.progress.SCHEMA_VERSION)."""
    return {"schema_version": SCHEMA_VERSION, **doc}


def print_json(value: Mapping[str, Any] | list[dict[str, Any]], indent: int | None = 2) -> None:
    """One JSON document on stdout; a list (`list`, `verify`: kept as arrays for existing scripts) carries the version in each element."""
    shaped: Any = [document(row) for row in value] if isinstance(value, list) else document(value)
    print(json.dumps(shaped, indent=indent))


def operation_summary(manifest: Manifest, operation: str, elapsed: float) -> dict[str, Any]:
    """What a backup or restore did: the `done` event's fields and `backup --json`'s document."""
    summary = {
        "operation": operation,
        "bytes": manifest.plaintext_bytes,
        "rate": round(manifest.plaintext_bytes / elapsed, 1) if elapsed > 0 else 0.0,
        **manifest_summary(manifest),
    }
    summary.pop("wal", None)  # not in the progress vocabulary's `done` (braid.ports.progress): `show` and `list` give it
    return summary


def print_backup_result(summary: dict[str, Any], elapsed: float, as_json: bool, quiet: bool) -> None:
    """`backup` on stdout: NAME@ID (nothing with --quiet), or with --json the summary document."""
    if as_json:
        print_json({"status": "published", **summary, "elapsed": round(elapsed, 3)}, indent=None)
    elif not quiet:
        print(summary["backup"])


def manifest_summary(manifest: Manifest) -> dict[str, Any]:
    """One backup in a line: a `list` row (`show --json` adds `labels`), and the final `done` progress event."""
    row = summary_row(BackupSummary.of(manifest))
    del row["labels"]  # not a field of the `done` event's vocabulary (README, JSON events)
    return row


def summary_row(summary: BackupSummary) -> dict[str, Any]:
    """A `list` row from a catalog summary (braid.format.summary): the same fields the manifest gives."""
    name, _, ident = summary.backup.partition("@")
    return {
        "backup": summary.backup,
        "name": name,
        "id": ident,
        "created": summary.created,
        "completed": summary.completed,
        "engine": summary.engine,
        "inputs": summary.inputs,
        "chunks": summary.chunks,
        "plaintext_bytes": summary.plaintext_bytes,
        "stored_bytes": summary.stored_bytes,
        "ratio": round(summary.ratio, 4),
        "wal": summary.wal,
        "labels": dict(summary.labels or {}),
    }


def print_local_init(result: LocalInit, as_json: bool) -> None:
    if as_json:
        print_json({"repository": str(result.root), "id": result.repository.config.id, "key_file": str(result.key_file), "key_id": result.key_id}, indent=None)
        return
    if result.created_key:
        note = f"created key file {result.key_file} (0600): keep a copy somewhere safe; without it no backup can be restored"
    else:
        note = f"using existing key file {result.key_file}"
    print(f"initialised repository {result.root} (id {result.repository.config.id})", file=sys.stderr)
    print(note, file=sys.stderr)


def print_cloud_init(url: str, config: RepositoryConfig, stack: str, as_json: bool) -> None:
    if as_json:
        print_json({"repository": url, "id": config.id, "key_id": config.key["key_id"], **config.cloud}, indent=None)
    else:
        print(f"initialised repository {url} (id {config.id}) on stack {stack}", file=sys.stderr)


def print_store_init(url: str, config: RepositoryConfig, as_json: bool) -> None:
    """An object-store repository with no pipeline whose data keys a KMS key wraps."""
    if as_json:
        print_json({"repository": url, "id": config.id, "key_id": config.key["key_id"]}, indent=None)
    else:
        print(f"initialised repository {url} (id {config.id}); data keys wrapped by {config.key['key_id']}", file=sys.stderr)


TINY = 4096  # below this, SAVED shows "-"


def saved(plaintext_bytes: int, stored_bytes: int) -> str:
    """The share of the original size that compression saved, as other backup tools show it: "69%" (negative: it grew by at least 1%)."""
    if plaintext_bytes < TINY:  # a few bytes: the frame's fixed overhead, not compression, decides the figure (-1517%)
        return "-"
    return f"{math.trunc(100 * (1 - stored_bytes / plaintext_bytes))}%"  # towards zero: 99.8% saved is not "100%", 0.01% lost is not "-1%"


def labels_text(labels: Mapping[str, str] | None) -> str:
    """Labels as typed (`env=prod ticket=DBA-42`), or "-" for none."""
    return " ".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or "-"


def _width(rows: list[dict[str, Any]], key: str, header: str) -> int:
    """A column as wide as its longest value: names run to 48 characters, ids to 28."""
    return max([len(header), *(len(str(row[key])) for row in rows)])


def print_backup_list(rows: list[dict[str, Any]], as_json: bool, empty: str = "no backups") -> None:
    """`rows`: manifest summaries, or {"backup", "error", "created"} for an unreadable manifest.

    RATIO is stored over original size (the JSON field `ratio`, lower is
    better); SAVED is the same figure as the saving other tools print.
    """
    if as_json:
        # One row per line, each by the C encoder: `indent` would switch to the pure-Python one,
        # which took longer than reading the whole catalog at 10,000 backups (scripts/bench catalog).
        print("[\n" + ",\n".join("  " + json.dumps(document(row)) for row in rows) + "\n]" if rows else "[]")
        return
    if not rows:
        print(empty, file=sys.stderr)
        return
    width = _width(rows, "backup", "BACKUP")
    now = datetime.now(UTC)
    wal = any(row.get("wal") for row in rows)  # a PostgreSQL base backup's WAL range, when any row has one
    labelled = any(row.get("labels") for row in rows)
    marks = [verified_column(row.get("verified"), now) if "error" not in row else "" for row in rows]
    marks_width = max([len("VERIFIED"), *map(len, marks)]) if wal or labelled else 0
    last = f"{'VERIFIED':<{marks_width}}" + ("  WAL (TIMELINE START..STOP)" if wal else "") + ("  LABELS" if labelled else "")
    print(f"{'BACKUP':<{width}}  {'CREATED':<19}  {'SIZE':>10}  {'STORED':>10}  {'RATIO':>6}  {'SAVED':>5}  {'CHUNKS':>7}  {last.rstrip()}")
    for row, mark in zip(rows, marks, strict=True):
        if "error" in row:
            print(f"{row['backup']:<{width}}  UNREADABLE: {row['error']}")
            continue
        print(
            f"{row['backup']:<{width}}  {row['created'][:19]:<19}  {format_size(row['plaintext_bytes']):>10}"
            f"  {format_size(row['stored_bytes']):>10}  {row['ratio']:>6.3f}  {saved(row['plaintext_bytes'], row['stored_bytes']):>5}  {row['chunks']:>7}"
            f"  {mark:<{marks_width}}{wal_column(row.get('wal')) if wal else ''}"
            f"{'  ' + labels_text(row.get('labels')) if labelled else ''}{_chain_column(row)}"
        )
    print("RATIO: stored size / original size (lower is better); SAVED: 1 - RATIO", file=sys.stderr)


def _chain_column(row: Mapping[str, Any]) -> str:
    """After VERIFIED, for an incremental only: the parent it restores on top of."""
    return f"  incremental of {row['parent']}" if row.get("kind") == "incremental" else ""
def wal_column(wal: Mapping[str, Any] | None) -> str:
    """`list`'s WAL column: "  1 0/2000028..0/2000100", or "  -" for a backup without WAL information."""
    if not wal:
        return "  -"
    return f"  {wal.get('timeline', '?')} {wal.get('start_lsn', '?')}..{wal.get('stop_lsn', '?')}"


def print_wal(manifest: Manifest) -> None:
    """`show`'s lines for a PostgreSQL base backup: its WAL range, system and the metadata kept beside it."""
    if manifest.wal is not None:
        w = manifest.wal.fields
        segments = f" ({w.get('start_wal', '?')} .. {w.get('stop_wal', '?')})" if "start_wal" in w else ""
        print(f"wal         timeline {w.get('timeline', '?')}, {w.get('start_lsn', '?')} .. {w.get('stop_lsn', '?')}{segments}")
        print(f"postgresql  version {w.get('pg_version', '?')}, system identifier {w.get('system_identifier', '?')}, label {w.get('label', '?')!r}")
    for kind, entry in sorted(manifest.metadata.items()):
        print(f"metadata    {kind}: {entry.length} bytes, stored encrypted ({entry.stored_length} bytes)")


def print_incomplete_list(rows: list[dict[str, Any]], as_json: bool) -> None:
    """`list --incomplete`: IncompleteBackup JSON, one row each, and what to do about it."""
    if as_json:
        print_json(rows)
        return
    if not rows:
        print("no incomplete backups", file=sys.stderr)
        return
    width = _width(rows, "backup", "BACKUP")
    where = max(len("WHERE"), *(len("+".join(row["where"])) for row in rows))
    state = _width(rows, "state", "STATE")
    print(f"{'BACKUP':<{width}}  {'WHERE':<{where}}  {'STATE':<{state}}  {'STARTED':<19}  {'LAST ACTIVITY':<19}  {'STORED':>10}  HINT")
    for row in rows:
        stored = row["stored_bytes"] if row["staged_bytes"] is None else row["staged_bytes"]
        print(
            f"{row['backup']:<{width}}  {'+'.join(row['where']):<{where}}  {row['state']:<{state}}  {row['started'][:19]:<19}"
            f"  {(row['last_activity'] or '-')[:19]:<19}  {format_size(stored):>10}  {row['hint']}"
        )


def retention_detail(manifest: Manifest, lock: ObjectLock | None) -> dict[str, str] | None:
    """`show`'s Object Lock line: the mode and the date the backup's chunks and manifest are kept until (None: no lock)."""
    if lock is None:
        return None
    return {"mode": lock.mode, "until": format_timestamp(lock.until(BackupRef.parse(manifest.backup)))}


def usage_fields(usage: Usage | None, prices: PriceTable | None, storage_key: str = "s3_storage_gb_month") -> dict[str, Any]:
    """`show --json`: the `list` row's `usage` and `cost` (billed_fields), and `usage_detail` (`requests` by
    operation, `lambda` by function) and `cost_lines` (item, quantity, unit price, cost); null without a usage.
    `prices` None (a directory repository without `braid prices set`): `cost` and `cost_lines` null."""
    if usage is None:
        return {"usage": None, "cost": None, "usage_detail": None, "cost_lines": None}
    detail = usage.to_json()
    if prices is None:
        return {"usage": usage.billed(), "cost": None, "usage_detail": {"requests": detail["requests"], "lambda": detail["lambda"]}, "cost_lines": None}
    cost = price(usage, prices, storage_key).to_json()
    return {
        **billed_fields(usage.billed(), prices, storage_key),
        "usage_detail": {"requests": detail["requests"], "lambda": detail["lambda"]},
        "cost_lines": cost["lines"],
    }


def billed_fields(billed: Billed | None, prices: PriceTable, storage_key: str = "s3_storage_gb_month") -> dict[str, Any]:
    """`list --json`'s `usage` (the billed quantities a catalog summary keeps) and `cost` (totals, no lines)."""
    if billed is None:
        return {"usage": None, "cost": None}
    return {"usage": billed, "cost": cost_totals(billed, prices, storage_key)}


def list_row(summary: BackupSummary) -> dict[str, Any]:
    """`list --json`'s row: the summary's fields and the backup's place in its chain (kind, parent, chain_full)."""
    return {**summary_row(summary), **summary.lineage.to_json()}


def manifest_detail(manifest: Manifest, prices: PriceTable | None = DEFAULT, lock: ObjectLock | None = None, storage_key: str = "s3_storage_gb_month") -> dict[str, Any]:
    """`show --json`: the summary plus how the backup was made, what each input holds, and what it used and cost."""
    return {
        **manifest_summary(manifest),
        **manifest.lineage.to_json(),
        **usage_fields(manifest.usage, prices, storage_key),
        "chunk_size": manifest.chunk_size,
        "algorithms": manifest.algorithms,
        "key_id": manifest.key.key_id,
        "rekeyed": manifest.rekeyed,
        "copied": manifest.copied,
        "labels": dict(manifest.labels or {}),
        "object_lock": retention_detail(manifest, lock),
        "timings": manifest.timings,
        "stats": manifest.stats,
        "metadata": {kind: entry.to_json() for kind, entry in sorted(manifest.metadata.items())},
        "input_details": [
            {"index": i.index, "source": i.source, "bytes": i.length, "chunks": len(i.chunks), "stored_bytes": sum(c.stored_length for c in i.chunks)}
            for i in manifest.inputs
        ],
    }


def verified_column(verified: Mapping[str, Any] | None, now: datetime | None = None) -> str:
    """`list`'s VERIFIED: "deep 2d ago ok", "quick 3h ago FAILED", or "-" for a backup never verified."""
    if not verified:
        return "-"
    outcome = "ok" if verified["outcome"] == "ok" else "FAILED"
    return f"{verified['mode']} {age(parse_timestamp(verified['at']), now)} {outcome}"


def age(moment: datetime, now: datetime | None = None) -> str:
    seconds = max(0.0, ((now or datetime.now(UTC)) - moment).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return "just now"


def verification_line(record: VerificationRecord | None) -> str:
    if record is None:
        return "never (braid verify NAME@ID [--deep])"
    outcome = "ok" if record.ok else f"FAILED ({record.failure_count} problem(s); first: {record.failures[0] if record.failures else '?'})"
    return (
        f"{record.mode} {record.at} by {record.engine}: {outcome};"
        f" {record.selection.describe()}, {record.chunks_checked}/{record.chunks_total} chunks checked"
    )


def print_manifest(
    manifest: Manifest,
    as_json: bool,
    prices: PriceTable | None = DEFAULT,
    lock: ObjectLock | None = None,
    verification: VerificationRecord | None = None,
    storage: dict[str, Any] | None = None,
) -> None:
    """`storage`: the backup's `storage` field (braid.cli.storage_render.storage_fields): its class, since when, per month."""
    where = (storage or {}).get("storage") or {}
    storage_key = PRICE_KEYS.get(where.get("class", ""), "s3_storage_gb_month")
    detail = manifest_detail(manifest, prices, lock, storage_key)
    detail.update(storage or {})
    # `verified` as `list` shows it; `verification` the whole newest record.
    detail["verified"] = {"at": verification.at, "mode": verification.mode, "outcome": verification.outcome} if verification is not None else None
    detail["verification"] = verification.to_json() if verification is not None else None
    if as_json:
        print_json(detail)
        return
    print(f"backup      {manifest.backup}")
    print(f"created     {manifest.created}")
    print(f"completed   {manifest.completed}")
    print(f"engine      {manifest.engine}")
    if manifest.lineage.is_incremental:
        print(f"kind        incremental of {manifest.lineage.parent} (chain from the full {manifest.lineage.chain_full})")
    print(f"size        {format_size(manifest.plaintext_bytes)} ({manifest.plaintext_bytes} bytes)")
    print(
        f"stored      {format_size(manifest.stored_bytes)} ({manifest.stored_bytes} bytes), ratio {manifest.ratio:.3f} (stored/size),"
        f" saved {saved(manifest.plaintext_bytes, manifest.stored_bytes)}"
    )
    print(f"chunks      {manifest.chunk_count} of up to {format_size(manifest.chunk_size)}")
    print(f"algorithms  zstd level {manifest.algorithms.get('level')}, {manifest.algorithms.get('cipher')}")
    rekeyed = f" (re-wrapped {manifest.rekeyed['at']}, before under {manifest.rekeyed['from']})" if manifest.rekeyed else ""
    print(f"key         {manifest.key.key_id}{rekeyed}")
    if manifest.copied:
        print(f"copied      from repository {manifest.copied['from']} on {manifest.copied['at']} (braid copy)")
    if manifest.labels:
        print(f"labels      {labels_text(manifest.labels)}")
    if detail["object_lock"] is not None:
        print(f"retention   Object Lock {detail['object_lock']['mode']} until {detail['object_lock']['until']}")
    print("timings     " + ", ".join(f"{k} {v:.3f}s" for k, v in manifest.timings.items()))
    for entry in detail["input_details"]:
        print(f"input {entry['index']}     {entry['source']}: {format_size(entry['bytes'])} in {entry['chunks']} chunks")
    print_wal(manifest)
    print(f"verified    {verification_line(verification)}")
    if where:
        print(f"storage     {storage_line(where)}")
    print_usage(manifest.usage, prices, storage_key)


def _amount(value: float) -> str:
    """A money amount: to a hundredth of a cent, or to a millionth when it is below a cent (a small backup's requests)."""
    return f"{value:.6f}" if 0 < value < 0.01 else f"{value:.4f}"


def print_usage(usage: Usage | None, prices: PriceTable | None, storage_key: str = "s3_storage_gb_month") -> None:
    """`show`'s usage lines and cost table: item, quantity and cost, with the price table they were priced with
    (none for `prices` None: a directory repository without `braid prices set`)."""
    if usage is None:
        print("usage       not recorded (the backup was made before Braid recorded usage)")
        return
    staged = f"staged {format_size(usage.staged_bytes)}, " if usage.staged_bytes else ""
    cpu = f", {usage.cpu_seconds:.2f} CPU-seconds on this host" if usage.cpu_seconds else ""
    if prices is None:
        print(f"usage       {staged}stored {format_size(usage.stored_bytes)}{cpu}")
        return
    print(f"usage       {staged}stored {format_size(usage.stored_bytes)}{cpu}; {usage.s3_requests('free')} S3 DELETE/abort requests (free)")
    cost = price(usage, prices, storage_key)
    print(f"cost        priced with '{cost.table}' ({cost.date}, {cost.currency}; see 'braid prices show')")
    width = max(len(line.item) for line in cost.lines)
    print(f"  {'ITEM':<{width}}  {'QUANTITY':>12}  {cost.currency:>10}")
    for line in cost.lines:
        if not line.quantity:
            continue  # nothing of it used (a local backup uses no Lambda); `show --json` lists every item
        quantity = f"{line.quantity:,.3f}" if isinstance(line.quantity, float) and not line.quantity.is_integer() else f"{int(line.quantity):,}"
        print(f"  {line.item:<{width}}  {quantity:>12}  {_amount(line.cost):>10}")
    print(f"  {'total':<{width}}  {'':>12}  {_amount(cost.total):>10}")
    print(f"  {'storage, per month':<{width}}  {format_size(usage.stored_bytes):>12}  {_amount(cost.storage_per_month):>10}")


def print_prices(table: PriceTable, as_json: bool) -> None:
    """`braid prices`: the table `show` prices usage with, and whether the repository stores its own."""
    if as_json:
        print_json({"name": table.name, "date": table.date, "currency": table.currency, "stored": table.stored, "prices": dict(table.prices)})
        return
    source = "stored in the repository" if table.stored else "the defaults (the repository stores no table)"
    print(f"{table.name} ({table.date}, {table.currency}): {source}")
    width = max(len(key) for key in table.prices)
    for key, value in table.prices.items():
        print(f"{key:<{width}}  {value:<14.10g}  per {UNITS[key].removeprefix('a ').removeprefix('an ')}")


def print_verify_reports(reports: list[dict[str, Any]], as_json: bool) -> None:
    """`reports`: VerifyReport JSON, or {"backup", "ok": False, "failures"} for a backup that would not open."""
    if as_json:
        print_json(reports)
        return
    for r in reports:
        status = "ok" if r["ok"] else "FAILED"
        checked = f"{r.get('chunks_checked', 0)}/{r.get('chunks_total', '?')} chunks" if "chunks_total" in r else ""
        selection = r.get("selection") or {}
        part = f"part {selection['part']}/{selection['of']}, " if selection.get("kind") == "rotation" else ""
        print(f"{r['backup']}: {status} ({r.get('mode', 'quick')}, {part}{checked})")
        for failure in r["failures"]:
            print(f"  {failure}")


def print_execution_status(doc: dict[str, object], as_json: bool) -> None:
    """`status --once`: {"backup", "status", "chunks_done", "execution"[, "cause"]}."""
    if as_json:
        print_json(doc, indent=None)
    else:
        print(f"{doc['backup']}: {doc['status']}, {doc['chunks_done']} chunks processed")


def print_rekey(report: RekeyReport, as_json: bool) -> None:
    if as_json:
        print_json(report.to_json())
        return
    for backup in report.rewrapped:
        print(f"re-wrapped {backup}")
    for backup, error in report.failed:
        print(f"FAILED {backup}: {error}")
    for key, error in report.wal.failed:
        print(f"FAILED {key}: {error}")
    note = f"{len(report.rewrapped)} backup(s) re-wrapped under {report.target}, {len(report.already)} already were"
    if report.wal.rewrapped or report.wal.already or report.wal.failed:
        note += f"; {report.wal.rewrapped} WAL object(s) re-wrapped, {report.wal.already} already were"
    if report.config_switched:
        note += "; the repository now names this key"
    print(note, file=sys.stderr)
