"""The benchmark's s3proxy shim (scripts/bench_lib/s3compat/sitecustomize.py): it edits both clients' requests, and
costs the agent's measured start-up nothing the agent itself would not load (issue 27: `startup_cpu_seconds`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from bench_lib import s3proxy  # noqa: E402

_PROBE = """
import json, sys
at_start = sorted(sys.modules)
import braid.adapters.aws.light_http as light_http
import botocore.handlers as handlers
hooks = [h.__name__ for h in light_http.REQUEST_HOOKS]
builtin = [h[1].__name__ for h in handlers.BUILTIN_HANDLERS if h[0] == "before-sign.s3"]
headers = {"x-amz-checksum-algorithm": "CRC64NVME", "Content-Length": "1"}
body = b"<P><ChecksumCRC64NVME>x</ChecksumCRC64NVME></P>"
for hook in light_http.REQUEST_HOOKS:
    body = hook("CompleteMultipartUpload", headers, body)
json.dump({"at_start": at_start, "hooks": hooks, "builtin": builtin, "body": body.decode(), "length": headers["Content-Length"]}, sys.stdout)
"""


def _probe(env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", _PROBE], env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_shim_registers_in_both_clients_as_they_are_imported() -> None:
    found = _probe(s3proxy.compat_env({}))
    assert found["hooks"] == ["_light_compat"]
    assert "_s3proxy_compat" in found["builtin"]
    assert (found["body"], found["length"]) == ("<P></P>", "7")


def test_the_shim_loads_no_import_machinery_the_agent_would_not() -> None:
    """importlib.abc would bring importlib.resources, tempfile, bz2 and lzma (~8 ms of CPU) into every measured agent."""
    found = _probe(s3proxy.compat_env({}))
    heavy = ("importlib.abc", "importlib.util", "importlib.resources", "tempfile", "bz2", "lzma")
    assert [m for m in found["at_start"] if m in heavy] == []
    assert "sitecustomize" in found["at_start"]  # it ran


def test_without_the_switch_the_shim_does_nothing() -> None:
    found = _probe({"PYTHONPATH": str(s3proxy.COMPAT_DIR), "BRAID_BENCH_S3COMPAT": "0"})
    assert found["hooks"] == [] and "_s3proxy_compat" not in found["builtin"]
    assert found["body"] == "<P><ChecksumCRC64NVME>x</ChecksumCRC64NVME></P>"
