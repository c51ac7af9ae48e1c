"""`braid completion bash|zsh` and `braid manpage`: shell completion and the manual page, generated from the parser.

Generated, never written by hand, so an option added to braid.cli.parser
(by any branch) is completed and documented without anyone remembering to.
Completion scripts are static (shtab): a tab press runs the shell's own
code, not a Python start-up. The page is argparse-manpage's rendering of
the parser plus the sections a manual needs that argparse has no place
for (exit status, environment, files, examples).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from braid import __version__
from braid.cli.parser import build_parser
from braid.errors import EXIT_CODES

SHELLS = ("bash", "zsh")
# What each kind of value completes to (shtab's FILE and DIRECTORY, spelt out so the parser need not import shtab).
_FILE = {"bash": "_shtab_compgen_files", "zsh": "_files"}
_DIRECTORY = {"bash": "_shtab_compgen_dirs", "zsh": "_files -/"}
_COMPLETES = {"repo": _DIRECTORY, "key_file": _FILE, "config": _FILE, "input": _FILE, "output": _FILE}


def completion_script(shell: str) -> str:
    import shtab

    parser = build_parser()
    for sub in [parser, *_commands(parser).values()]:
        for action in sub._actions:
            if action.dest in _COMPLETES:
                action.complete = _COMPLETES[action.dest]  # type: ignore[attr-defined]
    return str(shtab.complete(parser, shell=shell))


def manpage() -> str:
    """The braid(1) page in roff, dated today (or by SOURCE_DATE_EPOCH, for reproducible builds)."""
    from argparse_manpage.manpage import Manpage

    parser = build_parser()
    parser.epilog = None  # its parts become proper sections below
    page = Manpage(
        parser,
        _data={"version": __version__, "project_name": "braid", "manual_title": "Braid manual"},
    )
    page.description = "stream database backups off the host, compress and encrypt them in parallel, restore them verified"
    page.add_section("exit status", "=", _preformatted(f"{code:>3}  {text}" for code, text in EXIT_CODES.items()))
    page.add_section("environment", "=", _preformatted([
        "BRAID_CONFIG    the config file (as --config)",
        "BRAID_REPO      the repository (as --repo)",
        "BRAID_KEY_FILE  the master-key file of a local repository (as --key-file)",
        "BRAID_<OPTION>  every other long option: --chunk-size is BRAID_CHUNK_SIZE;",
        "                switches take 1/true/yes/on or 0/false/no/off; an empty variable is unset",
        "",
        "A flag wins over its environment variable, which wins over the config file.",
    ]))
    page.add_section("files", "=", _preformatted([
        "$XDG_CONFIG_HOME/braid/config.toml (default ~/.config/braid/config.toml), else /etc/braid/config.toml:",
        "the config file when neither --config nor BRAID_CONFIG names one (the first found is used alone).",
        "Keys are the long options (repo, key_file, chunk_size, workers, level, ...), at the top level,",
        "in [commands.COMMAND] and in [names.NAME]; the most specific wins. For example:",
        "",
        '    repo = "/srv/braid"',
        '    key_file = "/etc/braid/master.key"',
        "    [commands.backup]",
        "    level = 6",
        "    [names.pg]",
        '    chunk_size = "128MiB"',
        "",
        "$XDG_CONFIG_HOME/braid/keys/REPOSITORY-ID.key: a repository's master key, unless --key-file names one.",
    ]))
    examples = [line.strip() for sub in _commands(parser).values() if sub.epilog for line in sub.epilog.splitlines()[1:]]
    page.add_section("examples", "=", _preformatted(examples))
    return str(page)


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _preformatted(lines: Iterable[str]) -> str:
    """Lines as roff shows them: unfilled, hyphens and backslashes escaped, no line read as a request."""
    escaped = [line.replace("\\", "\\\\").replace("-", "\\-") for line in lines]
    return "\n".join([".nf", *(f"\\&{line}" for line in escaped), ".fi"])


def cmd_completion(args: argparse.Namespace) -> int:
    print(completion_script(args.shell), end="")
    return 0


def cmd_manpage(args: argparse.Namespace) -> int:
    print(manpage(), end="")
    return 0
