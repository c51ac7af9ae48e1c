"""argparse's help formatters, sized as argparse sizes them, without importing shutil.

argparse builds a formatter on every `add_argument` (to check the option's
metavar), and its HelpFormatter asks `shutil.get_terminal_size()` for the
width: importing shutil (and with it bz2 and lzma) cost every command ~3 ms of
CPU at start-up, `wal-push` once per WAL segment (docs/design/agent-startup.md).
`terminal_columns` is shutil's answer for the columns, computed the same way:
COLUMNS when it is a positive number, else standard output's terminal, else 80.
The help printed is unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def terminal_columns() -> int:
    """shutil.get_terminal_size().columns, as Python 3.11 to 3.13 compute it (fallback 80)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's default formatter; its width (when not given) is the terminal's less 2, as argparse takes it."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None, **kwargs: Any) -> None:
        super().__init__(prog, indent_increment, max_help_position, terminal_columns() - 2 if width is None else width, **kwargs)


class RawDescriptionHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's RawDescriptionHelpFormatter (descriptions and epilogs as written), sized as HelpFormatter above."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None, **kwargs: Any) -> None:
        super().__init__(prog, indent_increment, max_help_position, terminal_columns() - 2 if width is None else width, **kwargs)
