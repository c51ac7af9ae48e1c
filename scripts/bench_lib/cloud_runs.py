"""The `cloud` benchmark's variants (HTTP or HTTPS, one input or several) and its 1 TiB projection.

A variant runs the same interleaved comparison as the default one (agent,
boto3 multipart, zstd -3 -T1 on the same bytes) against the same s3proxy:

- `https`: the agent and boto3 reach s3proxy's TLS endpoint, both trusting
  its throwaway self-signed certificate through AWS_CA_BUNDLE (made at run
  time by bench_lib.s3proxy.make_keystore).
- `--pipes N` (N > 1): the agent gets the data set and N - 1 copies of it as
  N `--input` files, read concurrently into one upload; the reference is N
  boto3 `upload_fileobj` processes of the same files started together, timed from
  the first start to the last exit (`bash -c '... & ... & wait'`: one wait4
  rusage covers all of them; peak RSS is the largest single process's).

The projection: from the measured slope (the agent's time and CPU-seconds
past an empty backup's, per byte), the hours to stage 1 TiB when the link
(1 or 10 Gbit/s) or the measured rate limits, whichever is slower, and the
host CPU-seconds per TiB.
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

TIB = 2**40
LINKS_GBIT = (1, 10)


@dataclass(frozen=True)
class Variant:
    transport: str  # "http" or "https"
    pipes: int  # agent inputs; boto3 uploads in parallel

    @property
    def name(self) -> str:
        """'' for the default (HTTP, one input): its figures keep the plain size as their key."""
        parts = [p for p in ("https" if self.transport == "https" else "", f"pipes{self.pipes}" if self.pipes > 1 else "") if p]
        return " ".join(parts)

    @property
    def prefix(self) -> str:
        return (self.name.replace(" ", "-") + "-") if self.name else ""

    def key(self, size: str) -> str:
        return f"{size} {self.name}".strip()


def variants(transports: list[str], pipes: int) -> list[Variant]:
    """Each transport with one input, then (for --pipes N > 1) each with N: the default first."""
    found = [Variant(t, 1) for t in transports]
    if pipes > 1:
        found += [Variant(t, pipes) for t in transports]
    return found


def transports_arg(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names or any(t not in ("http", "https") for t in names):
        raise ValueError(f"--transports takes http, https or both (comma-separated), not {text!r}")
    return list(dict.fromkeys(names))


def input_files(data: Path, work: Path, pipes: int) -> list[Path]:
    """The data set, then pipes - 1 copies of it in `work` (the agent refuses one file as two inputs; each boto3 upload gets its own too)."""
    files = [data]
    for index in range(1, pipes):
        copy = work / f"pipe-input-{index}.bin"
        if not copy.exists() or copy.stat().st_size != data.stat().st_size:
            shutil.copyfile(data, copy)
        files.append(copy)
    return files


def remove_copies(files: list[Path]) -> None:
    for path in files[1:]:
        path.unlink(missing_ok=True)


def parallel_argv(argvs: list[list[str]]) -> list[str]:
    """One command that starts every argv at once and waits for all; fails if any does."""
    starts = " ".join(f"{shlex.join(argv)} & pids+=($!);" for argv in argvs)
    return ["bash", "-c", f"pids=(); {starts} status=0; for p in \"${{pids[@]}}\"; do wait $p || status=$?; done; exit $status"]


def projection(nbytes: int, wall: float, cpu: float, startup_wall: float, startup_cpu: float) -> dict[str, float]:
    """1 TiB from the measured slope: hours at each link rate (the slower of link and measured rate), CPU-s per TiB."""
    rate = nbytes / max(wall - startup_wall, 1e-6)  # bytes/s past the fixed cost
    doc = {"measured_mb_s": round(rate / 1e6, 1)}
    for gbit in LINKS_GBIT:
        limit = min(rate, gbit * 1e9 / 8)
        doc[f"hours_at_{gbit}_gbit"] = round((startup_wall + TIB / limit) / 3600, 2)
    doc["host_cpu_seconds"] = round(max(cpu - startup_cpu, 0.0) / nbytes * TIB, 0)
    return doc
