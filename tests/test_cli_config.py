"""Settings: flag > BRAID_* environment variable > config file (names, commands, top level) > default.

The layering is exercised on the real parser (braid.cli.settings), and end
to end through the CLI: a backup made with settings from a file records
them in its manifest.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from braid.cli.main import main
from braid.cli.parser import build_parser
from braid.cli.settings import COMMAND_LINE_ONLY, Settings, env_name, key_name
from conftest import run_braid


def resolved(words: list[str], environ: dict[str, str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    settings = Settings(parser)
    args = parser.parse_args(words)
    settings.resolve(args, environ or {})
    return args


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def run(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, str, str]:
    code = main(list(words))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- names: one rule for every option ---------------------------------------------


def test_every_long_option_has_an_environment_variable_and_a_key_named_after_it() -> None:
    settings = Settings(build_parser())
    flags = {s.flag for s in settings.all()}
    assert {"--repo", "--key-file", "--chunk-size", "--workers", "--level", "--concurrency", "--rate-limit", "--config"} <= flags
    for setting in settings.all():
        assert setting.env == "BRAID_" + setting.flag[2:].upper().replace("-", "_")
        assert setting.key == setting.flag[2:].replace("-", "_")
        assert setting.in_environment == (setting.key not in COMMAND_LINE_ONLY and not setting.key.startswith("keep_"))
    # the names scripts already use stay exactly as they were
    assert (env_name("--repo"), env_name("--key-file"), env_name("--config")) == ("BRAID_REPO", "BRAID_KEY_FILE", "BRAID_CONFIG")
    assert key_name("--chunk-size") == "chunk_size"


def test_an_option_added_later_is_a_setting_without_being_listed() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["list"]
    sub.add_argument("--some-new-option", type=int, default=5)
    settings = Settings(parser)
    args = parser.parse_args(["list"])
    settings.resolve(args, {"BRAID_SOME_NEW_OPTION": "7", "BRAID_CONFIG": os.devnull})
    assert args.some_new_option == 7


# -- precedence -------------------------------------------------------------------


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write(
        tmp_path / "config.toml",
        """
repo = "/srv/file-repo"
key_file = "/etc/braid/file.key"
chunk_size = "32MiB"
workers = 3
level = 4
concurrency = 6
rate_limit = "100MiB"

[commands.backup]
level = 5

