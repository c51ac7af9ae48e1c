"""The command-line options of incremental chains (docs/databases-incremental.md): backup's --incremental, restore's chain forms."""

from __future__ import annotations

import argparse


def add_backup_options(backup: argparse.ArgumentParser) -> None:
    backup.add_argument(
        "--incremental", nargs="?", const="", metavar="NAME@ID",
        help="an incremental on top of NAME@ID (default: the newest complete backup of --name); the command gets"
        " {parent_manifest} (the parent's PostgreSQL backup_manifest, a private file) or {parent_lsn} (MariaDB's to_lsn);"
        " a missing or unreadable parent refuses it (exit 6)",
    )


def add_forget_options(forget: argparse.ArgumentParser) -> None:
    forget.add_argument(
        "--with-children", action="store_true",
        help="also remove every incremental built on the backup (newest first); without it, a backup with children is refused (exit 13)",
    )


def add_verify_options(verify: argparse.ArgumentParser) -> None:
    verify.add_argument(
        "--chain", action="store_true",
        help="an incremental: verify every ancestor down to its full too, as deeply (an incremental's ancestors are always checked present and readable)",
    )
