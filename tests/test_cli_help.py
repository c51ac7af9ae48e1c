"""What a person reads: each command's help, the hints in error lines, and the `list` table."""

from __future__ import annotations

import argparse
import json
import math
import os
import textwrap
from pathlib import Path

import pytest

from braid.cli.main import main
from braid.cli.parser import SUMMARIES, build_parser, fill
from braid.cli.settings import Settings
from conftest import run_braid

COMMANDS = sorted(Settings(build_parser()).commands)


def run(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, str, str]:
    code = main(list(words))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def backup(repo: Path, name: str, data: bytes) -> str:
    made = run_braid("backup", "--repo", str(repo), "--name", name, "--chunk-size", "64KiB", stdin=data)
    assert made.code == 0, made.stderr
    return made.out.strip()


# -- help ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_a_description_and_an_example(capsys: pytest.CaptureFixture[str], command: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    usage, description = text.split("\n\n")[:2]
    assert usage.startswith(f"usage: braid {command} ")
    assert len(description.split()) >= 5 and not description.startswith(("positional", "options"))
    examples = text.partition("\nexamples:\n")[2].splitlines()
    assert examples and all(line.startswith(f"  braid {command}") for line in examples), text


def test_level_states_its_range(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["backup", "--help"])
    assert "--level 1-19          zstd level, 1 (fastest) to 19 (smallest); default 3" in capsys.readouterr().out
    code, _, err = run(capsys, "backup", "--name", "db", "--level", "20")
    assert (code, err) == (2, "braid: error: argument --level: --level must be 1..19 (see 'braid backup --help')\n")


def test_top_level_help_names_settings_and_global_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for needle in ("--repo REPO", "--config PATH", "BRAID_<OPTION>", "BRAID_CONFIG", "~/.config/braid/config.toml", "braid --repo /srv/braid list"):
        assert needle in text


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_descriptions_wrap_as_textwrap_would() -> None:
    """The parser fills descriptions without loading textwrap; the result is textwrap's, character for character."""
    for command, sub in _commands(build_parser()).items():
        text = sub.description.replace("\n", " ")
        assert sub.description == textwrap.fill(text, 79, break_on_hyphens=False), command
    assert fill("a " * 100 + "--an-option-that-stays-whole " * 5) == textwrap.fill("a " * 100 + "--an-option-that-stays-whole " * 5, 79, break_on_hyphens=False)


def test_a_run_declares_only_the_commands_it_names_and_lists_them_all() -> None:
    """`braid backup ...` declares backup's options alone (start-up), yet `braid --help` and usage errors read the same."""
    whole, partial = build_parser(), build_parser(commands={"backup"})
    assert partial.format_help() == whole.format_help()
    assert list(_commands(partial)) == list(_commands(whole)) == list(SUMMARIES)
    assert _commands(partial)["backup"].format_help() == _commands(whole)["backup"].format_help()
    assert "--keep-last" not in _commands(partial)["prune"].format_help()
    assert "--keep-last" in _commands(whole)["prune"].format_help()


