"""`braid list` and `braid show`: what the repository holds, read without a key.

Both read records checked against their own checksums only; nothing here
decrypts, so a host without the key can still see what is there. `list`
reads the catalog (braid.ops.catalog: a snapshot, the log since, and the
summaries of recent backups), never every manifest; `show` reads the one
manifest it shows, and its newest verify record (braid.ops.verification).
`list --incomplete` shows what has no manifest yet (braid.ops.incomplete).
`show` prices the backup's recorded usage with the repository's price table
(braid.ops.prices), and so does `list --json` for each backup.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from braid.cli.compose import is_s3_url, open_repository, repo_url
from braid.cli.render import billed_fields, list_row, print_backup_list, print_incomplete_list, print_manifest
from braid.cli.storage_render import storage_fields
from braid.errors import PermissionDeniedError
from braid.format.ids import BackupRef, validate_name
from braid.format.labels import labels_of, matches
from braid.format.layout import PRICES
from braid.format.repository import Repository
from braid.format.storage_class import PRICE_KEYS
from braid.ops.catalog import Unreadable, read_catalog
from braid.ops.incomplete import incomplete_backups
from braid.ops.open import read_manifest
from braid.ops.prices import load_prices
from braid.ops.storage_class import placement_of, placements
from braid.ops.verification import latest_marks, latest_verification


def cmd_list(args: argparse.Namespace) -> int:
    if args.name is not None:
        validate_name(args.name)  # a name is a path component: "../x" is a usage error, not a lookup
    url = repo_url(args.repo)
    repository = open_repository(url)
    if args.incomplete:
        print_incomplete_list([found.to_json() for found in incomplete_backups(repository, args.name)], args.json)
        return 0
    rows: list[dict[str, Any]] = []
    wanted = labels_of(args.label or [])  # list --label KEY=VALUE (repeatable): backups carrying every one
    denied: list[Unreadable] = []
    prices = load_prices(repository.store) if args.json and _priced(repository) else None
    moved = placements(repository.store) if args.json else {}  # each backup's storage class: one LIST of storage/
    # Hosts only read an s3:// repository's catalog (their roles may not write it): the stack's
    # scheduled maintenance keeps its snapshot fresh. A local repository's reader caches it.
    for entry in read_catalog(repository, rebuild=args.rebuild_catalog, write=not is_s3_url(url)).entries:
        if isinstance(entry, Unreadable):
            if isinstance(entry.error, PermissionDeniedError):
                denied.append(entry)  # not damage: skipped, with one warning below
            elif (args.name is None or entry.ref.name == args.name) and not wanted:
                rows.append({"backup": str(entry.ref), "error": str(entry.error), "created": ""})
        elif (args.name is None or entry.backup.partition("@")[0] == args.name) and matches(entry.labels, wanted):
            row = list_row(entry)
            if args.json:
                placement = placement_of(repository.store, BackupRef.parse(entry.backup), moved).to_json()
                key = PRICE_KEYS.get(placement["class"], PRICE_KEYS["STANDARD"])
                row.update(billed_fields(entry.usage, prices, key) if prices is not None else {"usage": entry.usage, "cost": None})
                row.update(storage_fields(placement, entry.stored_bytes, prices))
            rows.append(row)
    # Each backup's newest verification, from the record keys alone: one LIST of verify/, no GET per backup.
    verified = {str(ref): mark.to_json() for ref, mark in latest_marks(repository.store).items()}
    for row in rows:
        row["verified"] = verified.get(row["backup"])
    rows.sort(key=lambda row: (row["created"], row["backup"]))
    empty = f"no backups named {args.name!r}{repository.suggest_name(args.name)}" if args.name and not rows else "no backups"
    print_backup_list(rows, args.json, empty=empty)
    if denied:
        print(
            f"braid: warning: skipped {len(denied)} backup(s) this user may not read (first: {denied[0].ref}: {denied[0].error});"
            " fix permissions (chown -R the repository to its owner)",
            file=sys.stderr,
        )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    repository = open_repository(repo_url(args.repo))
    manifest = read_manifest(repository, BackupRef.parse(args.backup))
    ref = BackupRef.parse(manifest.backup)
    record = latest_verification(repository.store, ref)
    prices = load_prices(repository.store) if _priced(repository) else None
    storage = storage_fields(placement_of(repository.store, ref, placements(repository.store, ref)).to_json(), manifest.stored_bytes, prices)
    print_manifest(manifest, args.json, prices, repository.object_lock, record, storage)
    return 0


def _priced(repository: Repository) -> bool:
    """A directory repository runs up no AWS bill: no cost (show's table, list --json's `cost`) unless `braid prices set` stored a table."""
    return is_s3_url(repository.url) or repository.store.head(PRICES) is not None
