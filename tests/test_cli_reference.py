"""Shell completion and the man page are generated from the parser: every command and option is in them."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from braid.cli.parser import build_parser
from conftest import run_braid


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction))


COMMANDS = _commands(build_parser())
OPTIONS = {command: sorted({s for a in sub._actions for s in a.option_strings if s.startswith("--")}) for command, sub in COMMANDS.items()}


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_names_every_command_and_option(shell: str) -> None:
    result = run_braid("completion", shell)
    assert result.code == 0, result.stderr
    script = result.out
    for command, options in OPTIONS.items():
        assert command in script, command
        for option in options:
            assert option in script, (command, option)


def test_bash_completes_commands_options_and_paths(tmp_path: Path) -> None:
    script = tmp_path / "braid.bash"
    script.write_text(run_braid("completion", "bash").out)
    (tmp_path / "repo-dir").mkdir()
    (tmp_path / "readme.txt").write_text("")

    def complete(*words: str) -> list[str]:
        line = f"source {script}; COMP_WORDS=(braid {' '.join(words)}); COMP_CWORD={len(words)}; _shtab_braid; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        return subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True, cwd=tmp_path, timeout=30).stdout.split()

    assert complete("ver") == ["verify"]
    assert complete("backup", "--chunk") == ["--chunk-size"]
    assert complete("--re") == ["--repo"]  # a global option before the command
    assert complete("list", "--repo", "re") == ["repo-dir/"] or complete("list", "--repo", "re") == ["repo-dir"]  # directories only
    assert complete("completion", "") == ["bash", "zsh"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_parses(tmp_path: Path) -> None:
    script = tmp_path / "_braid"
    script.write_text(run_braid("completion", "zsh").out)
    subprocess.run(["zsh", "-n", str(script)], check=True, timeout=30)


def test_manpage_names_every_command_and_option_and_the_reference_sections() -> None:
    result = run_braid("manpage", env={"SOURCE_DATE_EPOCH": "1795392000"})
    assert result.code == 0, result.stderr
    page = result.out
    assert page.startswith('.TH BRAID "1" "2026\\-11\\-23" "braid ')
    roff = page.replace("\\-", "-")
    for command, options in OPTIONS.items():
        assert f".SH COMMAND \\fI\\,'braid {command}'" in roff, command
        for option in options:
            assert option == "--help" or option in roff, (command, option)  # -h is argparse's, the page itself is the help
    for section in ("EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES"):
        assert f"\n.SH {section}\n" in page
    assert "130  interrupted" in roff and "BRAID_CHUNK_SIZE" in roff and "[names.pg]" in roff
    assert "braid restore pg@latest -- tar -x -C" in roff


def test_man_renders_the_page(tmp_path: Path) -> None:
    if shutil.which("man") is None:
        pytest.skip("man is not installed")
    page = tmp_path / "braid.1"
    page.write_text(run_braid("manpage").out)
    shown = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True, env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # man justifies lines
    assert "NAME braid - stream database backups off the host" in text and "EXIT STATUS 0 success" in text
