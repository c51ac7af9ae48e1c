"""Cloud `backup --resume` of a backup published meanwhile (issue 21, N6).

Its staging is gone, so the agent answers from the pipeline's outcome. That
answer is exit 0 only for the inputs the backup holds (their sizes): a retry
that passes another stream gets exit 8 "already published", not a NAME@ID
that holds none of it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_emulated_e2e import Emulator, braid  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]
MiB = 1024**2


def test_resume_of_a_published_backup_with_other_inputs_is_exit_8_and_with_the_same_is_exit_0(cloud: Emulator, tmp_path: Path) -> None:
    source, other = tmp_path / "d6", tmp_path / "d3"
    source.write_bytes(os.urandom(6 * MiB))
    other.write_bytes(os.urandom(3 * MiB))
    made = braid(cloud, "resume-published", "backup", "--name", "rp", "--chunk-size", "5MiB", "--input", str(source))
    assert made.code == 0, made.stderr
    ref = made.stdout.strip().splitlines()[-1]
    same = braid(cloud, "resume-published", "backup", "--resume", ref, "--input", str(source))
    assert same.code == 0 and same.stdout.strip().splitlines()[-1] == ref, same.stderr
    for args, stdin, what in (
        (["--input", str(other)], b"", f"inputs of [{3 * MiB}] bytes"),
        ([], b"fresh rows\n", "a stream whose size cannot be checked"),  # stdin, a pipe
    ):
        refused = braid(cloud, "resume-published", "backup", "--resume", ref, *args, stdin=stdin)
        assert refused.code == 8, refused.stderr
        assert refused.errors[-1] == (
            f"braid: error: backup {ref} is already published (1 input(s) of [{6 * MiB}] bytes); nothing to resume,"
            f" and {what} were given: none of it was read. Start a new backup for new data"
        )