def test_a_value_that_spells_a_command_still_parses(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Every command word on the line is declared, so the one argparse picks is complete whichever it is."""
    code, _, err = run(capsys, "--repo", str(tmp_path / "missing"), "backup", "--name", "list", "--level", "20")
    assert (code, err) == (2, "braid: error: argument --level: --level must be 1..19 (see 'braid backup --help')\n")
    code, _, err = run(capsys, "--repo", str(tmp_path / "missing"), "list", "--name", "backup")
    assert code == 3 and "missing" in err, err


# -- hints -----------------------------------------------------------------------------


def test_missing_key_of_an_existing_repository_says_where_to_point_not_to_reinit(repo: Path, tmp_path: Path) -> None:
    backup_id = backup(repo, "db", b"rows" * 100)
    key_id = json.loads((repo / "config.json").read_text())["key"]["key_id"]
    missing = tmp_path / "none.key"
    result = run_braid("restore", "--repo", str(repo), "--key-file", str(missing), backup_id)
    assert result.code == 4 and result.stdout == b""
    assert result.stderr == (
        f"braid: error: key file {missing} not found; repository {repo} needs master key {key_id}: give its file with --key-file PATH,"
        " BRAID_KEY_FILE or key_file in the config file (if it was lost, restore it from your copy)\n"
    )


def test_a_directory_holding_other_files_is_not_offered_to_init(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("x")
    code, _, err = run(capsys, "list", "--repo", str(busy))
    assert (code, err) == (
        3,
        f"braid: error: no Braid repository at {busy}: the directory holds other files; give the repository's own directory,"
        " or create a repository in a new, empty one with 'braid init --repo NEW_DIR'\n",
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, "list", "--repo", str(empty))  # an empty directory can be initialised where it is
    assert (code, err) == (3, f"braid: error: no Braid repository at {empty}; create one with 'braid init --repo {empty}'\n")


def test_an_unknown_name_suggests_the_closest(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pg = backup(repo, "pg", b"rows")
    backup(repo, "mariadb", b"rows")
    for words in (["restore", "pgg@latest"], ["show", "pgg@latest"], ["verify", "pgg@latest"]):
        code, out, err = run(capsys, *words, "--repo", str(repo))
        assert (code, out, err) == (8, "", f"braid: error: no backups named 'pgg' in {repo} (did you mean pg?)\n"), words
    other_id = pg.replace("pg@", "maria@")
    code, _, err = run(capsys, "forget", "--repo", str(repo), other_id)
    assert (code, err) == (8, f"braid: error: backup {other_id} not found in {repo} (did you mean mariadb?)\n")
    code, out, err = run(capsys, "list", "--repo", str(repo), "--name", "pgg")  # an empty list is no error, but says so
    assert (code, out, err) == (0, "", "no backups named 'pgg' (did you mean pg?)\n")
    code, _, err = run(capsys, "show", "--repo", str(repo), "zzzz@latest")  # nothing close: no guess
    assert (code, err) == (8, f"braid: error: no backups named 'zzzz' in {repo}\n")
    gone = pg[:-8] + "00000000"
    code, _, err = run(capsys, "show", "--repo", str(repo), gone)
    assert (code, err) == (8, f"braid: error: backup {gone} not found in {repo}; pg has 1 other backup(s): see 'braid list --name pg'\n")


# -- list ------------------------------------------------------------------------------


def test_list_sizes_its_columns_from_the_names_and_says_how_ratio_reads(repo: Path) -> None:
    long_name = "n" * 48
    rows = os.urandom(2000) * 50
    backup(repo, "db", rows)
    backup(repo, long_name, rows)
    listing = run_braid("list", "--repo", str(repo))
    assert listing.code == 0
    header, first, second = listing.out.splitlines()
    documents = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert header.split() == ["BACKUP", "CREATED", "SIZE", "STORED", "RATIO", "SAVED", "CHUNKS", "VERIFIED"]
    created = header.index("CREATED")
    assert created == len(documents[1]["backup"]) + 2  # as wide as the longest backup, then two spaces
    ratio_end = header.index("RATIO") + len("RATIO")
    for line, document in zip((first, second), documents, strict=True):
        assert line.startswith(document["backup"] + " ") and line[created - 2 : created + 2] == "  20"
        assert line[ratio_end - 6 : ratio_end] == f"{document['ratio']:>6.3f}"
        assert line[ratio_end : ratio_end + 7] == f"  {math.floor(100 * (1 - document['stored_bytes'] / document['plaintext_bytes'])):>4}%"
        assert line.endswith(f"{document['chunks']:>7}  -") and document["verified"] is None  # never verified
    assert listing.stderr == "RATIO: stored size / original size (lower is better); SAVED: 1 - RATIO\n"
    assert set(documents[0]) >= {"backup", "name", "id", "created", "plaintext_bytes", "stored_bytes", "ratio", "chunks"}


def test_show_says_which_way_ratio_reads(repo: Path) -> None:
    backup(repo, "db", b"a" * 100000)
    shown = run_braid("show", "--repo", str(repo), "db@latest").out
    line = next(line for line in shown.splitlines() if line.startswith("stored"))
    assert line.endswith(", ratio 0.002 (stored/size), saved 99%")
