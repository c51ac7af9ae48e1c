"""Host-side pre-compression, modelled and not built (scripts/bench_lib/precompression.py, issue 22 item 5).

The staged ratio and the CPU come from running the lz4/zstd CLIs on the bench data (counted, not assumed); the
pipeline is the scale simulation's, priced as every scripts/bench cloud-model row."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from bench_lib import precompression, scale_sim  # noqa: E402
from bench_lib.benchmarks import cloud_model  # noqa: E402
from bench_lib.data import ensure_dataset  # noqa: E402

pytestmark = pytest.mark.long  # simulated backups: after the main suite (scripts/test-long)

CHUNK = 64 * 2**20


@pytest.mark.skipif(shutil.which("zstd") is None or shutil.which("lz4") is None, reason="the zstd and lz4 CLIs measure the codecs")
def test_pre_compression_shrinks_what_each_worker_moves_and_the_hosts_upload_and_is_priced_as_the_pipeline_runs(tmp_path: Path) -> None:
    data = ensure_dataset(tmp_path, CHUNK, 1)
    codecs = precompression.measure_codecs(data.path)
    assert [c["codec"] for c in codecs] == ["lz4 -1", "zstd -1"]
    for codec in codecs:  # the bench data is ~30% incompressible: neither codec reaches zstd -3's 0.54 nor nothing
        assert 0.54 < codec["staged_ratio"] < 0.9 and 0 < codec["compress_cpu"] < codec["zstd3_cpu"], codec
    options = {"chunk_size": CHUNK, "worker_cpu": scale_sim.WORKER_CPU_SECONDS, "ratio": scale_sim.STORED_RATIO, "lanes": 4,
               "calibration": scale_sim.calibrate_worker(), "cpu_speed": 0.8}
    rows = precompression.rows(codecs, cpu_arm=scale_sim.WORKER_CPU_SECONDS, stored_ratio=scale_sim.STORED_RATIO, arm=0.8, memory=1769,
                               network=76.0, options=options, simulated_row=cloud_model.simulated_row, uplinks=(300.0,), tib=0.25)
    none, *compressed = rows
    assert none["codec"] == "none" and none["staged_ratio"] == 1.0 and none["stream_mb_s"] == 300.0
    for row, codec in zip(compressed, codecs, strict=True):
        staged = codec["staged_ratio"]
        assert row["worker_moved_mb_per_chunk"] == pytest.approx(CHUNK * (staged + scale_sim.STORED_RATIO) / 1e6, abs=0.01)
        assert row["worker_moved_mb_per_chunk"] < none["worker_moved_mb_per_chunk"]
        # An uplink-bound host ships 1/staged more of the database per second (its 4 cores compress faster than that).
        assert row["stream_mb_s"] == pytest.approx(300.0 / staged, abs=0.1)
        assert row["host_upload_seconds_per_tib"] == pytest.approx(none["host_upload_seconds_per_tib"] * staged, rel=0.01)
        assert row["host_cpu_seconds_per_tib"] == pytest.approx(codec["compress_cpu"] * 2**40 / CHUNK, rel=0.01)
        # The network-bound worker is billed for fewer seconds; staging holds fewer bytes.
        assert row["worker_cost_per_tib"] < none["worker_cost_per_tib"] and row["staging_cost_per_tib"] < none["staging_cost_per_tib"]
        assert row["cost_per_tib"] < none["cost_per_tib"] and row["worker_cpu_per_chunk_arm"] > none["worker_cpu_per_chunk_arm"]
    assert set(rows[0]) >= {"codec", "uplink_mb_s", "staged_ratio", "host_cpu_vs_zstd3", "host_upload_seconds_per_tib", "worker_moved_mb_per_chunk",
                            "cost_per_tib", "lambda_network_mb_s", "seconds_after_stream_end"}


def test_a_host_whose_cores_cannot_keep_up_is_bound_by_its_compression_not_its_uplink() -> None:
    codec = {"codec": "lz4 -1", "staged_ratio": 0.5, "compress_cpu": 0.5, "chunk_bytes": 100_000_000}  # 200 MB/s a core
    assert precompression.host_rate(codec, 100.0) == 200.0  # the uplink allows 200 MB/s of the database
    assert precompression.host_rate(codec, 1000.0) == precompression.HOST_CORES * 200.0
    assert precompression.host_rate(None, 300.0) == 300.0
