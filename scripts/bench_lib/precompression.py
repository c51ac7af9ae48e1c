"""Host-side pre-compression, modelled and not built (issue 22, item 5): what it would do to the cloud pipeline.

The idea: the agent compresses the stream with a fast codec (lz4 -1 or
zstd -1) before staging it, and the worker undoes that before its own codec
(zstd -3, AES-GCM), so the stored chunks and the format stay as they are.
What changes, and how this model gets it:

- the staged bytes per stream byte (`staged_ratio`): MEASURED here, by running
  the `lz4`/`zstd` CLIs on one chunk of the bench data (a codec whose CLI is
  absent is left out, not assumed);
- the host's CPU: MEASURED with the same CLIs (best of 3) against `zstd -3 -T1`
  on the same chunk; issue 22 assumed "about 0.08x of zstd -3's CPU", which
  the row sets beside the measured ratio (`host_cpu_vs_zstd3`);
- the host's upload: a host whose uplink is the bottleneck (`uplink_mb_s`)
  ships 1/staged_ratio more stream per second, unless its cores cannot
  compress that fast (HOST_CORES, assumed, of the bench machine's speed);
- each worker moves staged_ratio + stored ratio of a chunk over its network
  instead of 1 + stored ratio, and spends the decompression's CPU (MEASURED
  with the CLI, scaled to Graviton2 by the model's zstd factor);
- the agent's UploadParts and the staging storage shrink by staged_ratio.

The pipeline is then simulated as any other cost row (bench_lib.scale_sim, the
real planner and Finalize), at the stream rate the host reaches, and priced
(benchmarks.cloud_model.simulated_row). Request counts per item are the
calibrated worker's (its ranged GETs are counted at the full chunk size: an
upper bound for the smaller staged chunks).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench_lib.timing import run_command

TIB = 2**40
ISSUE_CPU_VS_ZSTD3 = 0.08  # issue 22, item 5: "at about 0.08x of zstd -3's CPU" (the assumption the row checks)
# Cores the host gives the agent's compression: an assumption (a database host of 4+ cores running a backup beside it).
HOST_CORES = 4
# The codecs modelled: (compress, decompress) command lines, each reading a file and writing stdout.
CODECS = {
    "lz4 -1": (["lz4", "-1", "-q", "-c"], ["lz4", "-d", "-q", "-c"]),
    "zstd -1": (["zstd", "-1", "-T1", "-q", "-c"], ["zstd", "-d", "-q", "-c"]),
}
REFERENCE = ["zstd", "-3", "-T1", "-q", "-c"]  # the worker's codec level, what the CPU ratio compares with


def _cpu(command: list[str], source: Path, reps: int = 3) -> float:
    return min(run_command([*command, str(source)]).cpu for _ in range(reps))


def measure_codecs(chunk_file: Path) -> list[dict[str, Any]]:
    """Per codec whose CLI is installed: its compressed size over the chunk's, and the CPU seconds (best of 3) to
    compress and decompress the chunk here, with zstd -3's for the same chunk. Empty without the zstd CLI."""
    if shutil.which("zstd") is None:
        return []
    size = chunk_file.stat().st_size
    zstd3 = _cpu(REFERENCE, chunk_file)
    found = []
    for name, (compress, decompress) in CODECS.items():
        if shutil.which(compress[0]) is None:
            continue
        packed = chunk_file.with_suffix(".packed")
        try:
            with open(packed, "wb") as out:
                subprocess.run([*compress, str(chunk_file)], stdout=out, check=True)
            ratio = packed.stat().st_size / size
            found.append({
                "codec": name, "staged_ratio": ratio, "compress_cpu": _cpu(compress, chunk_file),
                "decompress_cpu": _cpu(decompress, packed), "zstd3_cpu": zstd3, "chunk_bytes": size,
            })
        finally:
            packed.unlink(missing_ok=True)
    return found


