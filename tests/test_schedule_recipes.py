"""The documented recipes for scheduled backups without the stack (docs/databases.md): the systemd units and the
cron lines, here and wherever else README.md and docs/ show one."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from braid.cli.main import split_command
from braid.cli.parser import build_parser
from conftest import BRAID, run_braid

ROOT = Path(__file__).resolve().parents[1]
DATABASES = ROOT / "docs" / "databases.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CRON = re.compile(r"^`?(\d+ \d+ [*\d]+ \* [*\d]+ .*?)`?$", re.M)  # min hour dom month dow ..., alone on its line


def section() -> str:
    text = DATABASES.read_text()
    start = text.index("## Scheduled backups on the host")
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
        assert producer == ["/usr/bin/pg_basebackup", "-Ft", "-D", "-", "-X", "fetch", "-c", "fast"]  # -X fetch: tar to stdout needs it


def test_the_units_key_file_is_the_one_init_writes_for_the_service_user(tmp_path: Path) -> None:
    """BRAID_KEY_FILE names the file `braid init` writes, run as the unit's user (whose HOME systemd sets)."""
    service = units()["braid-backup-pg.service"]
    (environment,) = re.findall(r"^Environment=(.*)$", service, re.M)
    settings = dict(word.split("=", 1) for word in shlex.split(environment))
    home = "/var/lib/postgresql"  # the postgres user's home on Debian
    assert settings["BRAID_KEY_FILE"].startswith(home + "/")
    fake_home = tmp_path / "home"
    made = run_braid("init", "--json", "--repo", str(tmp_path / "repo"), env={"HOME": str(fake_home), "XDG_CONFIG_HOME": ""})
    assert made.code == 0, made.stderr
    init = json.loads(made.out)
    written = settings["BRAID_KEY_FILE"].replace(home, str(fake_home)).replace("REPOSITORY_ID", init["id"])
    assert init["key_file"] == written and Path(written).is_file()


def cron_lines() -> list[tuple[Path, str]]:
    """Every crontab line README.md and docs/ show, in a code block or inline."""
    return [(doc, line) for doc in DOCS for line in CRON.findall(doc.read_text())]


def test_every_documented_cron_line_names_its_programs_by_full_path() -> None:
    """cron runs with PATH=/usr/bin:/bin and no profile: a bare `braid` (in /usr/local/bin or /opt/braid/bin) is not found."""
    found = cron_lines()
    assert len(found) >= 3, found  # README's, usage.md's crontab, databases.md's /etc/cron.d line
    parser = build_parser()
    for doc, line in found:
        fields = line.split(None, 5)[5]
        for command in re.split(r"\s*&&\s*", fields):
            words = shlex.split(command)
            if words[0] in ("postgres", "mysql", "db2inst1"):  # /etc/cron.d has a user field
                words = words[1:]
            words = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
            assert words[0].startswith("/"), (doc.name, line)
            braid, rest = words[0], words[1:]
            assert braid.endswith("/braid"), (doc.name, line)
            braid_words, producer = split_command(rest)
            parser.parse_args(braid_words)
            assert not producer or producer[0].startswith("/"), (doc.name, line)
