"""The cost report: counting requests (per attempt, per piece of work), usage records, pricing, the price table, and the CLI.

The emulated-cloud backup whose manifest usage is checked against the wire is
tests/cloud/test_usage_cloud.py.
"""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from braid.adapters.aws.clients import RetrySettings, aws_client, process_requests
from braid.adapters.local.store import LocalStore
from braid.errors import IntegrityError, UsageError
from braid.format.layout import PRICES
from braid.format.manifest import open_manifest
from braid.format.prices import DEFAULT, cost_totals, parse_prices, price
from braid.format.staging import ItemResult, StreamEnd
from braid.format.summary import BackupSummary, open_summary
from braid.format.usage import FunctionUse, Usage, billed_invocation, check_billed, express_gb_seconds, s3_request_class
from braid.ops.prices import load_prices, reset_prices, set_prices
from braid.pipeline.usage import carried_usage, execution_usage, plan_call_usage, workers_usage
from braid.ports.usage import in_context, metering, tallying
from conftest import run_braid
from test_manifest import KEY, make_manifest

USAGE = Usage(
    requests={"s3:PutObject": 7, "s3:UploadPart": 5, "s3:ListObjectsV2": 2, "s3:GetObject": 11, "s3:HeadObject": 1, "s3:DeleteObjects": 3, "kms:Decrypt": 2},
    functions={"worker": FunctionUse(4, 2.5, 4.319), "plan": FunctionUse(2, 0.25, 0.0625)},
    transitions=9,
    express_requests=4,
    express_gb_seconds=0.1875,
    staged_bytes=1000,
    stored_bytes=600,
)


# -- usage records ------------------------------------------------------------------------------


def test_usage_round_trips_and_adds_up() -> None:
    assert Usage.from_json(json.loads(json.dumps(USAGE.to_json()))) == USAGE
    doubled = USAGE + USAGE
    assert doubled.requests["s3:PutObject"] == 14 and doubled.functions["worker"] == FunctionUse(8, 5.0, 8.638)
    assert (doubled.transitions, doubled.express_requests, doubled.stored_bytes) == (18, 8, 1200)
    assert Usage.total([USAGE, Usage(requests={"kms:GenerateDataKey": 1})]).requests["kms:GenerateDataKey"] == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("requests"), "must be {requests, lambda"),
        (lambda d: d["requests"].update({"PutObject": 1}), "service:Operation"),
        (lambda d: d["requests"].update({"s3:PutObject": -1}), "usage.requests.s3:PutObject must be a non-negative integer"),
        (lambda d: d["requests"].update({"s3:PutObject": True}), "non-negative integer"),
        (lambda d: d["lambda"]["worker"].update({"gb_seconds": float("nan")}), "usage.lambda.worker.gb_seconds"),
        (lambda d: d["stepfunctions"].pop("transitions"), "usage.stepfunctions must be"),
        (lambda d: d["bytes"].update({"staged": "10"}), "usage.bytes.staged"),
    ],
)
def test_a_malformed_usage_is_refused_naming_the_field(change: Any, message: str) -> None:
    doc = USAGE.to_json()
    change(doc)
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("(", r"\(")):
        Usage.from_json(doc)


def test_s3_price_classes_follow_the_price_list() -> None:
    puts = ["PutObject", "UploadPart", "CreateMultipartUpload", "CompleteMultipartUpload", "CopyObject", "ListObjectsV2", "ListParts", "ListObjectVersions"]
    assert {s3_request_class(op) for op in puts} == {"put"}
    assert {s3_request_class(op) for op in ("GetObject", "HeadObject", "GetBucketVersioning")} == {"get"}
    assert {s3_request_class(op) for op in ("DeleteObject", "DeleteObjects", "AbortMultipartUpload")} == {"free"}
    assert (USAGE.s3_requests("put"), USAGE.s3_requests("get"), USAGE.s3_requests("free")) == (14, 12, 3)


