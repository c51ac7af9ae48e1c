"""Shared fixtures: isolated config dirs, repositories, and the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BRAID = ROOT / ".venv" / "bin" / "braid"


@pytest.fixture(autouse=True)
def isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep key files out of the real ~/.config and env settings out of tests."""
    config = tmp_path / "xdg-config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    for name in [n for n in os.environ if n.startswith("BRAID_")]:  # every option has one (braid.cli.settings)
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BRAID_CONFIG", os.devnull)  # not this machine's ~/.config or /etc/braid config file
    return config


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and no endpoint override: moto, never a real account."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_KMS", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@dataclass
class Result:
    code: int
    stdout: bytes
    stderr: str

    @property
    def out(self) -> str:
        return self.stdout.decode()


def run_braid(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None, timeout: float = 120) -> Result:
    """Run the installed CLI as a user would: a separate process."""
    proc = subprocess.run(
        [str(BRAID), *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr.decode())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    result = run_braid("init", "--repo", str(path))
    assert result.code == 0, result.stderr
    return path


def pytest_configure(config: pytest.Config) -> None:
    if not BRAID.exists():
        sys.stderr.write(f"{BRAID} is missing: run scripts/setup first\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The CLI end to end on the emulated cloud (marked both `e2e` and `cloud`: an emulator per module, seconds per
    backup) is `long`: it runs after the main suite (scripts/test-long), which stays under its 10 minutes."""
    for item in items:
        if item.get_closest_marker("e2e") and item.get_closest_marker("cloud"):
            item.add_marker(pytest.mark.long)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The emulated cloud (scripts/emulated-aws) a test module shares, stopped after it.

    Modules with a cloud of another kind (tests/cloud/test_state_machine.py) define their own.
    """
    from test_emulated_e2e import Emulator  # tests/cloud, on the path while its modules run

    emulator = Emulator(tmp_path_factory.mktemp("emulated-cloud"))
    try:
        yield emulator
    finally:
        emulator.stop()
