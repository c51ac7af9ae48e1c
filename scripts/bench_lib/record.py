"""`scripts/bench ... --record`: write the run's figures into docs/benchmarks.md.

docs/benchmarks.md is written only here, never by hand. It holds one
section per benchmark, the last recorded run of it, between the markers
`<!-- bench:NAME -->` and `<!-- /bench:NAME -->`: when and on which commit
it ran, on what machine, the command line, and the table `scripts/bench`
printed. A run replaces the sections of the benchmarks it ran and keeps
the others; sections stay in the benchmarks' order (ORDER, then name).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_lib.report import Section, print_table

HEAD = """# Benchmarks

Written by `scripts/bench BENCHMARK --record` (scripts/bench_lib/record.py):
never edit this file by hand, run the benchmark again. Each section is the
last recorded run of one benchmark: when and on which commit it ran, the
machine, the command line, and the table it printed. Every figure is a
ratio against a standard tool measured in the same run (`zstd`, `openssl`,
plain boto3 uploads), or a model priced from measured work; the benchmarks
themselves are described in [design.md](design.md#how-it-works). Runs on a
shared or loaded machine vary: compare figures within one section, not
across sections recorded on different days.
"""

MARK = re.compile(r"<!-- bench:(?P<name>[\w-]+) -->\n.*?<!-- /bench:(?P=name) -->\n", re.S)


@dataclass(frozen=True)
class Run:
    """Where and how the recorded sections were measured."""

    date: str  # YYYY-MM-DD, UTC
    commit: str  # short hash, "+dirty" when the work tree had changes
    command: str  # the scripts/bench command line
    header: dict[str, Any]  # what print_table puts in its first line (size, cores, reps, tool versions, data)


def render_section(run: Run, section: Section) -> str:
    """One benchmark's block, markers included."""
    table = io.StringIO()
    print_table(run.header, [section], out=table)
    body = table.getvalue().rstrip("\n")
    machine = ", ".join(f"{k} {v}" for k, v in run.header.items() if k in ("cores", "python", "zstd", "openssl") and v)
    return (
        f"<!-- bench:{section.name} -->\n"
        f"## {section.name}\n\n"
        f"{section.title}. Recorded {run.date} on commit {run.commit} ({machine}): `{run.command}`\n\n"
        f"```text\n{body}\n```\n"
        f"<!-- /bench:{section.name} -->\n"
    )


def merge(existing: str, run: Run, sections: list[Section], order: list[str]) -> str:
    """The document with `sections` replacing (or joining) the recorded ones; a skipped section keeps the old record."""
    blocks = {m.group("name"): m.group(0) for m in MARK.finditer(existing)}
    for section in sections:
        if not section.skipped:
            blocks[section.name] = render_section(run, section)
    rank = {name: i for i, name in enumerate(order)}
    names = sorted(blocks, key=lambda n: (rank.get(n, len(rank)), n))
    return HEAD + "".join("\n" + blocks[name] for name in names)


def record(path: Path, run: Run, sections: list[Section], order: list[str]) -> None:
    """Rewrite `path` with this run's sections (written whole to a temporary file, then renamed over it)."""
    existing = path.read_text() if path.exists() else ""
    text = merge(existing, run, sections, order)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
