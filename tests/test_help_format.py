"""braid.cli.help_format: help sized as argparse sizes it (shutil's terminal columns), without importing shutil."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import pytest

from braid.cli.help_format import HelpFormatter, RawDescriptionHelpFormatter, terminal_columns


@pytest.mark.parametrize("columns", [None, "100", "40", "0", "-3", "wide", ""])
def test_the_columns_are_shutils(monkeypatch: pytest.MonkeyPatch, columns: str | None) -> None:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert terminal_columns() == shutil.get_terminal_size().columns


@pytest.mark.parametrize(("ours", "theirs"), [(HelpFormatter, argparse.HelpFormatter), (RawDescriptionHelpFormatter, argparse.RawDescriptionHelpFormatter)])
@pytest.mark.parametrize("columns", ["100", "52"])
def test_help_reads_as_with_argparses_formatters(monkeypatch: pytest.MonkeyPatch, ours: type, theirs: type, columns: str) -> None:
    monkeypatch.setenv("COLUMNS", columns)

    def text(formatter: type) -> str:
        parser = argparse.ArgumentParser(prog="p", description="A description long enough to be wrapped at least once when the width is small. " * 2,
                                         epilog="examples:\n  p --size 1MiB", formatter_class=formatter)
        parser.add_argument("--size", metavar="SIZE", help="how much of it to take, in bytes or with a unit (KiB, MiB, GiB); the default is all " * 2)
        parser.add_argument("name", help="what to call it")
        return parser.format_help()

    assert text(ours) == text(theirs)


def test_braids_parser_builds_and_prints_help_without_shutil() -> None:
    script = (
        "import sys\n"
        "from braid.cli.parser import build_parser\n"
        "build_parser().format_help()\n"
        "build_parser(commands={'backup'})\n"
        "print(sorted(m for m in ('shutil', 'bz2', 'lzma') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "90"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
