"""`braid:storageClass`: the stack-wide default for moving old backups' chunks reaches PlanPrune, and only it.

Synthesized offline with cdk-nag on, as tests/infra/test_stack.py does; the
least-privilege table there holds the grants moves need (Sweep's copy onto
data/*, TallyPrune's storage records, PlanPrune's price table), with and
without the context, since a name's stored policy may ask for moves either way.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "infra"))

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402
from test_stack import LEAST_PRIVILEGE, s3_grants  # noqa: E402

from braid import contract  # noqa: E402
from braid_infra.nag import add_nag_checks  # noqa: E402
from braid_infra.stack import BraidStack  # noqa: E402
from support.moto_stack import braid_functions, cdk_context  # noqa: E402


def synth(tmp_path: Path, context: dict[str, Any] | None = None, **props: Any) -> dict[str, Any]:
    app = cdk.App(context={**cdk_context(), **(context or {})}, outdir=str(tmp_path))
    stack = BraidStack(app, "Braid", **props)
    add_nag_checks(app)
    app.synth()
    return Template.from_stack(stack).to_json()


def environments(template: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each function's environment, by its description's first words (e.g. "Braid Prune planner")."""
    return {f["Properties"]["Description"]: f["Properties"]["Environment"]["Variables"] for f in braid_functions(template).values()}


@pytest.fixture(scope="module")
def moving(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return synth(tmp_path_factory.mktemp("cdk.out"), {contract.CONTEXT_STORAGE_CLASS: "GLACIER_IR:30"})


def test_the_context_reaches_the_prune_planner_and_no_other_function(moving: dict[str, Any]) -> None:
    found = {description: env.get(contract.ENV_STORAGE_CLASS) for description, env in environments(moving).items()}
    planners = [d for d in found if d.startswith("Braid Prune planner")]
    assert len(planners) == 1 and found[planners[0]] == "GLACIER_IR:30"
    assert {d: v for d, v in found.items() if v is not None} == {planners[0]: "GLACIER_IR:30"}


def test_the_grants_stay_the_least_privilege_table_with_the_context(moving: dict[str, Any]) -> None:
    template = Template.from_json(moving)
    for role in ("FunctionsPruneRole", "FunctionsSweepRole", "FunctionsTallyRole", "FunctionsWorkerRole", "AccessAgentPolicy", "AccessRestoreRole"):
        assert s3_grants(template, role) == LEAST_PRIVILEGE[role], role
    # Only the Sweep (moves) and the writers of chunks may PUT under data/.
    writers = {role for role in LEAST_PRIVILEGE if ("s3:PutObject", "data/*") in s3_grants(template, role)}
    assert writers == {"FunctionsWorkerRole", "FunctionsSweepRole"}


@pytest.mark.parametrize("value", ['{"class": "STANDARD_IA", "after_days": 45}', "standard_ia:45"])
def test_the_context_takes_class_days_or_the_object(tmp_path: Path, value: str) -> None:
    (planner,) = [e for d, e in environments(synth(tmp_path, {contract.CONTEXT_STORAGE_CLASS: value})).items() if d.startswith("Braid Prune planner")]
    assert planner[contract.ENV_STORAGE_CLASS] == "STANDARD_IA:45"


def test_without_the_context_no_function_has_a_default(tmp_path: Path) -> None:
    assert not any(contract.ENV_STORAGE_CLASS in env for env in environments(synth(tmp_path)).values())


@pytest.mark.parametrize(
    ("value", "message"),
    [("GLACIER:30", "one of STANDARD_IA, GLACIER_IR"), ("STANDARD_IA", "CLASS:DAYS"), ('{"class": "GLACIER_IR"}', "after_days"), ("DEEP_ARCHIVE:9", "restore request")],
)
def test_a_bad_setting_fails_the_synth_naming_the_context_key(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=rf"braid:storageClass: not a storage class policy \(.*{message}"):
        synth(tmp_path, {contract.CONTEXT_STORAGE_CLASS: value})
