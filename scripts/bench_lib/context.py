"""What every benchmark gets: options, paths, the shared data set, logging."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench_lib.data import DataSet, ensure_dataset

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"


@dataclass
class Context:
    args: argparse.Namespace
    workdir: Path
    size: int
    seed: int
    reps: int
    cores: int
    quiet: bool = False
    _dataset: DataSet | None = field(default=None, repr=False)

    @property
    def root(self) -> Path:
        return ROOT

    @property
    def venv_bin(self) -> Path:
        return VENV_BIN

    @property
    def python(self) -> Path:
        return VENV_BIN / "python"

    @property
    def braid(self) -> Path:
        return VENV_BIN / "braid"

    def log(self, message: str) -> None:
        if not self.quiet:
            print(f"[bench] {message}", file=sys.stderr, flush=True)

    def dataset(self) -> DataSet:
        """The shared data file, generated on first use and cached in the work directory."""
        if self._dataset is None:
            self._dataset = ensure_dataset(self.workdir, self.size, self.seed, self.log)
        return self._dataset

    def scratch(self, name: str) -> Path:
        """A per-benchmark scratch directory inside the work directory."""
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        env.update(extra)
        return env


def size_arg(text: str) -> int:
    """argparse type for sizes with units (64MiB, 8M, 1G)."""
    from braid.cli.sizes import parse_size

    try:
        return parse_size(text)
    except Exception as exc:  # braid's UsageError
        raise argparse.ArgumentTypeError(str(exc)) from None


class _GivenSize(argparse.Action):
    """Stores the size and notes that it was typed: `local` then uses it instead of braid's own default."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.chunk_size_given = True


def add_option_once(parser: argparse.ArgumentParser, *flags: str, **kwargs) -> None:
    """Add an option unless another benchmark already did (`all` shares options such as --chunk-size)."""
    if any(flag in parser._option_string_actions for flag in flags):
        return
    parser.add_argument(*flags, **kwargs)


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by benchmarks that run the codec or the CLI."""
    add_option_once(parser, "--chunk-size", type=size_arg, default=size_arg("64MiB"), action=_GivenSize,
                    help="chunk size (default 64MiB; local: braid's default for a directory repository, 16MiB)")
    add_option_once(parser, "--level", type=int, default=3, help="zstd level for ours and the reference (default 3)")
