"""The TOML config file: where it is, and its shape (values are checked by braid.cli.settings).

One file, the first found of `--config PATH`, `BRAID_CONFIG`,
`$XDG_CONFIG_HOME/braid/config.toml` (default `~/.config/braid/config.toml`)
and `/etc/braid/config.toml`. Files are not merged: the one in use is the
whole story, so what a run did can be read off one file. An explicitly named
file must exist; a default one may be absent, but one that exists and
cannot be read is an error rather than silently skipped (a backup run with
half its settings is worse than one that does not start).

Three levels, most specific first, in the spirit of pgBackRest's
`[global]`, `[global:backup]` and `[stanza]` sections:

    repo = "/srv/braid"              # top level: every command
    [commands.backup]                # one command
    level = 6
    [names.pg]                       # backups of one name (backup --name pg, restore pg@..., ...)
    chunk_size = "128MiB"
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from braid.errors import UsageError

ENV_CONFIG = "BRAID_CONFIG"
SYSTEM_CONFIG = Path("/etc/braid/config.toml")
TABLES = ("commands", "names")  # the top-level keys that hold tables rather than settings


def user_config() -> Path:
    """$XDG_CONFIG_HOME/braid/config.toml: beside the key files (braid.cli.compose.config_dir)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "braid" / "config.toml"


def default_paths() -> list[Path]:
    return [user_config(), SYSTEM_CONFIG]


@dataclass(frozen=True)
class ConfigFile:
    """A parsed config file: settings at the top level, per command and per backup name."""

    path: Path | None  # None: no file (every setting from flags, environment or defaults)
    top: dict[str, Any] = field(default_factory=dict)
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)
    names: dict[str, dict[str, Any]] = field(default_factory=dict)

    def where(self, table: str | None, key: str) -> str:
        """How an error names a setting: the file, the table and the key, as the user would find it."""
        section = f" [{table}]" if table else ""
        return f"config file {self.path}:{section} {key}"

    def lookup(self, key: str, command: str | None, name: str | None) -> tuple[Any, str] | None:
        """The most specific value of `key` for this command and backup name, and where it was found."""
        if name is not None and key in self.names.get(name, {}):
            return self.names[name][key], self.where(f"names.{name}", key)
        if command is not None and key in self.commands.get(command, {}):
            return self.commands[command][key], self.where(f"commands.{command}", key)
        if key in self.top:
            return self.top[key], self.where(None, key)
        return None


def locate(explicit: str | None, environ: Mapping[str, str]) -> tuple[Path | None, bool]:
    """The file to read, and whether it was named (then it must exist)."""
    named = explicit or environ.get(ENV_CONFIG) or None
    if named:
        return Path(named).expanduser(), True
    for path in default_paths():
        if os.path.lexists(path):
            return path, False
    return None, False


def load(explicit: str | None, environ: Mapping[str, str] | None = None) -> ConfigFile:
    """Read and shape-check the config file; a missing default file is an empty config."""
    path, named = locate(explicit, os.environ if environ is None else environ)
    if path is None:
        return ConfigFile(None)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        how = "--config" if explicit else ENV_CONFIG if named else "a dangling link at a default place"
        raise UsageError(f"config file {path} not found (named by {how})") from None
    except OSError as exc:
        raise UsageError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    import tomllib  # only when there is a file: most runs on a host have none, and every run starts here

    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"config file {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path} is not valid TOML: {exc}") from None
    return _shape(path, doc)


def _shape(path: Path, doc: dict[str, Any]) -> ConfigFile:
    config = ConfigFile(path)
    for key, value in doc.items():
        if key not in TABLES:
            config.top[key] = value
            continue
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            example = "[commands.backup]" if key == "commands" else "[names.pg]"
            raise UsageError(f"{config.where(None, key)}: must hold one table per {key[:-1]}, e.g. {example}")
        getattr(config, key).update(value)
    return config
