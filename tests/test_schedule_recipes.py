"""README's recipes for scheduled backups without the stack: the systemd units and the cron line."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from braid.cli.main import split_command
from braid.cli.parser import build_parser
from conftest import BRAID

README = Path(__file__).resolve().parents[1] / "README.md"


def section() -> str:
    text = README.read_text()
    start = text.index("### Scheduled backups")
    return text[start : text.index("\n## ", start)]


def units() -> dict[str, str]:
    """The ```ini block's files, split at their `# /etc/systemd/system/NAME` lines."""
    (block,) = re.findall(r"```ini\n(.*?)```", section(), re.S)
    found: dict[str, str] = {}
    for part in re.split(r"^# /etc/systemd/system/", block, flags=re.M)[1:]:
        name, _, body = part.partition("\n")
        found[name.strip()] = body
    return found


def braid_args(command: str) -> list[str]:
    words = shlex.split(command)
    at = next(i for i, w in enumerate(words) if "=" not in w and (w.endswith("/braid") or w == "braid"))
    return words[at + 1 :]


def test_the_systemd_units_are_valid(tmp_path: Path) -> None:
    found = units()
    assert set(found) == {"braid-backup-pg.service", "braid-backup-pg.timer"}
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here; the units' braid command is still checked below")
    for name, body in found.items():
        (tmp_path / name).write_text(body.replace("/opt/braid/bin/braid", str(BRAID)))
    done = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / n) for n in found)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_scheduled_commands_are_valid_braid_command_lines() -> None:
    service = units()["braid-backup-pg.service"]
    (exec_start,) = re.findall(r"^ExecStart=(.*)$", service, re.M)
    (cron,) = re.findall(r"`(\d+ \d+ \* \* \* postgres .*?)`", section())
    fields = cron.split(None, 6)
    assert len(fields) == 7 and fields[5] == "postgres"  # min hour dom month dow user command (/etc/cron.d form)
    parser = build_parser()
    for command in (exec_start, fields[6]):
        words, producer = split_command(braid_args(command))
        args = parser.parse_args(words)
        assert (args.command, args.name) == ("backup", "pg")
        assert producer == ["pg_basebackup", "-Ft", "-D", "-", "-X", "fetch", "-c", "fast"]  # -X fetch: tar to stdout needs it
