"""docs/benchmarks.md is written by `scripts/bench --record` (scripts/bench_lib/record.py), never by hand."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from bench_lib.cli import discover  # noqa: E402
from bench_lib.record import HEAD, MARK, Run, merge, record  # noqa: E402
from bench_lib.report import Section, Table  # noqa: E402

RUN = Run(date="2026-11-28", commit="abc1234", command="scripts/bench codec --size 64MiB", header={"size": "64 MiB", "cores": 2, "reps": 3})


def section(name: str, value: float, skipped: str | None = None) -> Section:
    return Section(name, f"{name} title", tables=[Table("figures", ["what", "ratio"], [["ours/ref", value]])], skipped=skipped)


def test_a_run_writes_its_sections_in_the_benchmarks_order(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    record(doc, RUN, [section("local", 1.25), section("codec", 0.75)], ["codec", "local", "cloud"])
    text = doc.read_text()
    assert text.startswith(HEAD)
    assert [m.group("name") for m in MARK.finditer(text)] == ["codec", "local"]
    assert "Recorded 2026-11-28 on commit abc1234 (cores 2): `scripts/bench codec --size 64MiB`" in text
    assert "ours/ref  1.250" in text and "ours/ref  0.750" in text


def test_a_later_run_replaces_only_its_own_sections_and_a_failed_one_keeps_the_record(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    order = ["codec", "local"]
    record(doc, RUN, [section("codec", 0.75), section("local", 1.25)], order)
    later = Run(date="2026-12-01", commit="def5678", command="scripts/bench local", header=RUN.header)
    record(doc, later, [section("local", 1.5), section("codec", 9.0, skipped="failed: boom")], order)
    text = doc.read_text()
    blocks = {m.group("name"): m.group(0) for m in MARK.finditer(text)}
    assert "0.750" in blocks["codec"] and "2026-11-28" in blocks["codec"] and "9.000" not in text
    assert "1.500" in blocks["local"] and "2026-12-01 on commit def5678" in blocks["local"] and "1.250" not in text


def test_the_committed_benchmarks_md_is_exactly_what_record_writes() -> None:
    """Re-rendering with no new run gives the file back (nothing outside the recorded sections, which are in order), and
    each section has the shape render_section gives it: a dated, committed run's command line and the table it printed."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    blocks = list(MARK.finditer(text))
    order = [m.NAME for m in discover()]
    assert blocks and {m.group("name") for m in blocks} <= set(order)
    assert merge(text, RUN, [], order) == text
    shape = re.compile(
        r"<!-- bench:([\w-]+) -->\n## \1\n\n[^\n]+\. Recorded \d{4}-\d\d-\d\d on commit [0-9a-f]{7,}(\+dirty)? \([^\n]*\): `scripts/bench \1[^`]*`\n\n"
        r"```text\nBraid benchmarks  \([^\n]*\)\n\n== \1: [^`]*\n```\n<!-- /bench:\1 -->\n"
    )
    for block in blocks:
        assert shape.fullmatch(block.group(0)), block.group(0)[:300]
