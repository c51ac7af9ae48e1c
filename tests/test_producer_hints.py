"""A failed producer's message quotes the line that says what went wrong, not a trailing hint.

PostgreSQL's tools end a failure with a hint (`pg_basebackup: hint: Try
"pg_basebackup --help" ...`) after the error; docs/databases.md's pg_basebackup
failure recipe relies on the error line being quoted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import run_braid

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("stderr", "quoted"),
    [
        ("tool: error: cannot stream write-ahead logs in tar mode to stdout\\ntool: hint: Try \"tool --help\" for more information.",
         "tool: error: cannot stream write-ahead logs in tar mode to stdout"),
        ("ERROR:  relation missing\\nHINT:  create it first\\nhint: really", "ERROR:  relation missing"),
        ("hint: only a hint", "hint: only a hint"),  # nothing better to quote
        ("tool: error: first\\ntool: hinted at nothing", "tool: hinted at nothing"),  # not a hint line
    ],
)
def test_the_error_line_is_quoted_not_the_hint_after_it(repo: Path, stderr: str, quoted: str) -> None:
    result = run_braid("backup", "--repo", str(repo), "--name", "pg", "--", "sh", "-c", f"printf '{stderr}\\n' >&2; exit 1")
    assert result.code == 11, result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("braid: error:")][-1]
    assert f'(its last stderr line: "{quoted}")' in error, error
    assert run_braid("list", "--repo", str(repo), "--json").out.strip() == "[]"
