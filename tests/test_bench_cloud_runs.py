"""The `cloud` benchmark's variants, parallel reference and 1 TiB projection (scripts/bench_lib/cloud_runs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from bench_lib.cloud_runs import TIB, Variant, input_files, parallel_argv, projection, remove_copies, transports_arg, variants  # noqa: E402


def test_variants_keep_the_plain_size_key_for_the_default_and_name_the_others() -> None:
    found = variants(["http", "https"], 4)
    assert found == [Variant("http", 1), Variant("https", 1), Variant("http", 4), Variant("https", 4)]
    assert [v.key("2 GiB") for v in found] == ["2 GiB", "2 GiB https", "2 GiB pipes4", "2 GiB https pipes4"]
    assert [v.prefix for v in found] == ["", "https-", "pipes4-", "https-pipes4-"]
    assert variants(["http"], 1) == [Variant("http", 1)]
    assert transports_arg("https,http,https") == ["https", "http"]
    with pytest.raises(ValueError, match="http, https or both"):
        transports_arg("ftp")


def test_the_parallel_reference_runs_every_command_at_once_and_fails_if_one_does(tmp_path: Path) -> None:
    marks = [tmp_path / f"m{i}" for i in range(3)]
    # Each waits for the others' marks: only commands started together all finish.
    waits = [["bash", "-c", f"touch {m}; until [ -e {marks[0]} ] && [ -e {marks[1]} ] && [ -e {marks[2]} ]; do sleep 0.01; done"] for m in marks]
    assert subprocess.run(parallel_argv(waits), timeout=60).returncode == 0
    assert subprocess.run(parallel_argv([["true"], ["bash", "-c", "exit 3"], ["true"]]), timeout=60).returncode == 3


def test_input_files_are_distinct_copies_removed_after(tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(b"abc" * 1000)
    files = input_files(data, tmp_path, 3)
    assert files[0] == data and len({f.stat().st_ino for f in files}) == 3 and all(f.read_bytes() == data.read_bytes() for f in files)
    remove_copies(files)
    assert [f.exists() for f in files] == [True, False, False]


def test_projection_uses_the_slope_past_the_fixed_cost_and_the_slower_of_link_and_rate() -> None:
    # 1 GiB staged in 11 s, of which 1 s is the fixed cost: 107 MB/s, slower than 1 Gbit/s (125 MB/s).
    doc = projection(2**30, 11.0, 5.0, 1.0, 0.5)
    assert doc["measured_mb_s"] == round(2**30 / 10 / 1e6, 1)
    assert doc["hours_at_1_gbit"] == doc["hours_at_10_gbit"] == round((1 + TIB / (2**30 / 10)) / 3600, 2)
    assert doc["host_cpu_seconds"] == 4.5 * 1024
    fast = projection(2**30, 1.5, 5.0, 1.0, 0.5)  # 2 GB/s measured: the link limits both
    assert fast["hours_at_1_gbit"] == round((1 + TIB / 125e6) / 3600, 2) and fast["hours_at_10_gbit"] == round((1 + TIB / 1.25e9) / 3600, 2)
