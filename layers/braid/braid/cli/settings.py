"""Every long option is also a setting: flag > `BRAID_*` environment variable > config file > default.

Derived from the parser, never listed by hand, so an option any command
gains later is an environment variable and a config key at once:
`--chunk-size` is `BRAID_CHUNK_SIZE` and `chunk_size`, `--key-file`
`BRAID_KEY_FILE` and `key_file`. Values from the environment and the file go
through the option's own argparse type (and choices), so `level = 30` fails
exactly as `--level 30` does, naming where it came from.

How a flag's absence is seen: each option's default is moved out of argparse
(its default becomes SUPPRESS) into this table, so after parsing "not in
the namespace" means "not typed", and the layers below fill it in. That is
also what lets the global options be given before the subcommand: the
subcommand's parser no longer overwrites `braid --repo R list`'s value
with its own default.

A few options are command-line only (COMMAND_LINE_ONLY): they pick a
one-off target or action, or override a safety check, and a line left in a
file or an exported variable would do that to every later run.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from braid.cli.config_file import TABLES, ConfigFile, load
from braid.errors import UsageError, did_you_mean

ENV_PREFIX = "BRAID_"
NOT_SETTINGS = frozenset({"help", "version"})
COMMAND_LINE_ONLY = frozenset({"abandon", "all", "allow_empty", "allow_other_owner", "delete_policy", "force", "label", "resume", "save_policy", "show_policy"})
RETENTION_RULES = "keep_"  # prefix: retention is stored per name in the repository (prune --save-policy), one policy for host and cloud
ENVIRONMENT_ONLY = frozenset({"config"})  # the file cannot name itself
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def env_name(flag: str) -> str:
    """`--chunk-size` -> `BRAID_CHUNK_SIZE`: the one rule for every option."""
    return ENV_PREFIX + flag.removeprefix("--").upper().replace("-", "_")


def key_name(flag: str) -> str:
    """`--chunk-size` -> `chunk_size`: TOML keys are spelt like the long options."""
    return flag.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class Setting:
    """One long option of one command, as a setting."""

    command: str | None  # None: the top-level parser (options accepted before the subcommand)
    flag: str
    action: argparse.Action
    default: Any

    @property
    def key(self) -> str:
        return key_name(self.flag)

    @property
    def env(self) -> str:
        return env_name(self.flag)

    @property
    def command_line_only(self) -> bool:
        return self.key in COMMAND_LINE_ONLY or self.key.startswith(RETENTION_RULES)

    @property
    def in_file(self) -> bool:
        return not self.command_line_only and self.key not in ENVIRONMENT_ONLY

    @property
    def in_environment(self) -> bool:
        return not self.command_line_only

    def from_environment(self, text: str) -> Any:
        try:
            return self._convert(text, from_text=True)
        except _Invalid as exc:
            raise UsageError(f"environment variable {self.env}={text!r}: {exc}") from None

    def from_file(self, value: Any, where: str) -> Any:
        try:
            for item in value if isinstance(value, list) and isinstance(self.action, argparse._AppendAction) else [value]:
                self._check_toml_type(item)
            return self._convert(value, from_text=False)
        except _Invalid as exc:
            raise UsageError(f"{where} = {_toml(value)}: {exc}") from None

    def _convert(self, value: Any, *, from_text: bool) -> Any:
        """What argparse would have stored had the flag been typed with this value."""
        action = self.action
        if action.nargs == 0:  # a switch (store_true)
            if isinstance(value, str) and from_text:
                word = value.strip().lower()
                if word not in _TRUE | _FALSE:
                    raise _Invalid(f"{self.flag} is a switch: use 1/true/yes/on or 0/false/no/off")
                value = word in _TRUE
            if not isinstance(value, bool):
                raise _Invalid(f"{self.flag} is a switch: use true or false")
            return action.const if value else self.default
        if isinstance(action, argparse._AppendAction):
            if from_text:
                import shlex

                items = shlex.split(value)
            else:
                items = value if isinstance(value, list) else [value]
            return [self._one(item) for item in items]
        return self._one(value)

    def _check_toml_type(self, value: Any) -> None:
        """A value in the file has the TOML type of what the option takes: `repo = 5` is no path, `workers = "4"` no count."""
        convert = self.action.type
        returns = getattr(convert, "__annotations__", {}).get("return") if convert is not None else "str"
        if self.action.nargs == 0 or isinstance(value, bool | dict | list):
            return  # switches and tables are judged by _convert
        allowed: tuple[type, ...]
        if "_size." in getattr(convert, "__qualname__", ""):
            allowed, wanted = (str, int), "a size: a string such as \"64MiB\" or a whole number of bytes"
        elif returns in ("int", int):
            allowed, wanted = (int,), "a whole number (a TOML integer such as 4, without quotes)"
        elif returns in ("float", float):
            allowed, wanted = (int, float), "a number (such as 5 or 2.5, without quotes)"
        else:
            allowed, wanted = (str,), "a string (in quotes)"
        if not isinstance(value, allowed):
            raise _Invalid(f"{self.flag} takes {wanted}")

    def _one(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise _Invalid(f"{self.flag} takes one value (a string or a number), not {_toml(value)}")
        text = str(value)
        convert = self.action.type or str
        try:
            result = convert(text)  # type: ignore[operator]
        except (argparse.ArgumentTypeError, UsageError) as exc:
            raise _Invalid(str(exc)) from None
        except (TypeError, ValueError):
            raise _Invalid(f"invalid value {text!r} for {self.flag}") from None
        if self.action.choices is not None and result not in self.action.choices:
            raise _Invalid(f"{self.flag} takes one of {', '.join(map(str, self.action.choices))}")
        return result


class _Invalid(Exception):
    """A value an option refuses; re-raised as a UsageError naming where the value came from."""


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return str(value)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _long_flag(action: argparse.Action) -> str | None:
    longs = [s for s in action.option_strings if s.startswith("--")]
    return longs[0] if longs else None


class Settings:
    """The parser's long options as settings; built once per run, before parsing.

    Building it moves every option's default out of argparse (see the
    module docstring), so the parser it was built from then needs
    `resolve` after each parse to be complete.
    """

    def __init__(self, parser: argparse.ArgumentParser, whole: Callable[[], argparse.ArgumentParser] | None = None) -> None:
        """`whole`: for a parser that declares only some commands' options
        (braid.cli.parser.build_parser), what builds every command's: a
        config file is checked against all of them."""
        self._whole = whole
        self.commands = _subparsers(parser)
        self._by_command: dict[str | None, dict[str, Setting]] = {}
        defaults: dict[int, Any] = {}  # by action: parents share one action between parsers
        for command, sub in [(None, parser), *self.commands.items()]:
            table = self._by_command.setdefault(command, {})
            for action in sub._actions:
                flag = _long_flag(action)
                if flag is None or key_name(flag) in NOT_SETTINGS:
                    continue
                if id(action) not in defaults:
                    defaults[id(action)] = action.default
                    action.default = argparse.SUPPRESS
                table[key_name(flag)] = Setting(command, flag, action, defaults[id(action)])

    def of(self, command: str | None) -> dict[str, Setting]:
        """The settings of `braid COMMAND`'s own parser; None: the global ones, taken before any command."""
        return self._by_command[command]

    def all(self) -> Iterator[Setting]:
        for table in self._by_command.values():
            yield from table.values()

    def resolve(self, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ConfigFile:
        """Fill in every option not typed: from the environment, else the config file, else its default.

        `args.typed` keeps the options typed on the command line: a command
        may refuse a typed option that does not apply (--concurrency to a
        local repository) yet ignore the same value set for every run.
        """
        environ = os.environ if environ is None else environ
        command: str = args.command
        table = {**self.of(None), **self.of(command)}  # a command without the common options still has the global ones
        args.typed = frozenset(s.action.dest for s in table.values() if s.action.dest in vars(args))
        config = load(vars(args).get("config"), environ)  # --config, else BRAID_CONFIG, else the default places
        args.config = None if config.path is None else str(config.path)
        self.check(config)
        if "name" in table and "name" not in vars(args):
            args.name = self._layer(table["name"], args, environ, config, command, None)
        name = _target_name(args)
        for setting in table.values():
            if setting.action.dest not in vars(args):
                setattr(args, setting.action.dest, self._layer(setting, args, environ, config, command, name))
        return config

    @staticmethod
    def _layer(setting: Setting, args: argparse.Namespace, environ: Mapping[str, str], config: ConfigFile, command: str, name: str | None) -> Any:
        if setting.in_environment:
            text = environ.get(setting.env)
            if text:  # an empty variable is an unset one, as in most tools
                return setting.from_environment(text)
        if setting.in_file:
            found = config.lookup(setting.key, command, name)
            if found is not None:
                return setting.from_file(*found)
        return setting.default

    def check(self, config: ConfigFile) -> None:
        """Every key and value of the file, not just those this run reads: a typo fails the first run, not the one that needed it."""
        if not (config.top or config.commands or config.names):
            return
        if self._whole is not None:
            Settings(self._whole()).check(config)
            return
        from braid.format.ids import validate_name

        for key, value in config.top.items():
            self._check_key(config, None, key, value, list(self.all()))
        for command, values in config.commands.items():
            if command not in self.commands:
                raise UsageError(f"{config.where(None, f'[commands.{command}]')}: no such command{did_you_mean(command, self.commands)}")
            for key, value in values.items():
                self._check_key(config, f"commands.{command}", key, value, list(self.of(command).values()))
        for name, values in config.names.items():
            try:
                validate_name(name)
            except UsageError as exc:
                raise UsageError(f"{config.where(None, f'[names.{name}]')}: {exc}") from None
            for key, value in values.items():
                if key == "name":
                    raise UsageError(f"{config.where(f'names.{name}', key)}: a [names.NAME] table is already about one name")
                self._check_key(config, f"names.{name}", key, value, list(self.all()))

    def _check_key(self, config: ConfigFile, table: str | None, key: str, value: Any, candidates: list[Setting]) -> None:
        where = config.where(table, key)
        matching = [s for s in candidates if s.key == key]
        if not matching:
            known = {s.key for s in candidates if s.in_file} | ({*TABLES} if table is None else set())
            raise UsageError(f"{where}: unknown key{did_you_mean(key, known)}")
        if not matching[0].in_file:
            if key.startswith(RETENTION_RULES):
                how = f"store retention per name in the repository: braid prune --name NAME {matching[0].flag} ... --save-policy"
            elif matching[0].in_environment:
                how = f"set {matching[0].env} in the environment"
            else:
                how = f"give {matching[0].flag} on the command line"
            raise UsageError(f"{where}: cannot be set in a config file; {how}")
        distinct = list({id(s.action): s for s in matching}.values())
        for setting in distinct:
            try:
                setting.from_file(value, where)
            except UsageError as exc:
                # e.g. pipes = 2 fits backup's --pipes N, not restore's switch: say which, and where it can go
                fits = [s.command for s in distinct if s.command and _accepts(s, value, where)]
                if not fits:
                    raise
                scope = f"; put it under [commands.{fits[0]}]" if table is None else ""
                raise UsageError(f"{exc} (for 'braid {setting.command}'{scope})") from None


def _accepts(setting: Setting, value: Any, where: str) -> bool:
    try:
        setting.from_file(value, where)
    except UsageError:
        return False
    return True


def _target_name(args: argparse.Namespace) -> str | None:
    """The backup name a command is about: --name, or the NAME of NAME@ID (or of --resume's); it picks the [names.NAME] table."""
    name = getattr(args, "name", None)
    if name:
        return str(name)
    target = getattr(args, "backup", None) or getattr(args, "resume", None)
    if isinstance(target, str) and "@" in target:
        return target.partition("@")[0] or None
    return None