def test_the_billed_quantities_sum_by_price_class() -> None:
    billed = USAGE.billed()
    assert billed == {
        "lambda_invocations": 6, "lambda_gb_seconds": 4.3815, "s3_put_requests": 14, "s3_get_requests": 12, "s3_free_requests": 3,
        "kms_requests": 2, "sfn_transitions": 9, "sfn_express_requests": 4, "sfn_express_gb_seconds": 0.1875,
        "staged_bytes": 1000, "stored_bytes": 600, "cpu_seconds": 0.0,
    }
    assert check_billed(json.loads(json.dumps(billed))) == billed
    with pytest.raises(ValueError, match="usage.kms_requests must be a non-negative integer"):
        check_billed({**billed, "kms_requests": -2})
    with pytest.raises(ValueError, match="usage.cpu_seconds must be a non-negative number"):
        check_billed({**billed, "cpu_seconds": "1"})
    with pytest.raises(ValueError, match="usage must be"):
        check_billed({**billed, "extra": 1})
    assert cost_totals(billed, DEFAULT) == price(USAGE, DEFAULT).to_json(lines=False)


def test_the_billed_figures_are_the_same_from_the_counted_use_and_from_its_record() -> None:
    """`show` bills the manifest's record and `list` the summary Finalize wrote from the counted use:
    each function's GB-seconds is rounded in the record, so the sum must round the same way in both."""
    counted = Usage(functions={
        "worker": FunctionUse(3, 1.0, 0.3125004), "plan": FunctionUse(2, 1.0, 0.2500004), "finalize": FunctionUse(1, 1.0, 0.1250004),
    })
    recorded = Usage.from_json(json.loads(json.dumps(counted.to_json())))
    assert counted.billed() == recorded.billed()
    assert counted.billed()["lambda_gb_seconds"] == 0.6875  # each rounded, then summed (not 0.687501)


def test_lambda_bills_the_millisecond_and_express_the_100_ms_at_64_mb() -> None:
    assert billed_invocation(0.0101, 1024) == FunctionUse(1, 0.011, 0.011)
    assert billed_invocation(1.0, 1769).gb_seconds == pytest.approx(1769 / 1024)
    assert express_gb_seconds(0.25) == pytest.approx(0.3 * 64 / 1024)
    assert express_gb_seconds(0.3) == pytest.approx(0.3 * 64 / 1024)  # no rounding up of an exact step
    assert express_gb_seconds(0.0) == pytest.approx(0.1 * 64 / 1024)  # the minimum


# -- counting -------------------------------------------------------------------------------------


class _SlowDown(BaseHTTPRequestHandler):
    """An S3 endpoint that answers every request 503 SlowDown: each attempt is a request S3 bills."""

    def do_HEAD(self) -> None:  # noqa: N802 - the http.server spelling
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_every_attempt_is_counted_retries_included(aws_env: None) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowDown)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = aws_client(
            "s3", retries=RetrySettings(mode="standard", attempts=3, base=0.0, cap=0.0), endpoint_url=f"http://127.0.0.1:{server.server_port}",
            sleep=lambda seconds: None,
        )
        before = process_requests().get("s3:HeadObject", 0)
        with tallying() as tally:
            with pytest.raises(Exception, match="503|SlowDown|Service Unavailable"):
                client.head_object(Bucket="bucket", Key="key")
        assert tally.counts() == {"s3:HeadObject": 3}
        assert process_requests()["s3:HeadObject"] == before + 3
    finally:
        server.shutdown()


def test_only_work_run_in_the_context_counts_for_it(aws_env: None) -> None:
    from moto import mock_aws

    with mock_aws():
        client = aws_client("s3")
        client.create_bucket(Bucket="counted")
        with tallying() as outer, ThreadPoolExecutor(2) as pool:
            put = in_context(lambda key: client.put_object(Bucket="counted", Key=key, Body=b"x"))
            list(pool.map(put, ["a", "b", "c"]))
            pool.submit(client.get_object, Bucket="counted", Key="a").result()  # not carried: not this work's
            with tallying() as inner:
                client.list_objects_v2(Bucket="counted")
        assert outer.counts() == {"s3:PutObject": 3}
        assert inner.counts() == {"s3:ListObjectsV2": 1}


