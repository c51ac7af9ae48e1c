"""The command line's grammar: commands, options, argument types, help text.

Help text and option names are a contract with users' scripts, so they live
here alone; each command's handler is bound with `set_defaults(handler=...)`
and `braid.cli.main` calls it with the parsed namespace.

Start-up is part of every run (a 256 MiB backup takes well under a second),
so this module imports only argparse and what every command's options need
to be declared; what an option needs to check its value (backup names,
durations) is imported when one is given. `build_parser(commands=...)`
declares the options of the named commands only: argparse spends ~0.1 ms
per option (a help formatter and gettext look-ups each), and a run needs
one command's (measured; tests/test_startup.py keeps the imports honest).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from braid import __version__, contract
from braid.cli import chain_options
from braid.cli.help_format import HelpFormatter, RawDescriptionHelpFormatter
from braid.cli.pgdata_options import add_pgdata_options
from braid.cli.sizes import MAX_CHUNK, MIN_CHUNK, format_size, parse_size
from braid.engine.fifo_open import DEFAULT_OPEN_TIMEOUT
from braid.errors import EXIT_CODES, UsageError

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction["_Parser"]  # what declares the commands (argparse names its type only privately)

SUMMARIES = {
    "init": "create a repository (and, locally, its master key)",
    "backup": "back up stdin or --input streams",
    "status": "follow a cloud backup's pipeline execution",
    "restore": "write a backup's original bytes to stdout or --output",
    "list": "list complete backups (or, with --incomplete, unfinished ones)",
    "show": "show one backup's manifest summary",
    "prices": "show or edit the price table that prices each backup's usage",
    "copy": "copy backups to a second repository (chunks as stored; data keys re-wrapped for its key)",
    "rekey": "re-wrap every backup's data key under the current or a new key (rewrites manifests only)",
    "verify": "check backups: quick (presence, size, checksum) or --deep",
    "prune": "forget backups a retention policy lets go, and collect leftovers",
    "forget": "remove one backup (manifest first, then chunks), e.g. one known to be bad",
    "wal-push": "archive one PostgreSQL WAL file (archive_command)",
    "wal-fetch": "fetch one archived WAL file (restore_command)",
    "completion": "print a shell completion script for bash or zsh",
    "manpage": "print the braid(1) manual page (roff)",
}
"""Every command and its one-line help, in the order `braid --help` lists them."""


def _cores() -> int:
    """Cores this process may run on (a container's CPU set, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _epilog() -> str:
    lines = ["exit codes:"] + [f"  {code:>3}  {text}" for code, text in EXIT_CODES.items()]
    lines += [
        "",
        "settings (see docs/usage.md, 'Configuration'): a flag wins over its environment variable, which wins over the config file:",
        "  BRAID_REPO      repository (directory or s3://BUCKET/PREFIX) when --repo is not given",
        "  BRAID_KEY_FILE  master-key file of a local repository when --key-file is not given",
        "  BRAID_<OPTION>  every other long option likewise: --chunk-size is BRAID_CHUNK_SIZE (switches: 1 or 0)",
        "  BRAID_CONFIG    the TOML config file (--config), else ~/.config/braid/config.toml, else /etc/braid/config.toml;",
        "                  its keys are the long options (repo, key_file, chunk_size, ...), also per [commands.NAME] and [names.NAME]",
        "",
        "global options (--repo, --key-file, --config, --json, --debug) go before or after the command:",
        "  braid --repo /srv/braid list",
    ]
    return "\n".join(lines)


def fill(text: str, width: int = 79) -> str:
    """`text` wrapped at spaces into lines of at most `width` characters.

    textwrap.fill(text, width, break_on_hyphens=False) for the one-paragraph,
    single-spaced descriptions here (tests/test_cli_help.py checks they
    agree), without loading textwrap in every run to declare one command.
    """
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


def _help(command: str, *examples: str, description: str | None = None) -> dict[str, Any]:
    """A subcommand's one-line help, its description and its examples: what `braid COMMAND --help` shows first and last."""
    text = SUMMARIES[command]
    return {
        "help": text,
        "description": fill(description or text[0].upper() + text[1:] + "."),
        "epilog": "examples:\n" + "\n".join(f"  {line}" for line in examples),
        "formatter_class": RawDescriptionHelpFormatter,
    }


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _size(option: str, minimum: int, maximum: int | None = None) -> Callable[[str], str]:
    """A byte size (64MiB, 8M, 1G) in range, kept as typed: the command reads it with parse_size.

    Checked here as well so that a bad value from BRAID_CHUNK_SIZE or the
    config file fails naming where it came from, like any other option.
    """

    def check(text: str) -> str:
        try:
            value = parse_size(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f"between {format_size(minimum)} and {format_size(maximum)}" if maximum is not None else f"at least {format_size(minimum)}"
            raise argparse.ArgumentTypeError(f"{option} must be {bounds}")
        return text

    return check


def _backup_name(text: str) -> str:
    from braid.format.ids import validate_name

    try:
        return validate_name(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


MAX_LEVEL = 19  # zstd's highest regular level; --ultra levels need window sizes a chunk worker does not budget for


def _level(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_LEVEL:
        raise argparse.ArgumentTypeError(f"--level must be 1..{MAX_LEVEL}")
    return value


def _open_timeout(text: str) -> float:
    """Seconds, more than 0 and finite: a named pipe must be opened by its other end within them."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"--open-timeout must be a number of seconds more than 0, not {text!r}")
    return value


def _stall_timeout(text: str) -> int:
    """Whole seconds, at least the planner's poll: the pipeline's stall window for this backup."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if value < contract.DEFAULT_POLL_SECONDS:
        raise argparse.ArgumentTypeError(f"--stall-timeout must be at least {contract.DEFAULT_POLL_SECONDS} seconds, not {text!r}")
    return value


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """The handler `braid.cli.commands.MODULE:FUNCTION`, imported only when its command runs.

    Start-up is part of every run: importing every command's modules up
    front (the cloud agent, staging formats, awscrt) cost a `braid restore`
    ~0.1 s it never used, a fifth of a 256 MiB restore (measured).
    """
    module, _, function = name.partition(":")

    def handler(args: argparse.Namespace) -> int:
        qualified = f"braid.cli.commands.{module}"
        __import__(qualified)
        run: Callable[[argparse.Namespace], int] = getattr(sys.modules[qualified], function)
        return run(args)

    handler.__qualname__ = handler.__name__ = function
    return handler


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a UsageError: one line and exit code 2, like every other failure; its
    formatter sizes help as argparse's does, without importing shutil (braid.cli.help_format)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:
        raise UsageError(f"{message} (see '{self.prog} --help')")


class _Shared:
    """The option groups several commands take (argparse parents), handed to each command's declaration."""

    def __init__(self, common: _Parser, reporting: _Parser, quieting: _Parser) -> None:
        self.common = common  # every command's options, also accepted before the command
        self.reporting = reporting  # the commands that report progress (backup, restore, status)
        self.quieting = quieting  # the other commands cron runs (verify, prune, forget, rekey): silent unless something is wrong


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The grammar of every command, or (`commands`) only of those named there.

    Every command is listed (`braid --help`, usage errors), but only the
    named ones get their options: `braid.cli.main` names the words of the
    command line that are commands, so the command argparse picks among
    them is always complete. Completion, the manual page and
    braid.cli.settings's checks of a config file build the whole grammar.
    """
    common = _Parser(add_help=False)  # options every command takes
    common.add_argument("--repo", help="repository: a directory, or s3://BUCKET/PREFIX (env BRAID_REPO)")
    common.add_argument("--config", metavar="PATH", help="TOML config file (env BRAID_CONFIG; default ~/.config/braid/config.toml, then /etc/braid/config.toml)")
    common.add_argument("--key-file", metavar="PATH", help="master-key file of a local repository (env BRAID_KEY_FILE)")
    common.add_argument("--strict-permissions", action="store_true",
                        help="refuse a master-key file its group or others may read (by default: a warning) (env BRAID_STRICT_PERMISSIONS)")
    common.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    common.add_argument("--json", action="store_true", help="machine-readable output (and JSON-lines progress)")
    common.add_argument("--allow-other-owner", action="store_true", help="run on a directory repository another user owns (refused by default)")
    reporting = _Parser(add_help=False)  # options of the commands that report progress (backup, restore, status)
    reporting.add_argument("--quiet", action="store_true", help="no progress and no notes on success (for cron); errors still print, one line on stderr")
    reporting.add_argument("--log-file", metavar="PATH", help="append every progress event to PATH as JSON lines (whatever --quiet or --json say)")
    quieting = _Parser(add_help=False)  # the other commands cron runs (verify, prune, forget, rekey): silent unless something is wrong
    quieting.add_argument("--quiet", action="store_true",
                          help="print nothing on success (for cron); what failed, and the error line, still print (--json still prints)")

    parser = _Parser(
        prog="braid",
        parents=[common],  # the global options, accepted before the subcommand too: braid --repo R list
        description="Stream database backups off the host; compress and encrypt them in parallel; restore them verified.",
        epilog=_epilog(),
        formatter_class=RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"braid {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    shared = _Shared(common, reporting, quieting)
    for name, declare in _DECLARATIONS.items():
        if commands is None or name in commands:
            declare(sub, shared)
        else:  # listed only (argparse never picks it: the command typed is named), so without a -h of its own
            sub.add_parser(name, help=SUMMARIES[name], add_help=False)
    return parser


def _declare_init(sub: Subparsers, shared: _Shared) -> None:
    init = sub.add_parser("init", parents=[shared.common], **_help(
        "init",
        "braid init --repo /srv/braid                     # a new empty directory; the key goes to ~/.config/braid/keys/",
        "braid init --repo /srv/braid --key-file /etc/braid/master.key",
        "braid init --repo s3://my-bucket/prod --stack Braid",
        "braid init --repo s3://my-locked-bucket/db --engine local --object-lock GOVERNANCE:30",
        description="Create a repository: a new, empty directory with its master-key file (never overwritten; keep a copy"
                    " elsewhere), or an s3:// prefix served by a deployed stack (--stack).",
    ))
    init.add_argument("--stack", help="s3:// repositories: the deployed CloudFormation stack whose pipeline and key to use")
    init.add_argument("--engine", choices=("local", "stepfunctions"),
                      help="s3:// repositories: 'local' compresses and encrypts on this host (no stack needed; a key file, or --kms-key)")
    init.add_argument("--kms-key", metavar="ARN", help="with --engine local: a KMS key wraps the data keys instead of a key file")
    init.add_argument(
        "--object-lock", metavar="MODE:DAYS",
        help="with --engine local, on a bucket with S3 Object Lock: keep every backup's chunks and manifest immutable for DAYS"
        " from its start (GOVERNANCE:30 or COMPLIANCE:30); prune and forget leave it alone until then",
    )
    init.set_defaults(handler=_command("init:cmd_init"))


def _declare_backup(sub: Subparsers, shared: _Shared) -> None:
    backup = sub.add_parser("backup", parents=[shared.common, shared.reporting], **_help(
        "backup",
        "braid backup --repo /srv/braid --name pg -- pg_basebackup -Ft -D - -X fetch -c fast",
        "braid backup --name db2 --pipes 2 -- db2 backup db SAMPLE to {pipes}",
        "braid backup --name dump < dump.sql",
        description="Back up one stream (stdin, or the stdout of the command after --) or several (--input PATH ...,"
                    " or --pipes N for the command) as NAME@ID, printed on stdout once the backup is published and its"
                    " manifest verified.",
    ))
    backup.add_argument("--name", help="backup name, e.g. the database name")
    backup.add_argument("--input", action="append", metavar="PATH", help="file or named pipe; repeat for several (read concurrently)")
    backup.add_argument("--chunk-size", type=_size("--chunk-size", MIN_CHUNK, MAX_CHUNK), metavar="SIZE",
                        help=f"chunk size, {format_size(MIN_CHUNK)} to {format_size(MAX_CHUNK)} (default 16MiB in a directory, 64MiB on s3://)")
    backup.add_argument("--workers", type=_positive_int, default=_cores(), metavar="N", help="worker threads (default: cores)")
    backup.add_argument("--level", type=_level, default=3, metavar=f"1-{MAX_LEVEL}", help=f"zstd level, 1 (fastest) to {MAX_LEVEL} (smallest); default 3")
    backup.add_argument("--pipes", type=_positive_int, metavar="N",
                        help="make N named pipes for the command, named in it by {pipes} (joined by ', ') or {pipe1}..{pipeN}; read all at once")
    backup.add_argument("--label", action="append", metavar="KEY=VALUE",
                        help="a note kept with the backup (repeatable), shown by list and show, matched by list --label")
    backup.add_argument("--expected-size", type=_size("--expected-size", 1), metavar="SIZE",
                        help="the stream's expected size, for %% and ETA when it has none (a command); default: the previous backup's")
    backup.add_argument("--rate-limit", type=_size("--rate-limit", 1), metavar="SIZE",
                        help="cap bytes per second (e.g. 200MiB): the upload to s3://, or the reading of the inputs for a directory repository")
    backup.add_argument("--allow-empty", action="store_true", help="publish an empty stream (refused by default, exit 5: usually a failed producer)")
    backup.add_argument("run", nargs="*", metavar="-- COMMAND",
                        help="run COMMAND and back up its stdout (or its --pipes); published only if it exits 0 (else exit 11)")
    backup.add_argument("--open-timeout", type=_open_timeout, default=DEFAULT_OPEN_TIMEOUT, metavar="SECONDS",
                        help=f"fail (exit 5) if no process opens a named-pipe --input for writing within SECONDS (default {DEFAULT_OPEN_TIMEOUT:g})")
    backup.add_argument("--wal-wait", type=float, default=60.0, metavar="SECONDS",
                        help="a pg_basebackup -X none backup is published only once its WAL range is archived: wait up to SECONDS (else exit 11)")
    backup.add_argument("--engine", choices=("local", "stepfunctions"),
                        help="where chunks are compressed and encrypted (default: the repository's pipeline, else this host)")
    cloud = backup.add_argument_group("s3:// repositories (the cloud pipeline)")
    cloud.add_argument("--concurrency", type=_positive_int, metavar="N", help=f"chunks in flight (default {contract.DEFAULT_AGENT_CONCURRENCY} with one input, one fewer per further input, at least 2), sent in staging parts of up to 4 chunks; memory is (inputs + concurrency + 1) chunks")
    cloud.add_argument("--fan-out", type=_positive_int, metavar="N", help="Lambda workers at once for this backup (map MaxConcurrency, default 100)")
    cloud.add_argument("--no-part-ramp", action="store_true", help="send full-size staging parts from the first chunk (the part ramp policy off)")
    cloud.add_argument("--no-policy", action="append", choices=contract.PIPELINE_POLICIES, metavar="NAME",
                       help=f"switch one of the pipeline's optimisations off for this backup (repeatable): {', '.join(contract.PIPELINE_POLICIES)}")
    cloud.add_argument("--no-wait", action="store_true", help="return once the stream is staged; follow with 'braid status'")
    cloud.add_argument("--stall-timeout", type=_stall_timeout, metavar="SECONDS",
                       help=f"the pipeline gives the backup up after SECONDS without upload progress (default {contract.DEFAULT_STALL_SECONDS})")
    cloud.add_argument("--resume", metavar="NAME@ID", help="continue an interrupted upload: sends only the parts S3 lacks")
    chain_options.add_backup_options(backup)
    cloud.add_argument("--abandon", metavar="NAME@ID", help="give up a held backup now: its execution ends and its staging is removed")
    backup.set_defaults(handler=_command("backup:cmd_backup"))


def _declare_status(sub: Subparsers, shared: _Shared) -> None:
    status = sub.add_parser("status", parents=[shared.common, shared.reporting], **_help(
        "status",
        "braid status --repo s3://my-bucket/prod pg@20261123T020000.000Z-1a2b3c4d --once",
        "braid status pg@latest                           # the newest backup named pg, staged with --no-wait",
        description="Follow the Step Functions execution of an s3:// backup (one started with --no-wait, or whose"
                    " agent was stopped): exit 0 with NAME@ID once it is published, or the execution's failure.",
    ))
    status.add_argument("backup", metavar="NAME@ID", help="the backup, or NAME@latest for the newest execution of NAME")
    status.add_argument("--once", action="store_true", help="print the current state and exit (code 9 if the execution failed)")
    status.set_defaults(handler=_command("backup:cmd_status"))


def _declare_restore(sub: Subparsers, shared: _Shared) -> None:
    restore = sub.add_parser("restore", parents=[shared.common, shared.reporting], **_help(
        "restore",
        "braid restore pg@latest -- tar -x -C /var/lib/postgresql/15/main   # a pg_basebackup -Ft tar",
        "braid restore db2@latest --pipes -- db2 restore db SAMPLE from {pipes}",
        "braid restore dump@latest > dump.sql",
        "braid restore pg@latest --pgdata /var/lib/postgresql/15/restored --target-time '2026-11-28 14:03:00+00'",
        description="Write a backup's original bytes to stdout, to one --output per input, or to the command after --;"
                    " every chunk is authenticated before a byte of it is written.",
    ))
    restore.add_argument("backup", metavar="NAME@ID", help="backup to restore (NAME@latest for the newest)")
    restore.add_argument("--output", action="append", metavar="PATH", help="one per backup input, in order")
    restore.add_argument("--workers", type=_positive_int, default=_cores(), metavar="N", help="decode threads (default: cores)")
    restore.add_argument("--force", action="store_true", help="overwrite existing output files")
    restore.add_argument("--pipes", action="store_true",
                         help="one named pipe per backup input for the command, named in it by {pipes} or {pipe1}..{pipeN}")
    restore.add_argument("run", nargs="*", metavar="-- COMMAND",
                         help="run COMMAND with the backup on its stdin (or --pipes); succeeds only if it reads every byte and exits 0 (else exit 11)")
    restore.add_argument("--open-timeout", type=_open_timeout, default=DEFAULT_OPEN_TIMEOUT, metavar="SECONDS",
                         help=f"fail (exit 5) if no process opens a named-pipe --output for reading within SECONDS (default {DEFAULT_OPEN_TIMEOUT:g})")
    add_pgdata_options(restore)
    chain_options.add_restore_options(restore)
    restore.set_defaults(handler=_command("restore:cmd_restore"))


def _declare_completion(sub: Subparsers, shared: _Shared) -> None:
    completion = sub.add_parser("completion", **_help(
        "completion",
        "braid completion bash > /etc/bash_completion.d/braid          # or: source <(braid completion bash)",
        "braid completion zsh > /usr/local/share/zsh/site-functions/_braid",
        description="Print a completion script for every command and option, generated from this version of braid"
                    " (regenerate it after an upgrade).",
    ))
    completion.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
    completion.set_defaults(handler=_command("reference:cmd_completion"))


def _declare_manpage(sub: Subparsers, shared: _Shared) -> None:
    manpage = sub.add_parser("manpage", **_help(
        "manpage",
        "braid manpage > /usr/local/share/man/man1/braid.1",
        "braid manpage | man -l -",
    ))
    manpage.set_defaults(handler=_command("reference:cmd_manpage"))


from braid.cli.parser_repo import (  # noqa: E402 (it builds on the helpers above)
    declare_copy,
    declare_forget,
    declare_list,
    declare_prices,
    declare_prune,
    declare_rekey,
    declare_show,
    declare_verify,
)
from braid.cli.parser_wal import declare_wal_fetch, declare_wal_push  # noqa: E402 (it builds on the helpers above)

_DECLARATIONS: dict[str, Callable[[Subparsers, _Shared], None]] = {
    "init": _declare_init,
    "backup": _declare_backup,
    "status": _declare_status,
    "restore": _declare_restore,
    "list": declare_list,
    "show": declare_show,
    "prices": declare_prices,
    "copy": declare_copy,
    "rekey": declare_rekey,
    "verify": declare_verify,
    "prune": declare_prune,
    "forget": declare_forget,
    "wal-push": declare_wal_push,
    "wal-fetch": declare_wal_fetch,
    "completion": _declare_completion,
    "manpage": _declare_manpage,
}
