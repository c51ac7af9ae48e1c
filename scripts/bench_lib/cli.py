"""`scripts/bench SUBCOMMAND [options]`: run benchmarks, print a table or JSON."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

import bench_lib.benchmarks as benchmarks_pkg
from bench_lib.context import ROOT, Context, size_arg
from bench_lib.record import Run, record
from bench_lib.report import Section, print_json, print_table

try:
    from braid.cli.sizes import format_size
except ImportError:  # the harness must still explain itself without the package
    sys.exit("bench: the braid package is not importable; run it through scripts/bench (project .venv)")


def discover() -> list[ModuleType]:
    modules = []
    for info in pkgutil.iter_modules(benchmarks_pkg.__path__):
        module = importlib.import_module(f"{benchmarks_pkg.__name__}.{info.name}")
        if hasattr(module, "NAME") and hasattr(module, "run"):
            modules.append(module)
    return sorted(modules, key=lambda m: (getattr(m, "ORDER", 100), m.NAME))


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("common options")
    group.add_argument("--size", type=size_arg, default=size_arg("512MiB"), help="size of the generated data set (default 512MiB)")
    group.add_argument("--workdir", type=Path, default=ROOT / ".bench", help="cache and scratch directory (default .bench/ at the repo root)")
    group.add_argument("--reps", type=int, default=5, help="repetitions per side, interleaved; best and median are reported (default 5)")
    group.add_argument("--seed", type=int, default=1, help="data generator seed (default 1)")
    group.add_argument("--json", action="store_true", help="print one JSON document on stdout instead of the table")
    group.add_argument(
        "--record", action="store_true", help="also write the figures into docs/benchmarks.md (its sections of the benchmarks run; never edit it by hand)"
    )
    group.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    group.add_argument("--debug", action="store_true", help="show tracebacks of failing benchmarks")


def build_parser(modules: list[ModuleType]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Braid benchmarks: ours vs a reference measured in the same run, as ratios. Not a test.",
        epilog="Examples: scripts/bench codec --size 256MiB; scripts/bench all --json > bench.json",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in modules:
        p = sub.add_parser(module.NAME, help=getattr(module, "HELP", ""), description=getattr(module, "HELP", None))
        _common(p)
        if hasattr(module, "add_arguments"):
            module.add_arguments(p)
    in_all = [m for m in modules if getattr(m, "IN_ALL", True)]
    p = sub.add_parser(
        "all",
        help="run " + ", ".join(m.NAME for m in in_all),
        description="Run every benchmark that belongs to `all`, one after the other, on the same data.",
        conflict_handler="resolve",
    )
    _common(p)
    for module in in_all:
        if hasattr(module, "add_arguments"):
            module.add_arguments(p)
    sub.add_parser("data", help="only generate (or find) the cached data set and describe it").set_defaults(_data_only=True)
    _common(sub.choices["data"])
    return parser


def _header(ctx: Context, dataset_doc: dict) -> dict:
    def version(tool: str) -> str | None:
        if not shutil.which(tool):
            return None
        args = [tool, "version"] if tool == "openssl" else [tool, "-V"]
        out = subprocess.run(args, capture_output=True, text=True).stdout
        match = re.search(r"v?(\d+\.\d+\.\d+\w*)", out)
        return match.group(1) if match else None

    return {
        "size": format_size(ctx.size),
        "cores": ctx.cores,
        "reps": ctx.reps,
        "python": platform.python_version(),
        "zstd": version("zstd"),
        "openssl": version("openssl"),
        "data": dataset_doc,
    }


def _compile_braid(ctx: Context) -> None:
    """Byte-compile the braid package once, as pip does when it installs it.

    Without bytecode on disk (PYTHONDONTWRITEBYTECODE is set, or nothing ran
    the checkout yet) every `braid` process compiles each module it imports
    from source, which an installed braid never pays, billed to braid's side
    of every comparison.
    """
    package = ROOT / "layers" / "braid" / "braid"
    if package.is_dir():
        subprocess.run([str(ctx.python), "-m", "compileall", "-q", str(package)], capture_output=True, check=False)


def main(argv: list[str] | None = None) -> int:
    modules = discover()
    args = build_parser(modules).parse_args(argv)
    if args.reps < 1:
        print("bench: --reps must be at least 1", file=sys.stderr)
        return 2
    ctx = Context(
        args=args,
        workdir=args.workdir.resolve(),
        size=args.size,
        seed=args.seed,
        reps=args.reps,
        cores=os.cpu_count() or 1,
        quiet=args.quiet,
    )
    data = ctx.dataset()
    data_doc = data.describe()
    _compile_braid(ctx)
    if getattr(args, "_data_only", False):
        print(f"{data.path}: {format_size(data.size)}, seed {data.seed}, {data.random_share:.1%} random")
        return 0
    selected = [m for m in modules if getattr(m, "IN_ALL", True)] if args.command == "all" else [m for m in modules if m.NAME == args.command]
    sections: list[Section] = []
    failed = False
    started = time.perf_counter()
    for module in selected:
        ctx.log(f"running {module.NAME} ...")
        t0 = time.perf_counter()
        try:
            section = module.run(ctx)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # one failing benchmark must not lose the others' figures
            failed = True
            if args.debug:
                traceback.print_exc()
            section = Section(module.NAME, getattr(module, "HELP", module.NAME), skipped=f"failed: {exc}")
        ctx.log(f"{module.NAME} done in {time.perf_counter() - t0:.0f} s")
        sections.append(section)
    header = _header(ctx, data_doc)
    header["seconds"] = round(time.perf_counter() - started, 1)
    short = {k: v for k, v in header.items() if k not in ("data", "python")}
    short["data"] = f"{data.path.name}, {data.random_share:.0%} random"
    if args.json:
        print_json(header, sections)
    else:
        print_table(short, sections)
    if args.record:
        _record(short, sections, modules, argv)
    return 1 if failed else 0


def _record(header: dict, sections: list[Section], modules: list[ModuleType], argv: list[str] | None) -> None:
    """docs/benchmarks.md gets this run's sections (the benchmarks that did not fail), with where and when they ran."""

    def git(*words: str) -> str:
        return subprocess.run(["git", *words], capture_output=True, text=True, cwd=ROOT, check=False).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    words = [w for w in (sys.argv[1:] if argv is None else argv) if w not in ("--record", "--json", "--quiet")]
    run = Run(
        date=time.strftime("%Y-%m-%d", time.gmtime()),
        commit=commit,
        command=" ".join(["scripts/bench", *words]),
        header={**header, "python": platform.python_version()},
    )
    target = ROOT / "docs" / "benchmarks.md"
    record(target, run, sections, [m.NAME for m in modules])
    print(f"bench: recorded {', '.join(s.name for s in sections if not s.skipped) or 'nothing'} in {target}", file=sys.stderr)