def test_an_invocation_meter_adds_the_pending_write_and_its_duration() -> None:
    with metering("worker", 2048) as meter:
        usage = meter.usage(pending={"s3:PutObject": 1})
    assert usage.requests == {"s3:PutObject": 1}
    (use,) = usage.functions.values()
    assert use.invocations == 1 and use.gb_seconds == pytest.approx(use.seconds * 2)


# -- what the pipeline adds ---------------------------------------------------------------------


def test_each_plan_call_adds_its_states_and_the_map_it_starts() -> None:
    own = Usage(requests={"s3:GetObject": 2}, functions={"plan": FunctionUse(1, 0.1, 0.1)})
    waiting = plan_call_usage(None, own, "waiting", 0)
    ready = plan_call_usage(waiting, own, "ready", 7)
    done = plan_call_usage(ready, own, "done", 0)
    assert [u.transitions for u in (waiting, ready, done)] == [3, 6, 8]
    assert (done.express_requests, done.requests["s3:GetObject"], done.functions["plan"].invocations) == (7, 7, 3)  # +1 GET: the ItemReader


def test_the_execution_adds_every_part_and_the_workers_express_time() -> None:
    worker = Usage(requests={"s3:PutObject": 3}, functions={"worker": FunctionUse(1, 0.25, 0.43)})
    total = execution_usage([None, Usage(transitions=8)], [worker, worker], Usage(functions={"finalize": FunctionUse(1, 1.0, 1.7)}), staged_bytes=10, stored_bytes=4)
    assert total.transitions == 8 + 4 and total.requests == {"s3:PutObject": 6}
    assert total.express_gb_seconds == pytest.approx(workers_usage([worker, worker]).express_gb_seconds) == pytest.approx(2 * 0.3 * 64 / 1024)
    assert (total.staged_bytes, total.stored_bytes, total.functions["finalize"].invocations) == (10, 4, 1)


def test_a_malformed_usage_in_the_state_is_an_integrity_error() -> None:
    assert carried_usage({"status": "done"}, "$.plan") is None
    assert carried_usage({"usage": USAGE.to_json()}, "$.plan") == USAGE
    with pytest.raises(IntegrityError, match=r"malformed usage: \$\.plan\.usage must be"):
        carried_usage({"usage": {"requests": {}}}, "$.plan")


# -- records that carry usage ---------------------------------------------------------------------


def test_records_carry_usage_optionally() -> None:
    manifest = make_manifest([[1000, 5]])
    entries = tuple(manifest.chunks())
    with_usage = ItemResult(0, entries, USAGE)
    assert ItemResult.from_bytes(with_usage.to_bytes(), "r").usage == USAGE
    assert ItemResult.from_bytes(ItemResult(0, entries).to_bytes(), "r").usage is None  # an older worker's record
    doc = json.loads(with_usage.to_bytes())
    doc["usage"]["transitions"] = 1
    with pytest.raises(IntegrityError, match="result record results/x.json is malformed: usage must be"):
        ItemResult.from_bytes(json.dumps(doc).encode(), "results/x.json")

    end = StreamEnd([10], [1], usage=USAGE)
    assert StreamEnd.from_bytes(end.to_bytes()).usage == USAGE and end == StreamEnd([10], [1])  # usage is no part of what the stream was
    with pytest.raises(IntegrityError, match="stream-end record stream-end.json is malformed: usage must be"):
        StreamEnd.from_bytes(b'{"lengths": [10], "segments": [1], "usage": {}}')


