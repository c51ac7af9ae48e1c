"""The Finalize function's warm-up: WarmFinalize invokes it asynchronously with {"warm": true} when a round
after stream end starts, so its container is started before the step runs (infra/braid_infra/pipeline.py).
It must answer at once and touch nothing: no store, no key, no event."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from inprocess_lambda import PROCESS_ENVIRONMENT, LambdaContext  # noqa: E402

from braid import contract  # noqa: E402
from braid.format.staging.protocol import PROTOCOL


def finalize_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in {**PROCESS_ENVIRONMENT, contract.ENV_BUCKET: "braid-warm", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("braid_finalize_warm", ROOT / "functions" / "finalize" / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_warm_up_answers_at_once_and_touches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    app = finalize_module(monkeypatch)

    def untouchable(*_: Any, **__: Any) -> Any:
        raise AssertionError("a warm-up must not reach the repository, the key or the event bus")

    for name in ("repository_store", "key_service", "event_publisher", "finalize_step"):
        monkeypatch.setattr(app, name, untouchable)
    context = LambdaContext("Braid-Finalize", contract.FINALIZE_MEMORY_MB, "arn:aws:lambda:us-east-1:123456789012:function:Braid-Finalize")
    assert app.handler({"warm": True, "backup": "db@20260101T000000.000Z-0123abcd"}, context) == {"warm": True}
    # Anything else is a real Finalize call (here it reaches the store, which this test forbids).
    with pytest.raises(AssertionError, match="must not reach"):
        app.handler({"warm": "yes", "backup": "db@20260101T000000.000Z-0123abcd", "prefix": "", "protocol": PROTOCOL}, context)
