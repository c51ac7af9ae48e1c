"""The grammar of the commands that work on stored backups, not on a stream: list, show, prices, copy, rekey, verify, prune, forget.

braid.cli.parser declares them through its command table; like every
command they declare only their own options, import their handlers when
they run, and check a value's type (durations, percentages) only when one
is given.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from braid.cli import chain_options, storage_options
from braid.cli.parser import _backup_name, _command, _cores, _help, _positive_int, _Shared
from braid.errors import UsageError

if TYPE_CHECKING:
    from braid.cli.parser import Subparsers
    from braid.format.policy import Duration


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError("--sample must be in (0, 100]")
    return value


def _finite_range(unit: str, maximum: float) -> Callable[[str], float]:
    """A number in [0, maximum]: nan, inf and values no clock can subtract (1e12 days) are usage errors, not tracebacks."""

    def parse(text: str) -> float:
        import math

        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not math.isfinite(value) or not 0 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be a number of {unit} from 0 to {maximum:,.0f}, not {text!r}")
        return value

    return parse


MAX_KEEP_DAYS = 1_000_000.0  # ~2,700 years: beyond it "keep" is forever, and timedelta overflows near 1e9 days


def _duration(text: str) -> Duration:
    from braid.format.policy import Duration

    try:
        return Duration.parse(text, user=True)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--keep-within ")) from None



def declare_list(sub: Subparsers, shared: _Shared) -> None:
    lister = sub.add_parser("list", parents=[shared.common], **_help(
        "list",
        "braid list --repo /srv/braid",
        "braid list --name pg --json",
        "braid list --incomplete",
        description="List the backups whose manifest was published and verified, oldest first (no key needed)."
                    " RATIO is stored/original size (smaller is better); SAVED is the share compression saved.",
    ))
    lister.add_argument("--name", help="only backups with this name")
    lister.add_argument("--label", action="append", metavar="KEY=VALUE", help="only backups with this label (repeat: all of them)")
    lister.add_argument("--incomplete", action="store_true",
                        help="backups in progress or abandoned: local leftovers and cloud staging sessions, with how to resume or collect them")
    lister.add_argument("--rebuild-catalog", action="store_true",
                        help="rebuild the catalog from the manifests (reads every one; the repair path, see docs/format.md)")
    lister.set_defaults(handler=_command("catalog:cmd_list"))


def declare_show(sub: Subparsers, shared: _Shared) -> None:
    show = sub.add_parser("show", parents=[shared.common], **_help(
        "show",
        "braid show pg@latest",
        "braid show pg@20261123T020000.000Z-1a2b3c4d --json",
    ))
    show.add_argument("backup", metavar="NAME@ID", help="the backup, or NAME@latest for the newest")
    show.set_defaults(handler=_command("catalog:cmd_show"))


def declare_prices(sub: Subparsers, shared: _Shared) -> None:
    prices = sub.add_parser("prices", parents=[shared.common], **_help(
        "prices",
        "braid prices show",
        "braid prices set name=eu-central-1 date=2026-11-01 s3_put_request=0.0000054 s3_storage_gb_month=0.0245",
        "braid prices reset",
        description="Every manifest records what its backup used (requests, Lambda GB-seconds, Step Functions, bytes);"
                    " 'show' prices it with this table, stored in the repository (prices.json): AWS us-east-1 list prices"
                    " unless the repository stores its own. Prices are per single unit.",
    ))
    prices.add_argument("action", choices=("show", "set", "reset"), help="print the table; set KEY=VALUE prices (and name, date, currency); go back to the defaults")
    prices.add_argument("settings", nargs="*", metavar="KEY=VALUE", help="with set: a price key and its price per unit, or name, date or currency")
    prices.set_defaults(handler=_command("prices:cmd_prices"))


def declare_copy(sub: Subparsers, shared: _Shared) -> None:
    copy = sub.add_parser("copy", parents=[shared.common, shared.quieting], **_help(
        "copy",
        "braid copy pg@latest --to /mnt/offsite/braid --to-key-file /etc/braid/offsite.key",
        "braid copy --all --name pg --to s3://dr-bucket/prod            # a rerun copies only what is missing",
        description="Copy backups to a second repository (a directory or s3://, another region or account): chunks are"
                    " copied as stored, never decrypted; each data key is re-wrapped for the target's master key or KMS"
                    " key; the copy's manifest is published last and verified. Idempotent and resumable; a chain's"
                    " ancestors are copied first. Retention runs per repository.",
    ))
    copy.add_argument("backup", nargs="?", metavar="NAME@ID", help="the backup, or NAME@latest for the newest")
    copy.add_argument("--all", action="store_true", help="every backup (of --name, if given)")
    copy.add_argument("--name", type=_backup_name, metavar="NAME", help="with --all: only this name's backups")
    copy.add_argument("--to", required=True, metavar="REPO2", help="the target repository (made with braid init)")
    copy.add_argument("--to-key-file", metavar="PATH", help="the target's master-key file when it is not at its default path")
    copy.add_argument("--workers", type=_positive_int, default=4, metavar="N", help="objects copied at once (default 4)")
    copy.set_defaults(handler=_command("copy:cmd_copy"))


def declare_rekey(sub: Subparsers, shared: _Shared) -> None:
    rekey = sub.add_parser("rekey", parents=[shared.common, shared.quieting], **_help(
        "rekey",
        "braid rekey --new-key-file /etc/braid/master-2027.key",
        "braid rekey --repo s3://bucket/prod --kms-key arn:aws:kms:eu-west-1:111122223333:key/NEW",
        description="Re-wrap every backup's data key under a new master key (a local key file) or KMS key, rewriting"
                    " only manifests (chunk data is never touched). Safe to interrupt and run again: each manifest is"
                    " replaced by a verified copy, and the repository's key setting switches last.",
    ))
    new_key = rekey.add_mutually_exclusive_group()
    new_key.add_argument("--kms-key", metavar="ARN", help="s3:// repositories: re-wrap under this KMS key (KMS ReEncrypt)")
    new_key.add_argument("--new-key-file", metavar="PATH", help="local repositories: re-wrap under this master-key file (created if missing)")
    rekey.set_defaults(handler=_command("rekey:cmd_rekey"))


def declare_verify(sub: Subparsers, shared: _Shared) -> None:
    verify = sub.add_parser("verify", parents=[shared.common, shared.quieting], **_help(
        "verify",
        "braid verify pg@latest",
        "braid verify --all --deep --sample 10",
        "braid verify --repo s3://bucket/prod pg@latest --deep --rotate 7",
        description="Check backups without restoring them: quick (every chunk present with its size and checksum, no"
                    " key needed) or --deep (decrypt, decompress and check every chunk's plaintext). On an s3://"
                    " repository with a stack the cloud checks them (the host downloads nothing). Each result is"
                    " recorded beside the backup (shown by show and list). Exit 6 if something is wrong, 7 if chunks"
                    " could not be read.",
    ))
    target = verify.add_mutually_exclusive_group(required=True)
    target.add_argument("backup", nargs="?", metavar="NAME@ID", help="the backup, or NAME@latest for the newest")
    target.add_argument("--all", action="store_true", help="every backup in the repository")
    target.add_argument("--wal", action="store_true",
                        help="the WAL archive of --name: continuous from each backup's start to the newest segment? names every gap")
    verify.add_argument("--name", type=_backup_name, metavar="NAME", help="with --wal: the archive's name")
    verify.add_argument("--deep", action="store_true", help="decrypt, decompress and check every chunk's plaintext")
    chain_options.add_verify_options(verify)
    chunks = verify.add_mutually_exclusive_group()
    chunks.add_argument("--sample", type=_percent, metavar="PCT", help="check a random PCT%% of chunks")
    chunks.add_argument("--rotate", type=_positive_int, metavar="N",
                        help="check the next 1/N of the chunks after the last --rotate N run's: N runs check every chunk once")
    verify.add_argument("--workers", type=_positive_int, default=max(4, _cores()), metavar="N", help="parallel checks (default: cores, at least 4)")
    verify.add_argument("--engine", choices=("local", "stepfunctions"),
                        help="who reads the chunks: this host (local), or the stack's verify state machine (default for s3:// with a stack)")
    verify.set_defaults(handler=_command("verify:cmd_verify"))


def declare_prune(sub: Subparsers, shared: _Shared) -> None:
    prune = sub.add_parser("prune", parents=[shared.common, shared.quieting], **_help(
        "prune",
        "braid prune --keep-daily 7 --keep-weekly 5 --dry-run",
        "braid prune --name pg --keep-daily 7 --keep-monthly 12 --save-policy",
        "braid prune                                      # each name's stored policy",
        description="Keep the union of the --keep-* rules per backup name (restic's 'forget --keep-*'); buckets are UTC"
                    " calendar periods counted back from the name's newest backup. Without --keep-* rules, each name's"
                    " policy stored in the repository applies, and names without one are left alone.",
    ))
    prune.add_argument("--name", type=_backup_name, metavar="NAME", help="only this name's backups (and leftovers)")
    prune.add_argument("--keep-last", type=_positive_int, metavar="N", help="keep the newest N backups of each name")
    for period, unit in (("hourly", "hour"), ("daily", "day"), ("weekly", "ISO week"), ("monthly", "month"), ("yearly", "year")):
        prune.add_argument(f"--keep-{period}", type=_positive_int, metavar="N",
                           help=f"keep the newest backup of each of the last N {unit}s (UTC) that have one")
    prune.add_argument("--keep-within", type=_duration, metavar="DURATION",
                       help="keep every backup started within DURATION (e.g. 2y5mo7d3h) of the name's newest backup")
    prune.add_argument("--keep-days", type=_finite_range("days", MAX_KEEP_DAYS), metavar="D",
                       help="keep every backup started in the last D days (counted from now)")
    stored = prune.add_mutually_exclusive_group()
    stored.add_argument("--save-policy", action="store_true",
                        help="store the --keep-* rules as --name's policy in the repository (prunes nothing)")
    stored.add_argument("--show-policy", action="store_true", help="print the stored policies (of --name, or all)")
    stored.add_argument("--delete-policy", action="store_true", help="remove --name's stored policy (prunes nothing)")
    prune.add_argument("--orphan-grace-hours", type=_finite_range("hours", MAX_KEEP_DAYS * 24), default=48.0, metavar="H",
                       help="collect data of backups that never completed (and temporary files of interrupted writes)"
                            " once idle for H hours since their last activity (default 48, at least 1)")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    storage_options.add_prune_options(prune)
    prune.set_defaults(handler=_command("prune:cmd_prune"))


def declare_forget(sub: Subparsers, shared: _Shared) -> None:
    forget = sub.add_parser("forget", parents=[shared.common, shared.quieting], **_help(
        "forget",
        "braid forget pg@20261123T020000.000Z-1a2b3c4d --dry-run",
    ))
    forget.add_argument("backup", metavar="NAME@ID", help="the exact backup (not NAME@latest); its manifest may be unreadable")
    forget.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    chain_options.add_forget_options(forget)
    forget.set_defaults(handler=_command("forget:cmd_forget"))