def test_the_manifest_mac_covers_the_usage_and_older_manifests_have_none() -> None:
    manifest = replace(make_manifest([[1000, 5]]), usage=USAGE)
    sealed = manifest.seal(KEY)
    assert open_manifest(sealed, "m").authenticate(KEY).usage == USAGE
    assert open_manifest(make_manifest([[1000]]).seal(KEY), "m").authenticate(KEY).usage is None

    body = sealed[85:-77].replace(b'"transitions":9', b'"transitions":1')
    assert body != sealed[85:-77]
    forged = sealed[:85] + body + sealed[-77:]


    digest = hashlib.sha256(body + sealed[8:72]).hexdigest().encode()
    forged = forged[:-66] + digest + b'"}'
    with pytest.raises(IntegrityError, match="failed authentication"):
        open_manifest(forged, "m").authenticate(KEY)

    summary = BackupSummary.of(manifest)
    assert open_summary(summary.seal(KEY), "s").authenticate(KEY).usage == USAGE.billed()


# -- the price table -----------------------------------------------------------------------------


def test_price_is_quantity_times_unit_price() -> None:
    cost = price(USAGE, DEFAULT)
    lines = {line.item: line for line in cost.lines}
    assert lines["s3 PUT/COPY/POST/LIST requests"].cost == pytest.approx(14 * 0.000005)
    assert lines["s3 GET/HEAD/other requests"].cost == pytest.approx(12 * 0.0000004)
    assert lines["lambda invocations"].quantity == 6 and lines["lambda GB-seconds"].cost == pytest.approx(4.3815 * 0.0000133334)
    assert lines["kms requests"].cost == pytest.approx(2 * 0.000003)
    assert lines["step functions transitions"].cost == pytest.approx(9 * 0.000025)
    assert cost.total == pytest.approx(sum(line.cost for line in cost.lines))
    assert cost.storage_per_month == pytest.approx(600 / 2**30 * 0.023)


def test_a_stored_table_overrides_the_defaults_it_names(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert load_prices(store) == DEFAULT
    table = set_prices(store, {"s3_put_request": "0.0000054", "name": "eu-central-1", "currency": "EUR"})
    assert load_prices(store) == table and table.stored
    assert (table.prices["s3_put_request"], table.prices["s3_get_request"], table.currency) == (0.0000054, DEFAULT.prices["s3_get_request"], "EUR")
    assert price(USAGE, table).lines[2].cost == pytest.approx(14 * 0.0000054)
    assert reset_prices(store) == DEFAULT and load_prices(store) == DEFAULT


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "Expecting value"),
        (b'{"version": 1, "prices": {"kms_request": "0.1"}}', "must be a non-negative number, not '0.1'"),
        (b'{"version": 2}', "expected"),
        (b'{"version": 1, "prices": {"s3_put": 1}}', "unknown price s3_put"),
        (b'{"version": 1, "prices": {"kms_request": -1}}', "must be a non-negative number"),
        (b'{"version": 1, "prices": {"kms_request": true}}', "must be a non-negative number"),
        (b'{"version": 1, "currency": ""}', "non-empty text"),
    ],
)
def test_a_broken_table_is_refused_naming_the_file(raw: bytes, message: str) -> None:
    with pytest.raises(IntegrityError, match=f"price table /r/prices.json is not valid .*{message}.*braid prices reset"):
        parse_prices(raw, "/r/prices.json")


def test_settings_are_checked() -> None:
    with pytest.raises(UsageError, match="unknown price 'bogus'"):
        DEFAULT.with_settings({"bogus": "1"})
    with pytest.raises(UsageError, match="price kms_request must be a number, not 'abc'"):
        DEFAULT.with_settings({"kms_request": "abc"})
    with pytest.raises(UsageError, match="must be a non-negative number"):
        DEFAULT.with_settings({"kms_request": "-1"})


# -- the CLI --------------------------------------------------------------------------------------


