"""The per-request upload timeline: what bench_lib/s3compat/braid_bench_timeline.py recorded, summed up.

One process's JSON lines (its HTTP requests, and in the agent the chunks
handed to the uploader, its part tasks and reads) become the figures that
say where an upload waits: when its first part started, how many parts
were in flight over time, the gaps between requests on one connection,
how long each part took to send and how long the server took to answer
after its last byte, and (agent) how long the reader waited for buffers
and the uploader for slots.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MB = 1e6


@dataclass
class Side:
    """One process's records, relative to its start."""

    name: str
    start: float  # epoch seconds the process started
    end: float  # epoch seconds it ended (or its stream-end)
    records: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, name: str, path: Path, start: float, end: float) -> Side:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return cls(name, start, end, records)

    def kind(self, k: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["k"] == k]

    @property
    def parts(self) -> list[dict[str, Any]]:
        return sorted((r for r in self.kind("http") if "partNumber=" in r["path"] and r["method"] == "PUT"), key=lambda r: r["t0"])


def operation(record: dict[str, Any]) -> str:
    path, method = record["path"], record["method"]
    if "partNumber=" in path:
        return "UploadPart"
    if "uploads" in path.split("?", 1)[-1] and method == "POST":
        return "CreateMultipartUpload"
    if "uploadId=" in path:
        return "CompleteMultipartUpload" if method == "POST" else "AbortMultipartUpload"
    return f"{method} {path.split('?', 1)[0].rsplit('/', 1)[-1] or path}"


def in_flight(parts: list[dict[str, Any]], t0: float, t1: float, step: float) -> list[int]:
    """UploadParts open at each `step` from t0 to t1 (a part is open from its request line to its answer)."""
    counts = []
    t = t0
    while t < t1:
        counts.append(sum(1 for p in parts if p["t0"] <= t < p["head"]))
        t += step
    return counts


def summary(side: Side) -> dict[str, Any]:
    parts = side.parts
    doc: dict[str, Any] = {"side": side.name, "wall_s": round(side.end - side.start, 2)}
    if not parts:
        return doc
    first, last = parts[0]["t0"], max(p["head"] for p in parts)
    nbytes = sum(p["bytes"] for p in parts)
    window = last - first
    # Time-weighted parts in flight over the upload window.
    weighted = sum(p["head"] - p["t0"] for p in parts) / window if window > 0 else float("nan")
    by_port: dict[Any, list[dict[str, Any]]] = {}
    for r in sorted(side.kind("http"), key=lambda r: r["t0"]):
        by_port.setdefault(r["port"], []).append(r)
    gaps = [b["t0"] - a["head"] for rs in by_port.values() for a, b in zip(rs, rs[1:], strict=False)]
    sends = [p["sent"] - p["t0"] for p in parts]
    answers = [p["head"] - p["sent"] for p in parts]
    rates = [p["bytes"] / (p["head"] - p["t0"]) / MB for p in parts if p["head"] > p["t0"]]
    steps = in_flight(parts, first, last, 0.25)
    doc.update(
        {
            "first_part_s": round(first - side.start, 3),
            "last_part_answer_s": round(last - side.start, 3),
            "after_last_part_s": round(side.end - last, 3),
            "parts": len(parts),
            "part_mib": sorted({round(p["bytes"] / 2**20) for p in parts}),
            "connections": len({p["port"] for p in parts}),
            "part_window_mb_s": round(nbytes / window / MB, 1) if window > 0 else None,
            "mean_parts_in_flight": round(weighted, 2),
            "in_flight_quartiles": statistics.quantiles(steps, n=4) if len(steps) > 1 else steps,
            "part_send_s_median": round(statistics.median(sends), 3),
            "server_answer_s_median": round(statistics.median(answers), 3),
            "server_answer_s_max": round(max(answers), 3),
            "part_mb_s_median": round(statistics.median(rates), 1),
            "connection_gaps": len(gaps),
            "connection_gap_s_sum": round(sum(gaps), 3),
            "connection_gap_s_median": round(statistics.median(gaps), 4) if gaps else None,
            "in_flight_every_quarter_s": steps,
        }
    )
    others: dict[str, list[float]] = {}
    for r in side.kind("http"):
        if r in parts:
            continue
        others.setdefault(operation(r), []).append(r["head"] - r["t0"])
    doc["other_requests"] = {op: [len(ts), round(sum(ts), 3)] for op, ts in sorted(others.items())}
    doc["requests_before_first_part"] = [
        [operation(r), round(r["t0"] - side.start, 3), round(r["head"] - r["t0"], 3)] for r in sorted(side.kind("http"), key=lambda r: r["t0"]) if r["t0"] < first
    ]
    doc["requests_after_last_part"] = [
        [operation(r), round(r["t0"] - side.start, 3), round(r["head"] - r["t0"], 3)] for r in sorted(side.kind("http"), key=lambda r: r["t0"]) if r["t0"] >= last
    ]
    reads = side.kind("read")
    if reads:
        doc["reads"] = len(reads)
        doc["read_s_sum"] = round(sum(r["t1"] - r["t0"] for r in reads), 3)
        doc["first_read_s"] = round(min(r["t0"] for r in reads) - side.start, 3)
        doc["last_read_end_s"] = round(max(r["t1"] for r in reads) - side.start, 3)
    for kind, label in (("acquire", "reader_buffer_wait"), ("submit", "submit_slot_wait")):
        found = side.kind(kind)
        if found:
            doc[f"{label}_s_sum"] = round(sum(r["t1"] - r["t0"] for r in found), 3)
    tasks = side.kind("part")
    if tasks:
        # From a part task's start to its UploadPart's request line: the chunks' CRCs (and a wait for the segment's upload).
        starts = sorted(p["t0"] for p in parts)
        lead = []
        for task in tasks:
            following = [s for s in starts if s >= task["t0"]]
            if following:
                lead.append(following[0] - task["t0"])
        doc["part_task_to_request_s_median"] = round(statistics.median(lead), 4) if lead else None
        doc["part_task_s_median"] = round(statistics.median(t["t1"] - t["t0"] for t in tasks), 3)
    return doc


def part_rows(side: Side) -> list[list[Any]]:
    """Each UploadPart: start, request body sent, answer (seconds from the process start), MiB, connection."""
    return [
        [side.name, round(p["t0"] - side.start, 3), round(p["sent"] - side.start, 3), round(p["head"] - side.start, 3),
         round(p["bytes"] / 2**20, 1), p["port"], p["thread"]]
        for p in side.parts
    ]
