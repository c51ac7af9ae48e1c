"""The command-line options of incremental chains (docs/databases-incremental.md): backup's --incremental, restore's chain forms."""

from __future__ import annotations

import argparse

LINK_DECODERS = ("shared", "per-link")


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
        help="also remove every incremental built on the backup (newest first); without it, a backup with children is refused (exit 14)",
    )


def add_verify_options(verify: argparse.ArgumentParser) -> None:
    verify.add_argument(
        "--chain", action="store_true",
        help="an incremental: verify every ancestor down to its full too, as deeply (an incremental's ancestors are always checked present and readable)",
    )


def add_restore_options(restore: argparse.ArgumentParser) -> None:
    group = restore.add_argument_group(
        "incremental chains",
        "an incremental restores with every ancestor down to its full. With --pgdata DIR, --rebuild in-place (the default when the"
        " work directory is on DIR's file system) applies each link in turn onto one data directory in a private work directory"
        " beside DIR (INCREMENTAL files write only their changed blocks), then renames it into DIR; --rebuild pg_combinebackup"
        " extracts each link there and runs pg_combinebackup into DIR. Disk needed: the sum of the links' sizes (list's SIZE) in"
        " the work directory (in-place: nothing more); pg_combinebackup: as much again for DIR, or the incrementals' sizes with"
        " --link on one file system; checked first, exit 3 if short. A missing or unreadable link, or links that do not follow"
        " each other (backup_label, system identifier) or a corrupt INCREMENTAL file, stop it with exit 6 and DIR untouched",
    )
    group.add_argument(
        "--rebuild", choices=("in-place", "pg_combinebackup"),
        help="how --pgdata rebuilds a chain: in-place (default on one file system; needs no PostgreSQL tool) or"
        " pg_combinebackup (PostgreSQL 17+'s tool, on PATH or in --pg-bin; the default when --work-dir is elsewhere)",
    )
    group.add_argument(
        "--link-decoders", choices=LINK_DECODERS, default="shared",
        help="--rebuild in-place: shared (default) decodes every link on one decoder pool into one set of chunk buffers, each"
        " link's chunks listed once; per-link gives each link a restore pipeline of its own (the off switch)",
    )
    group.add_argument("--work-dir", metavar="DIR", help="where the links are restored (a new directory; default: beside --pgdata); removed afterwards with --pgdata, kept with --chain")
    group.add_argument("--pg-bin", metavar="DIR", help="the directory holding pg_combinebackup, for --rebuild pg_combinebackup (default: PATH)")
    group.add_argument(
        "--chain", action="store_true",
        help="restore every link, oldest first, through the command after --, run once per link with {link} (0: the full),"
        " {link_id} (NAME@ID) and {dir} (WORK-DIR/NN, empty, kept for the database's prepare step)",
    )
