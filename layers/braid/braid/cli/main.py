"""`braid`: the agent CLI on the database host.

Every failure is one line on stderr that says what to fix, and an exit code
from braid.errors.EXIT_CODES; `--debug` adds the traceback. This module owns
only that mapping, what follows `--` (the command `backup` and `restore`
run, never Braid's own options), and the signals that stop Braid: SIGTERM
and SIGHUP (a service manager stopping it, a closed terminal) stop it as
SIGINT does, cleaning up on the way out (exit 130). The grammar is
braid.cli.parser, the commands braid.cli.commands, the output braid.cli.render.

Every run starts here, so this module and the grammar import little, and
the parser declares only the options of the command typed (see
braid.cli.parser); what a command needs is imported when it runs.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from braid.cli.owner import refuse_other_owner
from braid.cli.parser import SUMMARIES, build_parser
from braid.cli.settings import Settings
from braid.errors import WAL_FETCH_UNEXPECTED, BackupError, UsageError

_STOPPING = (signal.SIGTERM, signal.SIGHUP)

# The process ends right after its command: the interpreter's last garbage
# collection at exit would walk every object of every module Braid imported
# to free memory the process's end frees anyway (~12 ms of each run's tail,
# measured). Frozen objects are left to it; at exit only.
atexit.register(gc.freeze)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, like SIGINT, so every `finally` runs.

    A signal that is ignored when Braid starts (nohup) stays ignored: that
    is the user's choice. The previous handlers come back afterwards, for
    callers that run main() in their own process (tests).
    """
    previous = {}
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers belong to the main thread; a caller elsewhere keeps its own
        return
    for signum in _STOPPING:
        handler = signal.getsignal(signum)
        if handler is not signal.SIG_IGN:
            previous[signum] = handler
            signal.signal(signum, _interrupted)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def split_command(words: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """Braid's own arguments, and the command after the first `--` (None without one).

    Split before parsing, so the command's options (`pg_basebackup -D -`)
    are never taken for Braid's, on every Python version's argparse.
    """
    words = list(words)
    if "--" not in words:
        return words, None
    at = words.index("--")
    return words[:at], words[at + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    words, command = split_command(argv if argv is not None else sys.argv[1:])
    # The commands among the words: argparse picks one of them, so only
    # theirs need declaring (a value that spells a command costs a little).
    parser = build_parser(commands={word for word in words if word in SUMMARIES})
    settings = Settings(parser, whole=build_parser)
    debug = "--debug" in words
    try:
        with _stop_on_signals():
            args = _parse(parser, settings, words)
            if not getattr(args, "handler", None):
                parser.print_help(sys.stderr)
                return 2
            settings.resolve(args)
            debug = bool(getattr(args, "debug", False))
            refuse_other_owner(args)
            _attach_command(args, command)
            return int(args.handler(args))
    except BackupError as exc:
        if debug:
            _print_traceback()
        print(f"braid: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print("; ".join(["braid: interrupted", *getattr(exc, "__notes__", [])]), file=sys.stderr)
        return 130
    except BrokenPipeError:
        print("braid: error: output closed by its reader", file=sys.stderr)
        return 5
    except Exception as exc:  # a bug: still one line, traceback on --debug
        if debug:
            _print_traceback()
        print(f"braid: error: unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)", file=sys.stderr)
        # restore_command's exit 1 means "not in the archive": a bug in wal-fetch must never end a recovery as if it did.
        return WAL_FETCH_UNEXPECTED if "wal-fetch" in words else 1


def _print_traceback() -> None:
    import traceback  # only for --debug: it loads linecache, tokenize and textwrap

    traceback.print_exc()


def _parse(parser: argparse.ArgumentParser, settings: Settings, words: list[str]) -> argparse.Namespace:
    """parse_args, with a clear word for a command's option given before the command (`braid --name pg backup`)."""
    try:
        return parser.parse_args(words)
    except UsageError:
        misplaced = _misplaced_option(settings, words)
        if misplaced is None:
            raise
        flag, command = misplaced
        global_flags = ", ".join(sorted(s.flag for s in settings.of(None).values()))
        raise UsageError(f"{flag} is an option of 'braid {command}': give it after '{command}' (before it go only {global_flags})") from None


def _misplaced_option(settings: Settings, words: list[str]) -> tuple[str, str] | None:
    """The first option before the command word that only the command takes, and that command."""
    command = next((w for w in words if w in settings.commands), None)
    if command is None:
        return None
    for word in words[: words.index(command)]:
        flag = word.partition("=")[0]
        if flag.startswith("--") and flag not in {s.flag for s in settings.of(None).values()}:
            if any(s.flag == flag for s in settings.of(command).values()):
                return flag, command
    return None


def _attach_command(args: argparse.Namespace, command: list[str] | None) -> None:
    """`args.run`: the command after `--` for the commands that run one (backup, restore), else a usage error."""
    if not hasattr(args, "run"):
        if command is not None:
            raise UsageError(f"'braid {args.command}' runs no command: remove the -- and what follows it")
        return
    if args.run:  # words the parser took for the command, without a --
        raise UsageError(f"unexpected argument {args.run[0]!r}: the command to run goes after --, e.g. braid backup --name pg -- pg_basebackup -Ft -D - -X fetch")
    args.run = command


if __name__ == "__main__":
    sys.exit(main())
