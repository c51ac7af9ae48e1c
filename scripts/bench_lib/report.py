"""What a benchmark returns, and the shared printers (table on stdout, or JSON).

A benchmark returns a `Section`: comparisons (ours vs a reference measured in
the same run, as throughput and ratio, with an optional target), free-form
tables (breakdowns, models) and notes. Throughput is in MB/s, decimal
megabytes (10^6 bytes) of plaintext per second, for both sides.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from bench_lib.timing import Series

MB = 1_000_000


@dataclass
class Comparison:
    """Ours vs a reference over the same bytes. Higher is better unless `lower_is_better`."""

    name: str
    ours_label: str
    reference_label: str
    nbytes: int
    ours: Series
    reference: Series
    target: float | None = None  # minimum ratio ours/reference (wall, best of each)
    extra: dict[str, Any] = field(default_factory=dict)

    def mbps(self, seconds: float) -> float:
        return self.nbytes / seconds / MB

    @property
    def ratio_best(self) -> float:
        return self.reference.best_wall / self.ours.best_wall

    @property
    def ratio_median(self) -> float:
        return self.reference.median_wall / self.ours.median_wall

    @property
    def ratio_cpu(self) -> float:
        """CPU-time throughput ratio (best of each): ours per CPU-second vs the reference's."""
        return self.reference.best_cpu / self.ours.best_cpu

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        return "PASS" if self.ratio_best >= self.target else "MISS"

    def to_json(self) -> dict[str, Any]:
        def side(label: str, series: Series) -> dict[str, Any]:
            return {
                "command": label,
                "best_mbps": round(self.mbps(series.best_wall), 1),
                "median_mbps": round(self.mbps(series.median_wall), 1),
                "cpu_mbps": round(self.mbps(series.best_cpu), 1),
                "cpu_seconds_per_gib": round(series.best_cpu * 2**30 / self.nbytes, 3),
                "max_rss_kib": series.max_rss or None,
                "samples": [{"wall": round(s.wall, 4), "cpu": round(s.cpu, 4)} for s in series.samples],
            }

        return {
            "name": self.name,
            "bytes": self.nbytes,
            "ours": side(self.ours_label, self.ours),
            "reference": side(self.reference_label, self.reference),
            "ratio_best": round(self.ratio_best, 3),
            "ratio_median": round(self.ratio_median, 3),
            "ratio_cpu": round(self.ratio_cpu, 3),
            "target": self.target,
            "verdict": self.verdict or None,
            **self.extra,
        }


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]
    key: str = ""  # a stable name for the JSON reader (titles are prose)

    def to_json(self) -> dict[str, Any]:
        doc = {"title": self.title, "rows": [dict(zip(self.columns, row, strict=True)) for row in self.rows]}
        return {"key": self.key, **doc} if self.key else doc


@dataclass
class Section:
    name: str
    title: str
    comparisons: list[Comparison] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # scalar figures (sizes, ratios) for JSON and a short list
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"title": self.title}
        if self.skipped:
            doc["skipped"] = self.skipped
        doc["comparisons"] = [c.to_json() for c in self.comparisons]
        doc["tables"] = [t.to_json() for t in self.tables]
        doc["facts"] = self.facts
        doc["notes"] = self.notes
        return doc


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def _grid(columns: list[str], rows: list[list[Any]], out: TextIO, indent: str = "  ") -> None:
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [
        all(isinstance(row[i], (int, float)) or row[i] == "" for row in rows) or all(str(row[i]).endswith("%") for row in rows)
        for i in range(len(columns))
    ]

    def line(values: list[str]) -> str:
        return indent + "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric, strict=True)).rstrip()

    print(line(columns), file=out)
    print(indent + "  ".join("-" * w for w in widths), file=out)
    for row in cells:
        print(line(row), file=out)


def print_table(header: dict[str, Any], sections: list[Section], out: TextIO = sys.stdout) -> None:
    print("Braid benchmarks  (" + ", ".join(f"{k} {v}" for k, v in header.items()) + ")", file=out)
    for section in sections:
        print(f"\n== {section.name}: {section.title}", file=out)
        if section.skipped:
            print(f"  skipped: {section.skipped}", file=out)
        if section.comparisons:
            rows = []
            for c in section.comparisons:
                rows.append(
                    [
                        c.name,
                        c.mbps(c.ours.best_wall),
                        c.mbps(c.reference.best_wall),
                        c.ratio_best,
                        c.ratio_median,
                        c.mbps(c.ours.best_cpu),
                        c.mbps(c.reference.best_cpu),
                        c.ratio_cpu,
                        f">= {c.target:.2f}" if c.target is not None else "",
                        c.verdict,
                    ]
                )
            _grid(
                ["benchmark", "ours MB/s", "ref MB/s", "ratio", "ratio(med)", "ours MB/cpu-s", "ref MB/cpu-s", "cpu ratio", "target", ""],
                rows,
                out,
            )
            print("  references:", file=out)
            for c in section.comparisons:
                print(f"    {c.name}: ours = {c.ours_label}", file=out)
                print(f"    {' ' * len(c.name)}  ref  = {c.reference_label}", file=out)
        for table in section.tables:
            print(f"\n  {table.title}", file=out)
            _grid(table.columns, table.rows, out, indent="    ")
        if section.facts:
            print("", file=out)
            for key, value in section.facts.items():
                print(f"  {key}: {_fmt(value)}", file=out)
        for note in section.notes:
            print(f"  note: {note}", file=out)
    print(
        "\nratio = ours/reference throughput (best wall time of each side, runs interleaved); "
        "ratio(med) uses medians; cpu ratio compares MB per CPU-second.",
        file=out,
    )


def print_json(header: dict[str, Any], sections: list[Section], out: TextIO = sys.stdout) -> None:
    doc = {"braid_bench": 1, **header, "benchmarks": {s.name: s.to_json() for s in sections}}
    json.dump(doc, out, indent=2)
    out.write("\n")