def host_rate(codec: dict[str, Any] | None, uplink_mb_s: float) -> float:
    """The stream rate (MB/s of the database's bytes) a host with `uplink_mb_s` of upload reaches: the uplink over the
    staged ratio, at most what HOST_CORES cores compress (without pre-compression: the uplink)."""
    if codec is None:
        return uplink_mb_s
    compress_mb_s = codec["chunk_bytes"] / 1e6 / codec["compress_cpu"]
    return min(uplink_mb_s / codec["staged_ratio"], HOST_CORES * compress_mb_s)


def cases(
    codecs: list[dict[str, Any]], *, cpu_arm: float, arm: float, chunk: int, uplinks: tuple[float, ...],
) -> list[tuple[float, dict[str, Any] | None, float, float, float]]:
    """Each row's (uplink, codec or None, stream MB/s the host reaches (simulated at it rounded to 0.1), worker CPU per chunk on arm64, staged ratio)."""
    found = []
    for uplink in uplinks:
        for codec in [None, *codecs]:
            staged = 1.0 if codec is None else codec["staged_ratio"]
            per_chunk = chunk / codec["chunk_bytes"] if codec else 0.0
            worker_cpu = cpu_arm + (codec["decompress_cpu"] * per_chunk / arm if codec else 0.0)
            found.append((uplink, codec, host_rate(codec, uplink), worker_cpu, staged))
    return found


def rows(
    codecs: list[dict[str, Any]], *, cpu_arm: float, stored_ratio: float, arm: float, memory: int, network: float,
    options: dict[str, Any], simulated_row: Any, uplinks: tuple[float, ...] = (300.0,), tib: float = 1, workers: int = 500, log: Any = None,
) -> list[dict[str, Any]]:
    """Without pre-compression and with each measured codec, at each host uplink: the pipeline simulated and priced.

    `cpu_arm`: the worker's CPU per chunk on Graviton2 without pre-compression; `arm`: Graviton2 vs this machine
    (the decompression's CPU is scaled by it); `simulated_row`: benchmarks.cloud_model.simulated_row."""
    chunk = options["chunk_size"]
    found = []
    for uplink, codec, rate, worker_cpu, staged in cases(codecs, cpu_arm=cpu_arm, arm=arm, chunk=chunk, uplinks=uplinks):
        per_chunk = chunk / codec["chunk_bytes"] if codec else 0.0
        row = simulated_row(  # one stream end: the rows compare bytes and cost (the tail's phases are the main table's)
            tib, workers, round(rate, 1), memory, network, {**options, "worker_cpu": worker_cpu, "staged_ratio": staged}, log, phases=1,
        )
        host_cpu = codec["compress_cpu"] * per_chunk * (tib * TIB / chunk) if codec else 0.0
        found.append({
            "codec": codec["codec"] if codec else "none",
            "uplink_mb_s": uplink,
            "staged_ratio": round(staged, 4),  # measured: the CLI's output over one chunk of the bench data
            "host_cpu_vs_zstd3": round(codec["compress_cpu"] / codec["zstd3_cpu"], 3) if codec else 0.0,  # measured
            "host_cpu_vs_zstd3_assumed": ISSUE_CPU_VS_ZSTD3 if codec else 0.0,
            "host_cpu_seconds_per_tib": round(host_cpu / tib, 1),  # this machine's cores
            "host_upload_seconds_per_tib": round(TIB / (rate * 1e6), 1),
            "stream_mb_s": row["stream_mb_s"],
            "worker_read_mb_per_chunk": round(chunk * staged / 1e6, 2),
            "worker_write_mb_per_chunk": round(chunk * stored_ratio / 1e6, 2),
            "worker_moved_mb_per_chunk": round(chunk * (staged + stored_ratio) / 1e6, 2),
            "worker_cpu_per_chunk_arm": round(worker_cpu, 4),
            "lambda_network_mb_s": row["lambda_network_mb_s"],
            "cost_per_tib": row["cost_per_tib"],
            "worker_cost_per_tib": row["costs_per_tib"]["lambda compute (worker)"],
            "staging_cost_per_tib": row["costs_per_tib"]["staging storage"],
            "seconds_after_stream_end": row["seconds_after_stream_end"],
        })
    return found