[names.pg]
level = 9
chunk_size = 134217728
""",
    )


def test_defaults_without_any_setting() -> None:
    args = resolved(["backup", "--name", "db"], {"BRAID_CONFIG": os.devnull})
    assert (args.repo, args.key_file, args.chunk_size, args.level, args.concurrency, args.json) == (None, None, None, 3, None, False)
    assert args.workers >= 1


def test_file_values_with_command_and_name_tables(config: Path) -> None:
    env = {"BRAID_CONFIG": str(config)}
    args = resolved(["backup", "--name", "db"], env)
    assert (args.repo, args.key_file, args.chunk_size, args.workers, args.level, args.concurrency, args.rate_limit) == (
        "/srv/file-repo", "/etc/braid/file.key", "32MiB", 3, 5, 6, "100MiB",
    )
    pg = resolved(["backup", "--name", "pg"], env)
    assert (pg.level, pg.chunk_size, pg.workers) == (9, "134217728", 3)  # [names.pg] > [commands.backup] > top level
    restore = resolved(["restore", "pg@latest"], env)  # the name of NAME@ID picks the table too
    assert (restore.repo, restore.workers) == ("/srv/file-repo", 3)
    resumed = resolved(["backup", "--resume", "pg@20261123T020000.000Z-1a2b3c4d"], env)  # and --resume's
    assert (resumed.level, resumed.chunk_size) == (9, "134217728")


def test_environment_beats_file_and_flag_beats_environment(config: Path) -> None:
    env = {"BRAID_CONFIG": str(config), "BRAID_LEVEL": "11", "BRAID_REPO": "/srv/env-repo", "BRAID_JSON": "yes", "BRAID_INPUT": "'/p 1' /p2"}
    args = resolved(["backup", "--name", "pg"], env)
    assert (args.level, args.repo, args.json, args.input) == (11, "/srv/env-repo", True, ["/p 1", "/p2"])
    flagged = resolved(["backup", "--name", "pg", "--level", "1", "--repo", "/srv/flag-repo"], env)
    assert (flagged.level, flagged.repo) == (1, "/srv/flag-repo")
    assert flagged.typed == {"name", "level", "repo"} and args.typed == {"name"}  # what the command line said, apart from env and file
    assert resolved(["list"], {**env, "BRAID_JSON": "0"}).json is False
    assert resolved(["list"], {**env, "BRAID_REPO": ""}).repo == "/srv/file-repo"  # empty is unset


def test_config_named_by_flag_beats_environment(config: Path, tmp_path: Path) -> None:
    other = write(tmp_path / "other.toml", 'repo = "/srv/other"\n')
    assert resolved(["list", "--config", str(other)], {"BRAID_CONFIG": str(config)}).repo == "/srv/other"
    assert resolved(["--config", str(other), "list"], {"BRAID_CONFIG": str(config)}).repo == "/srv/other"


def test_default_locations(tmp_path: Path, isolated_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BRAID_CONFIG")
    write_to = isolated_config / "braid" / "config.toml"  # $XDG_CONFIG_HOME/braid/config.toml, i.e. ~/.config/braid/...
    write_to.parent.mkdir(parents=True)
    write(write_to, 'repo = "/srv/user"\n')
    assert resolved(["list"], dict(os.environ)).repo == "/srv/user"


# -- global options before the subcommand -----------------------------------------


def test_global_options_before_the_command(repo: Path, tmp_path: Path) -> None:
    listed = run_braid("--repo", str(repo), "list", "--json")
    assert listed.code == 0 and json.loads(listed.out) == []
    key = next((tmp_path / "xdg-config" / "braid" / "keys").glob("*.key"))
    made = run_braid("--key-file", str(key), "--repo", str(repo), "backup", "--name", "db", stdin=b"rows")
    assert made.code == 0, made.stderr
    assert run_braid("--repo", str(repo), "--json", "restore", made.out.strip()).stdout == b"rows"
    # after the command, the later value wins, as for any repeated option
    assert run_braid("--repo", str(tmp_path / "nowhere"), "list", "--repo", str(repo)).code == 0


def test_a_command_option_before_the_command_says_where_it_goes(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--workers", "4", "backup", "--name", "db")
    assert code == 2
    assert err == (
        "braid: error: --workers is an option of 'braid backup': give it after 'backup'"
        " (before it go only --allow-other-owner, --config, --debug, --json, --key-file, --repo, --strict-permissions)\n"
    )


# -- a bad file or variable: exit 2, naming file and key --------------------------


@pytest.mark.parametrize(
    "text,message",
    [
        ("levle = 3\n", "levle: unknown key (did you mean level?)"),
        ("level = 30\n", "level = 30: --level must be 1..19"),
        ("workers = 0\n", "workers = 0: '0' must be at least 1"),
        ('chunk_size = "1"\n', "chunk_size = '1': --chunk-size must be between 4 KiB and 1 GiB"),
        ('chunk_size = "12 parsecs"\n', "chunk_size = '12 parsecs': invalid size '12 parsecs': use a number with an optional unit such as 64MiB, 8M or 1G"),
        ('json = "yes"\n', "json = 'yes': --json is a switch: use true or false"),
        ("repo = true\n", "repo = true: --repo takes one value (a string or a number), not true"),
        ("force = true\n", "force: cannot be set in a config file; give --force on the command line"),
        ('config = "/x"\n', "config: cannot be set in a config file; set BRAID_CONFIG in the environment"),
        ("[commands.bakup]\nlevel = 3\n", "[commands.bakup]: no such command (did you mean backup?)"),
        ("[commands.list]\nlevel = 3\n", "[commands.list] level: unknown key"),
        ("[names.pg]\nname = 'x'\n", "[names.pg] name: a [names.NAME] table is already about one name"),
        ("[names.pg]\nlevel = 0\n", "[names.pg] level = 0: '0' must be at least 1"),
        ("names = 3\n", "names: must hold one table per name, e.g. [names.pg]"),
        ("keep_daily = 7\n", "keep_daily: cannot be set in a config file; store retention per name in the repository:"
                              " braid prune --name NAME --keep-daily ... --save-policy"),
        ("repo = 5\n", "repo = 5: --repo takes a string (in quotes)"),
        ('workers = "4"\n', "workers = '4': --workers takes a whole number (a TOML integer such as 4, without quotes)"),
        ('[commands.restore]\nopen_timeout = "5"\n', "[commands.restore] open_timeout = '5': --open-timeout takes a number (such as 5 or 2.5, without quotes)"),
        ("[names.pg]\nworkers = 4.0\n", "[names.pg] workers = 4.0: --workers takes a whole number (a TOML integer such as 4, without quotes)"),
        ("pipes = 2\n", "pipes = 2: --pipes is a switch: use true or false (for 'braid restore'; put it under [commands.backup])"),
    ],
)
def test_bad_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    path = write(tmp_path / "bad.toml", text)
    code, out, err = run(capsys, "list", "--repo", str(tmp_path), "--config", str(path))
    assert (code, out, err) == (2, "", f"braid: error: config file {path}: {message}\n")


def test_bad_invalid_name_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "bad.toml", '[names."../x"]\nlevel = 3\n')
    code, _, err = run(capsys, "list", "--config", str(path))
    assert code == 2 and err.startswith(f"braid: error: config file {path}: [names.../x]: invalid backup name '../x'")


def test_a_value_for_another_command_is_checked_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "bad.toml", "[commands.backup]\nlevel = 99\n")
    code, _, err = run(capsys, "list", "--config", str(path))  # list never reads it; the typo still fails now, not at 3 am
    assert (code, err) == (2, f"braid: error: config file {path}: [commands.backup] level = 99: --level must be 1..19\n")


def test_unreadable_missing_and_malformed_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "none.toml"
    assert run(capsys, "list", "--config", str(missing))[:3:2] == (2, f"braid: error: config file {missing} not found (named by --config)\n")
    monkeypatch.setenv("BRAID_CONFIG", str(missing))
    assert run(capsys, "list")[:3:2] == (2, f"braid: error: config file {missing} not found (named by BRAID_CONFIG)\n")
    broken = write(tmp_path / "broken.toml", "repo = \n")
    code, _, err = run(capsys, "list", "--config", str(broken))
    assert code == 2 and err.startswith(f"braid: error: config file {broken} is not valid TOML: Invalid value (at line 1, column 8)")
    directory = tmp_path / "dir.toml"
    directory.mkdir()
    code, _, err = run(capsys, "list", "--config", str(directory))
    assert code == 2 and err == f"braid: error: config file {directory} cannot be read: Is a directory\n"


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("BRAID_WORKERS", "abc", "environment variable BRAID_WORKERS='abc': 'abc' is not a whole number"),
        ("BRAID_JSON", "maybe", "environment variable BRAID_JSON='maybe': --json is a switch: use 1/true/yes/on or 0/false/no/off"),
        ("BRAID_LEVEL", "20", "environment variable BRAID_LEVEL='20': --level must be 1..19"),
    ],
)
def test_bad_environment_variable(repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str) -> None:
    monkeypatch.setenv(name, value)
    code, out, err = run(capsys, "backup", "--repo", str(repo), "--name", "db")
    assert (code, out, err) == (2, "", f"braid: error: {message}\n")


def test_cloud_settings_from_file_or_environment_do_not_stop_a_local_backup(repo: Path, tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", 'concurrency = 8\nrate_limit = "200MiB"\n[commands.backup]\nfan_out = 50\n')
    made = run_braid("backup", "--repo", str(repo), "--name", "db", stdin=b"rows", env={"BRAID_CONFIG": str(config), "BRAID_NO_WAIT": "1"})
    assert made.code == 0, made.stderr
    typed = run_braid("backup", "--repo", str(repo), "--name", "db", "--concurrency", "4", stdin=b"rows", env={"BRAID_CONFIG": str(config)})
    assert (typed.code, typed.stderr) == (2, "braid: error: --concurrency applies only to s3:// repositories\n")


def test_command_line_only_options_ignore_the_environment(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_bytes(b"precious")
    made = run_braid("backup", "--repo", str(repo), "--name", "db", stdin=b"rows")
    result = run_braid("restore", "--repo", str(repo), "--output", str(out), made.out.strip(), env={"BRAID_FORCE": "1"})
    assert result.code == 5 and out.read_bytes() == b"precious", result.stderr


# -- end to end: a file-configured backup records its settings ---------------------


def test_backup_configured_by_file_alone(repo: Path, tmp_path: Path) -> None:
    key = next((tmp_path / "xdg-config" / "braid" / "keys").glob("*.key"))
    config = write(
        tmp_path / "braid.toml",
        f'repo = "{repo}"\nkey_file = "{key}"\nchunk_size = "64KiB"\n[commands.backup]\nlevel = 5\n[names.pg]\nlevel = 9\n',
    )
    env = {"BRAID_CONFIG": str(config), "XDG_CONFIG_HOME": str(tmp_path / "elsewhere")}
    data = os.urandom(1000) * 200
    made = run_braid("backup", "--name", "pg", stdin=data, env=env)
    assert made.code == 0, made.stderr
    shown = json.loads(run_braid("show", "--json", "pg@latest", env=env).out)
    assert (shown["chunk_size"], shown["algorithms"]["level"]) == (65536, 9)
    other = run_braid("backup", "--name", "db", "--json", stdin=data, env={**env, "BRAID_LEVEL": "2"})
    assert other.code == 0, other.stderr
    assert json.loads(run_braid("show", "--json", "db@latest", env=env).out)["algorithms"]["level"] == 2
    assert run_braid("restore", "pg@latest", env=env).stdout == data


def test_the_documented_sample_config_reads_as_documented(tmp_path: Path) -> None:
    usage = (Path(__file__).resolve().parents[1] / "docs" / "usage.md").read_text()
    sample = usage.partition("## Configuration")[2].partition("```toml\n")[2].partition("```")[0]
    env = {"BRAID_CONFIG": str(write(tmp_path / "config.toml", sample))}
    pg = resolved(["backup", "--name", "pg"], env)
    assert (pg.repo, pg.key_file, pg.chunk_size, pg.workers, pg.level, pg.concurrency, pg.rate_limit) == (
        "/srv/braid", "/etc/braid/master.key", "128MiB", 8, 9, 8, "200MiB",
    )
    assert (resolved(["backup", "--name", "db"], env).level, resolved(["verify", "--all"], env).workers) == (6, 4)
