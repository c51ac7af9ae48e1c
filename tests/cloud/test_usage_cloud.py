"""The cost report on the emulated cloud: a real backup's manifest usage against what went over the wire.

The agent CLI backs up through the stack the CDK synthesizes (scripts/emulated-aws);
the emulator's request log records every request it answered. The manifest's
usage must match it: exactly for what is counted before the manifest is sealed
(the agent's uploads, the chunk and record PUTs), never more than the log for
anything, and the Lambda and Step Functions figures must follow from the run's
own numbers (items, rounds, Plan calls), not from constants.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_emulated_e2e import CHUNK, Emulator, MiB, braid, stream_bytes

from braid import contract
from braid.agent.limits import DEFAULT_CONCURRENCY, default_part_chunks, default_ramp_parts, default_segment_chunks
from braid.agent.segments import PartLayout
from braid.format.prices import DEFAULT
from braid.format.usage import s3_request_class

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]

# S3 operations as the emulator's log names them, where it differs from the SDK's.
LOG_NAMES = {"ListObjectsV2": "ListObjects"}
# What Finalize writes after it sealed the manifest: the catalog summary and log marker, and the manifest.
WRITTEN_AFTER_SEALING = 3


def of_backup(record: dict[str, Any], ref: str) -> bool:
    name, _, ident = ref.partition("@")
    key = record.get("key") or ""
    return f"{name}/{ident}" in key or ref in key


def backed_up(cloud: Emulator, name: str, size: int, seed: int) -> tuple[str, dict[str, Any]]:
    run = braid(cloud, f"agent-{name}", "backup", "--name", name, "--chunk-size", CHUNK, "--json", stdin=stream_bytes(size, seed))
    assert run.code == 0, run.stderr
    ref = run.summary["backup"]
    shown = braid(cloud, f"restore-{name}", "show", ref, "--json")
    assert shown.code == 0, shown.stderr
    detail: dict[str, Any] = json.loads(shown.stdout)
    return ref, detail


def execution_history(cloud: Emulator, ref: str) -> list[dict[str, Any]]:
    """The backup execution's whole history, as the emulated Step Functions recorded it."""
    sfn = cloud.client("stepfunctions")
    machine = cloud.config()["cloud"]["state_machine_arn"]
    (execution,) = [e for e in sfn.list_executions(stateMachineArn=machine)["executions"] if e["name"] == ref]
    events: list[dict[str, Any]] = []
    for page in sfn.get_paginator("get_execution_history").paginate(executionArn=execution["executionArn"]):
        events += page["events"]
    return events


def test_the_manifest_counts_what_the_backup_sent(cloud: Emulator) -> None:
    size = 17 * MiB + 99
    ref, detail = backed_up(cloud, "cost", size, 31)
    usage, chunks = detail["usage"], detail["chunks"]
    usage = {**usage, **detail["usage_detail"]}
    items, rounds = detail["stats"]["map_items"], detail["stats"]["rounds"]
    requests = usage["requests"]
    log = Counter(r["op"] for r in cloud.requests(service="s3") if of_backup(r, ref))

    # The agent's upload: a part per few chunks (braid.agent.limits), one multipart upload per segment, exactly as sent.
    part_chunks = default_part_chunks(5 * MiB, 1, DEFAULT_CONCURRENCY)
    layout = PartLayout(part_chunks, default_ramp_parts(part_chunks, default_segment_chunks(5 * MiB)))
    assert chunks == math.ceil(size / (5 * MiB)) and part_chunks > 1
    assert requests["s3:UploadPart"] == log["UploadPart"] == layout.parts(chunks)
    assert requests["s3:CreateMultipartUpload"] == log["CreateMultipartUpload"] == requests["s3:CompleteMultipartUpload"] >= 1
    # Every PUT of the backup's objects, the agent's and the pipeline's, but the three written after sealing; the wake
    # records SleepUntilWoken wrote (braid.format.staging.wake) are made inside the emulator, as the ItemReader's GETs.
    history = execution_history(cloud, ref)
    entered = Counter(e["stateEnteredEventDetails"]["name"] for e in history if e["type"].endswith("StateEntered"))
    assert requests["s3:PutObject"] == log["PutObject"] - WRITTEN_AFTER_SEALING + entered["SleepUntilWoken"]
    assert requests["s3:PutObject"] >= chunks + items + rounds + 1  # chunks, result records, rounds, key.json
    # Nothing is counted that the server did not see (the log holds the listings and reads of other keys too).
    everything = Counter(r["op"] for r in cloud.requests(service="s3"))
    for name, count in requests.items():
        service, _, op = name.partition(":")
        if service == "s3" and op != "GetObject":  # the map's ItemReader reads the round inside the emulator
            assert count <= everything[LOG_NAMES.get(op, op)], name
    # KMS: one data key; one unwrap by Finalize and at most one per worker invocation (a container's cache).
    assert requests["kms:GenerateDataKey"] == 1
    assert 2 <= requests["kms:Decrypt"] <= 1 + items

    # Lambda: an invocation per step and per item, billed at the function's memory.
    functions = usage["lambda"]
    plans = functions["plan"]["invocations"]
    assert (functions["prepare"]["invocations"], functions["worker"]["invocations"], functions["finalize"]["invocations"]) == (1, items, 1)
    assert plans >= rounds + 1  # every round, then "done"
    worker = functions["worker"]
    assert worker["seconds"] > 0
    assert worker["gb_seconds"] == pytest.approx(worker["seconds"] * contract.WORKER_MEMORY_MB / 1024, rel=1e-4)
    # Step Functions: Identify, Prepare; per Plan call PlanSegments, SegmentsReady? and a Wait, a sleep or a Map but the last; Finalize,
    # Succeeded; every item an Express child.
    assert usage["sfn_transitions"] == 2 + 3 * plans - 1 + 2
    assert usage["sfn_express_requests"] == items
    express = items
    assert express * 0.1 * 64 / 1024 <= usage["sfn_express_gb_seconds"] <= (worker["seconds"] + 0.1 * items) * 64 / 1024 * (express > 0) + 1e-6

    # The billed quantities add the request map up by S3 price class.
    assert usage["s3_put_requests"] == sum(n for name, n in requests.items() if name.startswith("s3:") and s3_request_class(name[3:]) == "put")
    assert usage["kms_requests"] == requests["kms:GenerateDataKey"] + requests["kms:Decrypt"]
    assert usage["lambda_invocations"] == sum(f["invocations"] for f in functions.values()) == 2 + plans + items
    assert (usage["staged_bytes"], usage["stored_bytes"], usage["cpu_seconds"]) == (size, detail["stored_bytes"], 0)


