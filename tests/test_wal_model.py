"""scripts/bench cloud-model's `wal` table (bench_lib.wal_model), recomputed by hand from AWS's published prices.

The request counts are the real code's (stage_wal on the host, process_staged
in the WAL worker, run against counting stores); the prices are written here
(us-east-1 list prices, 2026-11), not read from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from bench_lib import wal_model  # noqa: E402
from braid import contract  # noqa: E402
from braid.format.wal_bundle import BUNDLE_FILES  # noqa: E402

PUT, GET, KMS, SQS, GB_S, INVOKE = 0.005 / 1000, 0.0004 / 1000, 0.03 / 10000, 0.40 / 1e6, 0.0000133334, 0.20 / 1e6
SEGMENTS = 2**40 // 2**24  # 16 MiB segments in a TiB


@pytest.fixture(scope="module")
def requests() -> wal_model.Requests:
    return wal_model.count_requests()  # one full batch, the policy wal-pack on


@pytest.fixture(scope="module")
def unpacked() -> wal_model.Requests:
    return wal_model.count_requests(pack=False)


def test_requests_per_segment_are_counted_from_the_code(requests: wal_model.Requests, unpacked: wal_model.Requests) -> None:
    # wal-push: config.json and archive.json read, the staged PUT, the archive's HEAD after it, (the record is version
    # 3: the archive may hold packs and stage bundles) one LIST of the directory's packs and the ranged GET of the
    # segment's slot's bundle head (a 404 but at a backlog).
    assert requests.host == unpacked.host == {"s3_get_class": 4.0, "s3_put_class": 2.0}
    # The resident pusher reads config.json once and lists a directory's packs once: here once for the batch's segments.
    assert requests.host_async == unpacked.host_async == {"s3_get_class": 3.0, "s3_put_class": pytest.approx(1 + 1 / contract.WAL_BATCH_SIZE)}
    # async-bundle: per bundle of a whole slot one PUT and archive.json read; per member the archive's HEAD and the
    # HEAD of its single staged key; the directory's packs listed once (here over two bundles); one S3 event and SQS
    # message per bundle.
    per = 1 / BUNDLE_FILES
    assert requests.host_bundle == pytest.approx({"s3_get_class": 2 + per, "s3_put_class": per + per / 2})
    assert requests.bundle_messages == pytest.approx(per)
    # The worker, per bundle: a ranged GET of its head and one per member, the LIST of the directory (copies archived
    # already), one data key and one PUT (the pack), the bundle's DELETE; with wal-pack off, a data key and a PUT per member.
    assert requests.worker_bundle == pytest.approx({"s3_get_class": 1 + per, "kms_request": per, "s3_put_class": 2 * per, "s3_delete_free": per})
    assert unpacked.worker_bundle == pytest.approx({"s3_get_class": 1 + per, "kms_request": 1.0, "s3_put_class": 1 + per, "s3_delete_free": per})


def test_the_wal_cost_per_tib_is_the_sum_of_its_priced_counts(requests: wal_model.Requests) -> None:
    cpu, ratio = 0.1125, 0.54
    (row, _async) = wal_model.table_rows(requests, cpu, ratio, backup_cost_per_tib=0.64)
    network = 76e6  # bytes/s of a function below 2 GB (published measurements; scale_sim)
    batch = contract.WAL_BATCH_SIZE
    # worker-overlap: the staged GET hides behind the codec (at 512 MB the codec is the longer); the pack's PUT follows.
    seconds = max(2**24 / network, cpu * 1769 / contract.WAL_MEMORY_MB) + 2**24 * ratio / network + (1 + 2 / batch + 1 / batch + 1) * 0.015
    by_hand = SEGMENTS * (
        (2 + 2 / batch) * PUT  # the host's staged PUT and LIST of packs; per batch the worker's LIST and the pack's PUT
        + (4 + 1) * GET
        + KMS / batch
        + (1 + 2 / batch) * SQS
        + INVOKE / batch
        + seconds * contract.WAL_MEMORY_MB / 1024 * GB_S
    ) + 0.023 * (2**40 / 1e9) * contract.WAL_BATCH_WINDOW_SECONDS / (30 * 86400)
    assert row["segment_seconds"] == pytest.approx(seconds, abs=1e-3)
    assert row["wal_cost_per_tib"] == pytest.approx(by_hand, abs=1e-3)
    assert row["wal_over_backup"] == pytest.approx(by_hand / 0.64, abs=1e-3)
    # The host's PUT and LIST per 16 MiB segment alone are the backup path's whole TiB: the figure a bundle would cut.
    assert row["costs_per_tib"]["host s3 PUT-class"] == pytest.approx(SEGMENTS * 2 * PUT)


def test_each_policy_on_and_off_by_hand(requests: wal_model.Requests, unpacked: wal_model.Requests) -> None:
    cpu, ratio, batch = 0.1125, 0.54, contract.WAL_BATCH_SIZE
    rows = {(r["policies"], r["mode"]): r for r in wal_model.policy_rows(requests, unpacked, cpu, ratio, 0.64)}
    get, put, codec = 2**24 / 76e6, 2**24 * ratio / 76e6, cpu * 1769 / contract.WAL_MEMORY_MB

    def by_hand(host_gets: float, host_puts: float, worker_puts: float, kms: float, overlap: bool, messages: float) -> float:
        staged_gets = 1 if messages == 1 else 1 + messages  # a staged file's GET; a bundle's head, then each member's
        trips = staged_gets + worker_puts + kms + messages  # the staged GETs, the PUT-class requests, KMS, the DELETEs
        seconds = (max(get, codec) if overlap else get + codec) + put + trips * 0.015
        return SEGMENTS * (
            (host_puts + worker_puts) * PUT + (host_gets + staged_gets) * GET + kms * KMS + messages * (1 + 2 / batch) * SQS
            + messages * INVOKE / batch + seconds * contract.WAL_MEMORY_MB / 1024 * GB_S
        ) + 0.023 * (2**40 / 1e9) * contract.WAL_BATCH_WINDOW_SECONDS / (30 * 86400)

    sync, pusher = 2, 1 + 1 / batch  # the staged PUT and, per push or per directory in the pusher's life, the LIST of packs
    per = 1 / BUNDLE_FILES  # a bundle's share: its PUT, archive.json read, S3 event; the worker's GET, LIST, pack, DELETE
    bundled_gets, bundled_puts = 2 + per, per + per / 2
    expected = {
        ("none (before)", "wal-push"): by_hand(4, sync, 1, 1, False, 1),
        ("none (before)", "wal-push --async"): by_hand(3, pusher, 1, 1, False, 1),
        ("wal-pack", "wal-push"): by_hand(4, sync, 2 / batch, 1 / batch, False, 1),
        ("wal-pack", "wal-push --async"): by_hand(3, pusher, 2 / batch, 1 / batch, False, 1),
        ("async-bundle", "wal-push --async"): by_hand(bundled_gets, bundled_puts, 1 + per, 1, False, per),
        ("worker-overlap", "wal-push"): by_hand(4, sync, 1, 1, False, 1),  # it reads a pack's members: without packs, no change
        ("wal-pack + worker-overlap", "wal-push"): by_hand(4, sync, 2 / batch, 1 / batch, True, 1),
        # A bundle's members are read by ranged GETs, the next one during this one's codec, as a pack's staged files are.
        ("all", "wal-push --async"): by_hand(bundled_gets, bundled_puts, 2 * per, per, True, per),
    }
    for key, value in expected.items():
        assert rows[key]["wal_cost_per_tib"] == pytest.approx(value, abs=1e-3), key
        assert rows[key]["wal_over_backup"] == pytest.approx(value / 0.64, abs=1e-3), key
    assert all(row["built"] for row in rows.values())
    assert rows[("all", "wal-push --async")]["wal_cost_per_tib"] < rows[("wal-pack + worker-overlap", "wal-push --async")]["wal_cost_per_tib"]
    assert rows[("wal-pack", "wal-push")]["wal_cost_per_tib"] < rows[("none (before)", "wal-push")]["wal_cost_per_tib"] - 0.4


def test_the_p99_to_the_final_form_is_within_a_minute(requests: wal_model.Requests) -> None:
    (row, _async) = wal_model.table_rows(requests, 0.1125, 0.54, backup_cost_per_tib=None)
    steps = row["p99_steps"]
    assert steps["batching window"] == contract.WAL_BATCH_WINDOW_SECONDS
    assert steps["full batch, one file after another"] == pytest.approx(contract.WAL_BATCH_SIZE * row["segment_seconds"], abs=0.01)
    assert row["p99_seconds_to_final"] == pytest.approx(sum(steps.values()), abs=0.01)
    assert row["p99_seconds_to_final"] <= 60
    # --async at a backlog: a full batch of whole bundles, BUNDLE_FILES segments per message.
    steps = _async["p99_steps"]
    assert steps["full batch, one file after another"] == pytest.approx(contract.WAL_BATCH_SIZE * BUNDLE_FILES * _async["segment_seconds"], abs=0.05)
    assert _async["p99_seconds_to_final"] <= 60


def test_cloud_model_prints_the_wal_table_with_its_stable_names(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from bench_lib.benchmarks.cloud_model import WAL_COLUMNS, wal_section

    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * (2**24 // 256))
    ctx = SimpleNamespace(dataset=lambda: SimpleNamespace(path=data), args=SimpleNamespace(level=3))
    tables, facts = wal_section(ctx, arm=1.0, ratio=0.5, backup_cost_per_tib=0.64)  # type: ignore[arg-type]
    wal = tables[0].to_json()
    assert wal["title"].startswith("wal:") and [r["mode"] for r in wal["rows"]] == ["wal-push", "wal-push --async"]
    assert all(set(r) == set(WAL_COLUMNS) for r in wal["rows"])
    targets = {r["target"]: r for r in tables[2].to_json()["rows"]}
    assert targets["p99 s from push to final form"][""] == "PASS"
    verdict = "PASS" if wal["rows"][0]["wal_cost_per_tib"] <= 0.64 else "MISS"
    assert targets["WAL $ per TiB (wal-push) <= the backup path's"][""] == verdict
    assert "encode_wal measured here" in facts["wal codec CPU per 16 MiB segment on arm64"]
    policies = tables[3].to_json()
    assert policies["key"] == "wal_policies" and {r["policies"] for r in policies["rows"]} >= {"none (before)", "wal-pack", "all"}
