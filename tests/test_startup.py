"""What a run loads before it does anything: start-up is part of every backup.

A 256 MiB backup or restore takes well under a second, so the interpreter's
start and Braid's imports are a large share of it (the speed target of
issue 7: >= 0.9x of `zstd | openssl` at 256 MiB). These tests pin the
structure that keeps start-up small: the command line declares only the
command typed and imports what that command needs, when it runs. They
assert on modules, never on timings (scripts/bench measures time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import run_braid

# Runs braid's main() as the installed script does, then records every module loaded (threads' imports included).
DRIVER = """
import json, sys
from braid.cli.main import main
try:
    code = main(sys.argv[2:])
except SystemExit as exc:
    code = exc.code
with open(sys.argv[1], "w") as handle:
    json.dump(sorted(sys.modules), handle)
sys.exit(code)
"""

# Never on the local path: the cloud and its SDKs, the terminal library, certificate parsing.
CLOUD_AND_TERMINAL = ("boto3", "botocore", "s3transfer", "aws_lambda_powertools", "rich", "cryptography.x509", "braid.adapters.aws", "braid.agent.cloud_engine")
# What only some runs need: a command to run (backup/restore -- CMD), `init`, a config file, retention, --debug.
ON_DEMAND = (
    "subprocess", "braid.engine.producer", "braid.engine.child", "braid.ops.consumer", "braid.ops.init", "uuid", "socket",
    "tomllib", "braid.format.policy", "braid.ops.retention", "braid.format.catalog", "argparse_manpage", "shtab",
)
# Python's own OpenSSL binding: the format's digests come from cryptography, which every run loads (braid.format.digests).
SECOND_OPENSSL = ("_hashlib", "hashlib", "hmac", "secrets")


def loaded(tmp_path: Path, *words: str, stdin: bytes = b"") -> set[str]:
    """The modules a `braid WORDS...` run loaded, with no config file (none at the default places)."""
    record = tmp_path / f"modules-{len(list(tmp_path.iterdir()))}.json"
    env = {k: v for k, v in os.environ.items() if k != "BRAID_CONFIG"}  # the default places: XDG_CONFIG_HOME is this test's
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(record), *words], input=stdin, capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    return set(json.loads(record.read_text()))


def found(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_version_loads_no_format_engine_or_crypto(tmp_path: Path) -> None:
    version = loaded(tmp_path, "--version")
    assert found(version, ("braid.format", "braid.ops", "braid.adapters", "cryptography", "zstandard", "awscrt", "traceback", "textwrap")) == []
    assert found(version, CLOUD_AND_TERMINAL + ON_DEMAND) == []


def test_a_local_backup_loads_what_it_uses(tmp_path: Path, repo: Path) -> None:
    modules = loaded(tmp_path, "backup", "--repo", str(repo), "--name", "db", "--quiet", stdin=os.urandom(100_000))
    assert {"braid.engine.local", "zstandard", "awscrt.checksums", "cryptography.hazmat.primitives.ciphers.aead"} <= modules  # the run happened
    assert found(modules, CLOUD_AND_TERMINAL + ON_DEMAND + SECOND_OPENSSL) == []


def test_a_restore_loads_no_checksum_library(tmp_path: Path, repo: Path) -> None:
    """Restore authenticates with GCM and the keyed plaintext checksum; the store's CRC (awscrt, ~50 ms to load) is not needed."""
    made = run_braid("backup", "--repo", str(repo), "--name", "db", stdin=os.urandom(100_000))
    assert made.code == 0, made.stderr
    modules = loaded(tmp_path, "restore", "--repo", str(repo), "db@latest", "--quiet")
    assert "braid.ops.restore" in modules
    assert found(modules, CLOUD_AND_TERMINAL + ON_DEMAND + SECOND_OPENSSL + ("awscrt", "braid.engine.local", "braid.engine.driver", "braid.engine.stream")) == []


def test_what_only_some_runs_need_is_loaded_when_they_run(tmp_path: Path) -> None:
    """The on-demand list is not vacuous: the runs that need these modules do load them."""
    target, key = tmp_path / "target", tmp_path / "target.key"
    assert "braid.ops.init" in loaded(tmp_path, "init", "--repo", str(target), "--key-file", str(key))
    produced = loaded(tmp_path, "backup", "--repo", str(target), "--key-file", str(key), "--name", "db", "--quiet", "--", "echo", "data")
    assert {"braid.engine.producer", "subprocess"} <= produced