def test_show_prices_the_usage_and_list_json_carries_it(cloud: Emulator) -> None:
    ref, detail = backed_up(cloud, "priced", 6 * MiB, 32)
    usage, cost = {**detail["usage"], **detail["usage_detail"]}, {**detail["cost"], "lines": detail["cost_lines"]}
    assert cost["currency"] == "USD" and cost["prices"] == {"name": DEFAULT.name, "date": DEFAULT.date}
    lines = {line["item"]: line for line in cost["lines"]}
    for line in cost["lines"]:
        assert line["cost"] == pytest.approx(line["quantity"] * line["unit_price"], rel=1e-5)
    assert cost["total"] == pytest.approx(sum(line["cost"] for line in cost["lines"]), rel=1e-5)
    puts = sum(n for name, n in usage["requests"].items() if name in {"s3:PutObject", "s3:UploadPart", "s3:CreateMultipartUpload", "s3:CompleteMultipartUpload"})
    lists = sum(n for name, n in usage["requests"].items() if name.startswith("s3:List"))
    assert lines["s3 PUT/COPY/POST/LIST requests"]["quantity"] == puts + lists
    assert lines["step functions transitions"]["quantity"] == usage["sfn_transitions"]
    assert lines["lambda invocations"]["quantity"] == sum(f["invocations"] for f in usage["lambda"].values())

    listed = braid(cloud, "restore-priced", "list", "--name", "priced", "--json")
    assert listed.code == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["backup"], row["usage"], row["cost"]) == (ref, detail["usage"], detail["cost"])  # list's fields are show's

    text = braid(cloud, "restore-priced", "show", ref)
    assert text.code == 0, text.stderr
    assert f"priced with '{DEFAULT.name}'" in text.stdout
    assert any(line.split()[:3] == ["step", "functions", "transitions"] and line.split()[3] == str(usage["sfn_transitions"]) for line in text.stdout.splitlines())


def test_a_price_table_stored_in_the_repository_prices_show(cloud: Emulator, tmp_path: Path) -> None:
    """Hosts only read prices.json (their roles may not write it): the operator writes it, here by hand."""
    ref, _ = backed_up(cloud, "regional", 6 * MiB, 33)
    table = {"version": 1, "name": "eu-central-1", "date": "2026-11-01", "currency": "EUR", "prices": {"lambda_request": 0.001}}
    cloud.client("s3").put_object(Bucket=cloud.bucket, Key="prices.json", Body=json.dumps(table).encode())
    try:
        shown = braid(cloud, "restore-regional", "show", ref, "--json")
        assert shown.code == 0, shown.stderr
        doc = json.loads(shown.stdout)
        cost = {**doc["cost"], "lines": doc["cost_lines"]}
        assert (cost["currency"], cost["prices"]) == ("EUR", {"name": "eu-central-1", "date": "2026-11-01"})
        invocations = next(line for line in cost["lines"] if line["item"] == "lambda invocations")
        assert (invocations["unit_price"], invocations["cost"]) == (0.001, pytest.approx(invocations["quantity"] * 0.001, rel=1e-5))
        puts = next(line for line in cost["lines"] if line["item"] == "s3 PUT/COPY/POST/LIST requests")
        assert puts["unit_price"] == DEFAULT.prices["s3_put_request"]  # what the table leaves out keeps the default
    finally:
        cloud.client("s3").delete_object(Bucket=cloud.bucket, Key="prices.json")
