"""Layer: the `braid` package and its runtime dependencies, for arm64 Lambda.

Built by scripts/build-layer from PyPI manylinux wheels (no Docker), at synth
time: the script is incremental, so an unchanged layer costs a hash. Every
function gets this one layer, so agent, local engine and handlers run the
same code.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from aws_cdk import RemovalPolicy
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-layer"
RUNTIME = lambda_.Runtime.PYTHON_3_14
ARCHITECTURE = lambda_.Architecture.ARM_64


def python_version() -> str:
    """"python3.14" -> "3.14": the layer's wheels must match the runtime."""
    return RUNTIME.name.removeprefix("python")


def build_layer(root: Path | None = None) -> Path:
    """Run scripts/build-layer (a no-op when nothing changed); returns the asset directory.

    Content-addressed (build/layers/<input hash>/python/...), so a synth never
    hashes a directory that another process is rebuilding.
    """
    target = root or ROOT / "build" / "layers"
    try:
        done = subprocess.run(
            [sys.executable, str(BUILD_SCRIPT), "--out", str(target), "--content-addressed", "--python-version", python_version()],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        )
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"building the Lambda layer failed ({BUILD_SCRIPT}); see its output above") from exc
    return Path(done.stdout.strip().splitlines()[-1])


class BraidLayer(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, asset_dir: Path | None = None) -> None:
        super().__init__(scope, construct_id)
        directory = asset_dir or build_layer()
        self.layer = lambda_.LayerVersion(
            self,
            "Braid",
            code=lambda_.Code.from_asset(str(directory), exclude=[".braid-layer-stamp"]),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="braid package with zstandard, cryptography, awscrt, boto3 and aws-lambda-powertools",
            removal_policy=RemovalPolicy.RETAIN,
        )
