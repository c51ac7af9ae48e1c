"""The pipeline's optimisations as named policies (braid.pipeline.policies): one place, decided in the
execution input, strictly decoded, each with an off switch that changes what the real planner does while the
backup still completes (the scale simulation runs the real planner and Finalize)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_lib import scale_sim  # noqa: E402
from braid import contract  # noqa: E402
from braid.agent.cloud_engine import CloudOptions  # noqa: E402
from braid.cli.parser import build_parser  # noqa: E402
from braid.errors import UsageError  # noqa: E402
from braid.format.ids import BackupRef  # noqa: E402
from braid.format.staging.protocol import PROTOCOL, ProtocolMismatchError  # noqa: E402
from braid.pipeline.execution_input import ExecutionInput  # noqa: E402
from braid.pipeline.policies import ALL_ON, Policies  # noqa: E402

REF = str(BackupRef.new("db"))


def test_the_execution_input_carries_every_policy_and_reads_it_back() -> None:
    chosen = Policies.without(["cut_items"])
    doc = ExecutionInput(backup=REF, policies=chosen).to_json()
    assert doc["policies"] == {name: name != "cut_items" for name in Policies.names()}
    assert ExecutionInput.from_event(doc).policies == chosen
    assert ExecutionInput.from_event({k: v for k, v in doc.items() if k != "policies"}).policies == ALL_ON


def test_an_agent_that_still_sends_the_removed_taper_is_refused_by_protocol_naming_both_versions() -> None:
    # Protocol 4 agents sent "taper" in every execution input; the stack refuses them by version, not by a policy name.
    older = {**ExecutionInput(backup=REF).to_json(), "protocol": 4, "policies": {"taper": True, **ALL_ON.to_json()}}
    with pytest.raises(ProtocolMismatchError, match=f"speaks staging protocol 4; this braid speaks protocol {PROTOCOL}") as refused:
        ExecutionInput.from_event(older)
    assert PROTOCOL == 5 and refused.value.exit_code == 2  # docs/format.md: exit 2, naming both versions


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        ({**ALL_ON.to_json(), "cut_items": 1}, "cut_items must be true or false, not 1"),
        ({**ALL_ON.to_json(), "cut_items": "false"}, "cut_items must be true or false"),
        ({k: v for k, v in ALL_ON.to_json().items() if k != "cut_items"}, "missing cut_items"),
        ({**ALL_ON.to_json(), "turbo": True}, "unknown turbo"),
        (["cut_items"], "not a JSON object"),
    ],
)
def test_policies_are_decoded_strictly(policies: object, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ExecutionInput.from_event({**ExecutionInput(backup=REF).to_json(), "policies": policies})


def test_no_policy_switches_one_off_for_the_backup_and_refuses_an_unknown_name() -> None:
    args = build_parser().parse_args(["backup", "--name", "db", "--no-policy", "cut_items", "--no-policy", "sleep_until_woken", "-"])
    assert CloudOptions.from_cli(args).policies == replace(ALL_ON, cut_items=False, sleep_until_woken=False)
    assert CloudOptions.from_cli(build_parser().parse_args(["backup", "--name", "db", "-"])).policies == ALL_ON
    with pytest.raises(UsageError, match="argument --no-policy: invalid choice: 'turbo'"):
        build_parser().parse_args(["backup", "--name", "db", "--no-policy", "turbo", "-"])
    with pytest.raises(UsageError, match="unknown policy turbo: the policies are cut_items, "):
        Policies.without(["turbo"])
    # The parser offers the contract's names, which are exactly the policies' fields (the CLI loads no pipeline).
    assert Policies.names() == contract.PIPELINE_POLICIES


def test_the_packs_policies_decide_the_layout_written_into_each_item() -> None:
    # As even as possible, larger first, CHUNKS_PER_PACK at most (the taper, smaller last packs, was removed).
    assert ALL_ON.packs(16) == (4, 4, 4, 4) and ALL_ON.packs(32) == (5, 5, 5, 5, 4, 4, 4) and ALL_ON.packs(3) == (3,)
    assert "taper" not in Policies.names()


@pytest.fixture(scope="module")
def calibration() -> scale_sim.WorkerRequests:
    return scale_sim.calibrate_worker()


def run(calibration: scale_sim.WorkerRequests, rate: float, policies: Policies = ALL_ON) -> scale_sim.Simulation:
    """A small backup through the real planner and Finalize (which refuses a ledger that does not cover the stream)."""
    sim = scale_sim.simulate(0.05, rate, 100, calibration=calibration, policies=policies)
    assert len(sim.by_function("finalize")) == 1  # ran once and raised nothing: every chunk stored, the manifest published
    return sim


def test_with_each_policy_off_the_planner_behaves_otherwise_and_the_backup_still_completes(calibration: scale_sim.WorkerRequests) -> None:
    on = run(calibration, 300)
    slow = run(calibration, 20)
    assert slow.turns["sleep"] > 0
    awake = run(calibration, 20, replace(ALL_ON, sleep_until_woken=False))
    watched = [sum(i.watched for i in sim.by_function("plan")) for sim in (slow, awake)]
    assert awake.turns["sleep"] == 0 and watched[1] > 2 * watched[0]  # the Plan function watches (billed) instead
    uncut = run(calibration, 300, replace(ALL_ON, cut_items=False))
    assert on.turns["cut"] > 0 and uncut.turns["cut"] == 0 and uncut.finished_at > on.finished_at


def test_the_optimisation_table_keeps_what_saves_a_cent_per_tib_or_two_seconds_at_some_stream_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench_lib import optimisations

    on = (0.60, 10.0)  # ($/TiB, worst seconds after stream end) with every policy on, at each stream rate
    off = {  # with one policy off, at 50 / 300 / 1,000 MB/s
        "cut_items": [(0.609, 11.9), (0.609, 11.9), (0.609, 11.9)],  # under both bars at every rate: removed
        "sleep_until_woken": [(0.61, 10.0), (0.609, 10.0), (0.60, 10.0)],  # a cent per TiB at 50 MB/s: kept
        "results_index": [(0.59, 10.0), (0.59, 10.5), (0.59, 12.0)],  # cheaper off, but 2 s later at 1,000 MB/s: kept
    }
    off.update({name: [on] * 3 for name in Policies.names() if name not in off})  # any other policy: worth nothing here

    def measured(policies: Policies, rate: float, options: object, price: object) -> tuple[float, float]:
        (name,) = [n for n in Policies.names() if not getattr(policies, n)] or [None]
        return on if name is None else off[name][optimisations.RATES.index(int(rate))]

    monkeypatch.setattr(optimisations, "measured", measured)
    rows = {row["optimisation"]: row for row in optimisations.rows({}, lambda sim: 0.0)}
    assert [name for name, row in rows.items() if row["kept"]] == ["sleep_until_woken", "results_index"]
    assert set(rows) == {*Policies.names(), "all on"}  # a row for every policy there is
    assert (rows["results_index"]["saves_seconds_after_stream_end"], rows["results_index"]["saves_usd_per_tib"]) == (2.0, -0.01)
    assert (rows["sleep_until_woken"]["saves_usd_per_tib"], rows["sleep_until_woken"]["saves_usd_per_tib_at_300"]) == (0.01, 0.009)
    assert (rows["cut_items"]["saves_seconds_after_stream_end"], rows["cut_items"]["kept"]) == (1.9, False)
    assert rows["all on"]["saves_usd_per_tib_at_50"] == 0.60 and rows["all on"]["kept"] is None