def test_show_and_list_report_a_local_backups_usage(repo: Path, tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.write_bytes(bytes(range(256)) * 9000)
    ref = run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", "1MiB", "--input", str(source)).out.strip()

    shown = json.loads(run_braid("show", "--repo", str(repo), ref, "--json").out)
    usage = shown["usage"]
    assert shown["usage_detail"] == {"requests": {}, "lambda": {}} and usage["sfn_transitions"] == usage["s3_put_requests"] == 0  # nothing billed per request
    assert (usage["staged_bytes"], usage["stored_bytes"]) == (0, shown["stored_bytes"]) and usage["cpu_seconds"] > 0
    # A directory repository has no AWS bill: no cost, and no price table in show, until `braid prices set` stores one.
    assert shown["cost"] is None and shown["cost_lines"] is None
    (row,) = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert (row["usage"], row["cost"]) == (usage, None)
    text = run_braid("show", "--repo", str(repo), ref).out
    assert "CPU-seconds on this host" in text and "priced with" not in text and "S3 DELETE" not in text and "storage, per month" not in text
    assert run_braid("--repo", str(repo), "prices", "set", "s3_storage_gb_month=0.023").code == 0

    shown = json.loads(run_braid("show", "--repo", str(repo), ref, "--json").out)
    assert shown["cost"]["total"] == 0 and shown["cost"]["storage_per_month"] == pytest.approx(shown["stored_bytes"] / 2**30 * 0.023, rel=1e-5)
    (row,) = json.loads(run_braid("list", "--repo", str(repo), "--json").out)
    assert (row["usage"], row["cost"]) == (usage, shown["cost"]) and "lines" not in row["cost"]
    assert sum(line["cost"] for line in shown["cost_lines"]) == pytest.approx(shown["cost"]["total"], rel=1e-5)

    text = run_braid("show", "--repo", str(repo), ref).out
    assert "CPU-seconds on this host" in text and "priced with 'aws us-east-1 list prices'" in text  # the stored table keeps the defaults' name
    assert "storage, per month" in text and "lambda invocations" not in text  # unused items are left out of the table


def test_braid_prices_show_set_reset(repo: Path) -> None:
    shown = run_braid("prices", "show", "--repo", str(repo), "--json")
    assert shown.code == 0 and json.loads(shown.out)["stored"] is False
    updated = run_braid("--repo", str(repo), "prices", "set", "lambda_request=0.0000003", "date=2026-12-01", "--json")
    assert updated.code == 0, updated.stderr
    doc = json.loads(updated.out)
    assert (doc["stored"], doc["date"], doc["prices"]["lambda_request"]) == (True, "2026-12-01", 0.0000003)
    assert json.loads((repo / PRICES).read_text())["prices"]["lambda_request"] == 0.0000003
    text = run_braid("prices", "show", "--repo", str(repo)).out
    assert "stored in the repository" in text and "lambda_request           3e-07" in text
    assert run_braid("prices", "reset", "--repo", str(repo)).code == 0 and not (repo / PRICES).exists()


@pytest.mark.parametrize(
    ("words", "code", "message"),
    [
        (["set", "bogus=1"], 2, "braid: error: unknown price 'bogus': one of lambda_request, "),
        (["set", "kms_request=abc"], 2, "braid: error: price kms_request must be a number, not 'abc'"),
        (["set", "kms_request"], 2, "braid: error: expected KEY=VALUE, not 'kms_request'"),
        (["set"], 2, "braid: error: 'braid prices set' needs at least one KEY=VALUE"),
        (["show", "kms_request=1"], 2, "braid: error: 'braid prices show' takes no KEY=VALUE settings"),
    ],
)
def test_prices_failures_say_what_is_wrong(repo: Path, words: list[str], code: int, message: str) -> None:
    result = run_braid("--repo", str(repo), "prices", *words)
    assert result.code == code and result.stderr.startswith(message), result.stderr


def test_a_broken_stored_table_fails_show_with_the_file_named(repo: Path, tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.write_bytes(b"x" * 1000)
    ref = run_braid("backup", "--repo", str(repo), "--name", "db", "--input", str(source)).out.strip()
    (repo / PRICES).write_text('{"version": 1, "prices": {"kms_request": "cheap"}}')
    for words in (["show", ref], ["list", "--json"], ["prices", "show"]):
        result = run_braid(*words, "--repo", str(repo))
        assert result.code == 6, (words, result.stderr)
        assert result.stderr.startswith(f"braid: error: price table {repo}/prices.json is not valid"), result.stderr
    assert run_braid("list", "--repo", str(repo)).code == 0  # the table is only read to price
