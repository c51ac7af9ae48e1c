"""`braid`: the agent CLI on the database host.

Every failure is one line on stderr that says what to fix, and an exit code
from braid.errors.EXIT_CODES; `--debug` adds the traceback. This module owns
only that mapping; the grammar is braid.cli.parser, the commands
braid.cli.commands, the output braid.cli.render.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

from braid.cli.parser import build_parser
from braid.errors import BackupError


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "handler", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args.handler(args))
    except BackupError as exc:
        if debug:
            traceback.print_exc()
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
            traceback.print_exc()
        print(f"braid: error: unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
