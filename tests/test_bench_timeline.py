"""The upload timeline's tracer and summary (scripts/bench_lib/timeline.py, s3compat/braid_bench_timeline.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from bench_lib import s3proxy, timeline  # noqa: E402


def _part(t0: float, head: float, port: int, number: int, size: int = 64 * 2**20) -> dict[str, Any]:
    return {"k": "http", "method": "PUT", "path": f"/b/k?partNumber={number}&uploadId=u", "t0": t0, "sent": head - 0.1, "head": head,
            "port": port, "bytes": size, "thread": f"t{port}"}


def test_summary_counts_parts_in_flight_and_the_gaps_on_each_connection() -> None:
    records = [
        {"k": "http", "method": "POST", "path": "/b/k?uploads", "t0": 100.5, "sent": 100.5, "head": 100.6, "port": 1, "bytes": 0, "thread": "t1"},
        _part(101.0, 103.0, 1, 1), _part(101.0, 103.0, 2, 2),
        _part(103.5, 105.0, 1, 3),  # 0.5 s after part 1's answer on the same connection
        {"k": "http", "method": "POST", "path": "/b/k?uploadId=u", "t0": 105.0, "sent": 105.0, "head": 105.1, "port": 2, "bytes": 10, "thread": "t2"},
        {"k": "read", "t0": 100.8, "t1": 101.0, "bytes": 1},
    ]
    found = timeline.summary(timeline.Side("agent", 100.0, 106.0, records))
    assert (found["first_part_s"], found["last_part_answer_s"], found["after_last_part_s"]) == (1.0, 5.0, 1.0)
    assert found["parts"] == 3 and found["part_mib"] == [64] and found["connections"] == 2
    assert found["mean_parts_in_flight"] == round((2 + 2 + 1.5) / 4, 2)
    assert found["in_flight_every_quarter_s"][:8] == [2] * 8 and found["in_flight_every_quarter_s"][8:10] == [0, 0]
    assert found["connection_gap_s_sum"] == round(0.4 + 0.5 + 2.0, 3)  # Create -> part 1, part 1 -> part 3, part 2 -> Complete
    assert found["requests_before_first_part"] == [["CreateMultipartUpload", 0.5, 0.1]]
    assert found["requests_after_last_part"] == [["CompleteMultipartUpload", 5.0, 0.1]]
    assert found["reads"] == 1 and found["first_read_s"] == 0.8


def test_the_tracer_records_each_request_of_a_child_process(tmp_path: Path) -> None:
    """BRAID_BENCH_TIMELINE loads the tracer through s3compat's sitecustomize; a request's line names its bytes and connection."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_PUT(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    trace = tmp_path / "trace.jsonl"
    script = (  # botocore's way (http.client) and the agent's light client's (braid.adapters.aws.light_wire)
        "import http.client, sys\n"
        "c = http.client.HTTPConnection('127.0.0.1', int(sys.argv[1]))\n"
        "c.request('PUT', '/b/k?partNumber=1&uploadId=u', body=b'x' * 1000)\n"
        "c.getresponse().read()\n"
        "from braid.adapters.aws.light_wire import Connection\n"
        "w = Connection('127.0.0.1', int(sys.argv[1]), 10.0)\n"
        "w.connect()\n"
        "w.send_head('PUT', '/b/k?partNumber=2&uploadId=u', {'Host': 'h', 'Content-Length': '500'})\n"
        "w.send(b'y' * 500)\n"
        "w.getresponse('PUT').read()\n"
    )
    env = {**os.environ, "BRAID_BENCH_TIMELINE": str(trace), "PYTHONPATH": str(s3proxy.COMPAT_DIR)}
    try:
        subprocess.run([sys.executable, "-c", script, str(httpd.server_address[1])], env=env, check=True, timeout=60)
    finally:
        httpd.shutdown()
        httpd.server_close()
    lines = [json.loads(text) for text in trace.read_text().splitlines()]
    assert [(line["k"], line["method"], line["bytes"]) for line in lines] == [("http", "PUT", 1000), ("http", "PUT", 500)]
    for line in lines:
        assert isinstance(line["port"], int) and line["t0"] <= line["sent"] <= line["head"]
