"""scripts/bench cloud-model runs each distinct simulation once (scale_sim.memoized) and many at once (sim_pool).

Neither may change a figure: a memoized or pooled simulation is the one a plain call gives."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from bench_lib import scale_sim, sim_pool  # noqa: E402
from bench_lib.benchmarks import cloud_model  # noqa: E402
from braid.pipeline.policies import ALL_ON  # noqa: E402

TIB = 0.05  # a few rounds: the simulation's whole path, in seconds


def _same(a: scale_sim.Simulation, b: scale_sim.Simulation) -> bool:
    """The same figures: counts exactly, seconds to a microsecond (record timestamps vary in length by a byte or two from
    run to run, which moves the coordinators' priced CPU by ~1e-7 s)."""
    def seconds(sim: scale_sim.Simulation) -> tuple[float, float]:
        return (sim.finished_at - sim.stream_seconds, sim.worker_seconds)

    def counts(sim: scale_sim.Simulation) -> tuple[object, ...]:
        return (dict(sim.requests()), sim.transitions, sim.history_events, sim.items)

    return counts(a) == counts(b) and seconds(a) == pytest.approx(seconds(b), abs=1e-6)


def _options() -> dict[str, object]:
    return {"calibration": scale_sim.calibrate_worker(), "coordinators": scale_sim.COORDINATOR_CPU}


def test_a_memoized_simulation_runs_once_per_configuration_and_network_rate() -> None:
    options = _options()
    with scale_sim.memoized() as memo:
        first = scale_sim.simulate(TIB, 300, 100, **options)
        again = scale_sim.simulate(TIB, 300.0, 100, **options, staged_ratio=1.0, policies=ALL_ON)  # the defaults, spelt out
        with scale_sim.network(150.0):
            faster = scale_sim.simulate(TIB, 300, 100, **options)
        assert again is first and faster is not first and len(memo) == 2
        assert faster.worker_seconds < first.worker_seconds  # the network-bound worker at twice the rate
    assert scale_sim.simulate(TIB, 300, 100, **options) is not first  # outside memoized(): a fresh run
    assert _same(first, scale_sim.simulate(TIB, 300, 100, **options))


def test_pooled_simulations_are_the_ones_run_in_turn() -> None:
    options = _options()
    requests = [sim_pool.Request(TIB, rate, 100, 76.0, options) for rate in (300, 1000)]
    with scale_sim.memoized() as memo:
        assert sim_pool.prefetch(requests + requests, workers=2) == 2  # distinct ones only
        pooled = dict(memo)
        assert sim_pool.prefetch(requests, workers=2) == 0
    for request in requests:
        with scale_sim.network(request.network):
            alone = scale_sim.simulate(request.tib, request.stream_mb_s, request.workers, **request.options)
        assert _same(pooled[request.key()], alone)


def test_prefetch_needs_an_open_memo() -> None:
    with pytest.raises(RuntimeError, match="memoized"):
        sim_pool.prefetch([sim_pool.Request(TIB, 300, 100, 76.0, _options())])


def test_the_plan_names_every_simulation_the_tables_run() -> None:
    """The tables after prefetch find every simulation in the memo: none asks for one the plan left out."""
    calibrated = scale_sim._COORDINATORS
    scale_sim._COORDINATORS = calibrated or scale_sim.COORDINATOR_CPU  # the plan's options, without calibrating here
    try:
        _plan_covers_the_tables()
    finally:
        scale_sim._COORDINATORS = calibrated


def _plan_covers_the_tables() -> None:
    codecs = [{"codec": "lz4 -1", "staged_ratio": 0.6, "chunk_bytes": 64 * 2**20, "decompress_cpu": 0.05, "compress_cpu": 0.1, "zstd3_cpu": 0.5}]
    args = (0.5, 0.54, 1769, 4, 64 * 2**20)
    planned = {request.key() for request in cloud_model.simulation_plan(*args, 0.9, codecs)}
    asked: list[tuple[object, ...]] = []
    real = scale_sim._simulate
    stand_in = real(TIB, 300, 100, **_options())  # every table's simulations, to price: only the keys matter here

    def record(tib: float, stream_mb_s: float, workers: int, **options: object) -> scale_sim.Simulation:
        asked.append(scale_sim.simulation_key(tib, stream_mb_s, workers, **options))
        return stand_in

    scale_sim._simulate = record  # type: ignore[assignment]
    try:
        with scale_sim.memoized():
            cloud_model.rows_for(*args, cpu_speed=0.9)
            cloud_model.sensitivity_rows(*args, cpu_speed=0.9)
            cloud_model.optimisation_table(*args, cpu_speed=0.9)
            cloud_model.concurrent_table(*args, 0.9)
            network = scale_sim.lambda_network_mb_s(1769)
            options = cloud_model.sim_options(0.5, 0.54, 4, 64 * 2**20, 0.9)
            from bench_lib import precompression

            precompression.rows(codecs, cpu_arm=0.5, stored_ratio=0.54, arm=0.9, memory=1769, network=network, options=options,
                                simulated_row=cloud_model.simulated_row, uplinks=cloud_model.PRECOMPRESSION_UPLINKS_MB_S)
    finally:
        scale_sim._simulate = real  # type: ignore[assignment]
    assert len(asked) >= 40 and set(asked) <= planned, [key for key in asked if key not in planned][:2]
