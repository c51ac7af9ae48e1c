"""The cloud verify's steps over a local store: its request, its items, and how RecordVerify folds what the map exported."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from braid.adapters.local.store import LocalStore
from braid.errors import UsageError
from braid.format.verification import Selection
from braid.pipeline.verify_record import export_key, fold, map_outcomes
from braid.pipeline.verify_request import ItemOutcome, PlannedBackup, VerifyRequest, items_of

REF = "db@20261123T000000.000Z-1a2b3c4d"
NOW = datetime(2026, 11, 24, tzinfo=UTC)


def test_the_request_takes_what_the_cli_and_the_schedule_send() -> None:
    assert VerifyRequest.from_event({}).backups == "latest"
    request = VerifyRequest.from_event({"backups": [REF], "deep": True, "rotate": 7, "prefix": "prod"})
    assert (request.backups, request.mode, request.rotate, request.prefix) == ((REF,), "deep", 7, "prod")


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({"backups": "some"}, '"backups" is a list of NAME@ID, "all" or "latest"'),
        ({"backups": []}, '"backups" names no backup'),
        ({"backups": ["../x@y"]}, "invalid verify request"),
        ({"sample_percent": 0}, "sample_percent must be in (0, 100]"),
        ({"rotate": 0}, "rotate must be at least 1"),
        ({"rotate": 3, "sample_percent": 10}, "sample_percent and rotate exclude each other"),
    ],
)
def test_a_bad_request_is_refused_with_its_reason(event: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match="invalid verify request") as caught:
        VerifyRequest.from_event(event)
    assert message in str(caught.value)


def test_items_group_the_selected_chunks_in_order() -> None:
    items = items_of(REF, [0, 3, 6, 9, 12], per_item=2)
    assert [i.chunks for i in items] == [(0, 3), (6, 9), (12,)] and {i.backup for i in items} == {REF}


def test_chunks_no_outcome_accounts_for_are_failures_not_silence() -> None:
    planned = PlannedBackup(REF, Selection(), chunks_total=10, chunks_selected=10)
    outcomes = [ItemOutcome(REF, 5, 500), ItemOutcome(REF, 0, 0, [(5, "chunk 5 is missing")], corrupt=True)]

    record = fold(planned, outcomes, "deep", NOW)

    assert (record.chunks_checked, record.failure_count, record.corrupt, record.outcome) == (5, 2, True, "failed")
    assert record.failures == ["chunk 5 is missing", f"4 selected chunk(s) of backup {REF} were not checked: the verify map reported no result for them"]
    whole = fold(planned, [ItemOutcome(REF, 10, 1000), ItemOutcome("other@20261123T000000.000Z-00000000", 1, 1)], "deep", NOW)
    assert whole.ok and whole.chunks_checked == 10 and whole.bytes_checked == 1000


def test_the_maps_export_folds_successes_and_failed_items_with_the_workers_error(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    run = "verify-runs/map-results/run-1"
    ok = {"Status": "SUCCEEDED", "Output": json.dumps(ItemOutcome(REF, 2, 20).to_json())}
    failed = {
        "Status": "FAILED",
        "Input": json.dumps({"prefix": "", "item": {"backup": REF, "chunks": [2, 3]}}),
        "Error": "IntegrityError",
        "Cause": json.dumps({"errorType": "IntegrityError", "errorMessage": "manifest of db does not authenticate"}),
    }
    store.put(f"{run}/SUCCEEDED_0.json", json.dumps([ok]).encode())
    store.put(f"{run}/FAILED_0.json", json.dumps([failed]).encode())
    files = {"SUCCEEDED": [{"Key": f"prod/{run}/SUCCEEDED_0.json"}], "FAILED": [{"Key": f"prod/{run}/FAILED_0.json"}], "PENDING": []}
    store.put(f"{run}/manifest.json", json.dumps({"ResultFiles": files}).encode())

    outcomes, keys = map_outcomes(store, {"ResultWriterDetails": {"Bucket": "b", "Key": f"prod/{run}/manifest.json"}})

    assert sorted(keys) == sorted(f"{run}/{n}" for n in ("manifest.json", "SUCCEEDED_0.json", "FAILED_0.json"))
    (good, bad) = outcomes
    assert (good.chunks_checked, good.failures) == (2, [])
    assert bad.corrupt and [i for i, _ in bad.failures] == [2, 3]
    assert bad.failures[0][1] == f"chunk 2 of backup {REF} was not checked: the verify worker failed: IntegrityError: manifest of db does not authenticate"
    with pytest.raises(UsageError, match="outside verify-runs/"):
        export_key("prod/elsewhere/manifest.json")


def test_a_run_over_many_backups_keeps_its_output_under_the_state_limit() -> None:
    from braid.ops.verification import new_record
    from braid.pipeline.verify_record import RunReport

    def record(i: int, ok: bool) -> object:
        return new_record(
            f"db{i}@20261123T000000.000Z-1a2b3c4d", mode="deep", selection=Selection(), engine="stepfunctions", chunks_total=5,
            chunks_checked=5 if ok else 3, bytes_checked=1, failures=[] if ok else [f"chunk {n} is missing " + "x" * 100 for n in range(30)],
            corrupt=not ok, at=NOW,
        )

    small = RunReport([record(0, True), record(1, False)]).to_json()  # type: ignore[list-item]
    assert len(small["reports"]) == 2 and len(small["reports"][1]["failures"]) == 20 and "omitted_ok" not in small
    big = RunReport([record(i, i % 500 != 7) for i in range(3000)]).to_json()  # type: ignore[list-item]
    assert len(json.dumps(big)) <= 200_000 and not big["ok"]
    assert [r["backup"] for r in big["reports"]] == [f"db{i}@20261123T000000.000Z-1a2b3c4d" for i in range(3000) if i % 500 == 7]
    assert big["omitted_ok"] == 3000 - 6 and all(len(r["failures"]) == 1 for r in big["reports"])
