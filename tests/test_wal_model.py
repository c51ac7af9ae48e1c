"""scripts/bench cloud-model's `wal` table (bench_lib.wal_model), recomputed by hand from AWS's published prices.

The request counts are the real code's (a plain wal-push's and the async
pusher's staging on the host, the WAL worker's batch and bundle steps, run
against counting stores); the prices are written here (us-east-1 list
prices, 2026-11), not read from the code.
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
def counts() -> dict[frozenset[str], wal_model.Requests]:
    return wal_model.count_policies()  # wal-pack and worker-list-once on and off: one full batch each


@pytest.fixture(scope="module")
def requests(counts: dict[frozenset[str], wal_model.Requests]) -> wal_model.Requests:
    return counts[wal_model.COUNTED]  # as deployed


@pytest.fixture(scope="module")
def unpacked(counts: dict[frozenset[str], wal_model.Requests]) -> wal_model.Requests:
    return counts[frozenset()]


PER = 1 / BUNDLE_FILES  # a bundle's share of a segment
BATCH = contract.WAL_BATCH_SIZE
# A plain wal-push at a backlog (sync-bundle), per slot of PostgreSQL's calls: the first reads the slot's bundle head
# (a 404), config.json, archive.json, the archived HEAD of its own segment and the 6 slot-mates', and after the PUT
# each member's single staged key (7); the 6 later calls read only the bundle head (before config.json). PUT-class:
# the bundle's PUT and the call's one LIST of the directory's packs.
SYNC_GETS, SYNC_PUTS = (3 + 6 + 1 + 7 + 6 * 1) * PER, 2 * PER


def test_requests_per_segment_are_counted_from_the_code(requests: wal_model.Requests, unpacked: wal_model.Requests) -> None:
    # wal-push, quiet: config.json and archive.json read, the slot's bundle head (a 404), the staged PUT, the archive's
    # HEAD after it, and (the record is version 3: the archive may hold packs) one LIST of the directory's packs.
    assert requests.host == unpacked.host == {"s3_get_class": 4.0, "s3_put_class": 2.0}
    assert requests.staged_puts == 1 and requests.staged_gets == 1, "one staged object per segment, read once by the worker"
    # The resident pusher reads config.json once and lists a directory's packs once: here once for the batch's segments.
    assert requests.host_async == unpacked.host_async == {"s3_get_class": 3.0, "s3_put_class": pytest.approx(1 + 1 / BATCH)}
    # async-bundle: per bundle of a whole slot one PUT and archive.json read; per member the archive's HEAD and the
    # HEAD of its single staged key; the directory's packs listed once in the pusher's life (here over a batch of
    # bundles); one S3 event and SQS message per bundle.
    assert requests.host_bundle == pytest.approx({"s3_get_class": 2 + PER, "s3_put_class": PER + PER / BATCH})
    assert requests.bundle_messages == requests.sync_messages == pytest.approx(PER)
    assert requests.host_sync_bundle == unpacked.host_sync_bundle == pytest.approx({"s3_get_class": SYNC_GETS, "s3_put_class": SYNC_PUTS})
    # The worker, per bundle: a ranged GET of its head and one per member, one data key and one PUT (the pack), the
    # bundle's DELETE, and (worker-list-once) one LIST of the directory for the batch's bundles; with wal-pack and
    # worker-list-once off, a data key and a PUT per member and a LIST per bundle.
    deployed = {"s3_get_class": 1 + PER, "kms_request": PER, "s3_put_class": PER + PER / BATCH, "s3_delete_free": PER}
    assert requests.worker_bundle == pytest.approx(deployed) and requests.worker_sync_bundle == pytest.approx(deployed)
    assert unpacked.worker_bundle == pytest.approx({"s3_get_class": 1 + PER, "kms_request": 1.0, "s3_put_class": 1 + PER, "s3_delete_free": PER})


def by_hand(host_gets: float, host_puts: float, worker_gets: float, worker_puts: float, kms: float, messages: float, overlap: bool, cpu: float = 0.1125, ratio: float = 0.54) -> tuple[float, float]:
    """($ per TiB, the worker's seconds per segment) from per-segment counts and AWS's published prices."""
    get, put, codec = 2**24 / 76e6, 2**24 * ratio / 76e6, cpu * 1769 / contract.WAL_MEMORY_MB
    trips = worker_gets + worker_puts + kms + messages  # each request's round trip (a DELETE per staged object)
    seconds = (max(get, codec) if overlap else get + codec) + put + trips * 0.015
    total = SEGMENTS * (
        (host_puts + worker_puts) * PUT + (host_gets + worker_gets) * GET + kms * KMS + messages * (1 + 2 / BATCH) * SQS
        + messages * INVOKE / BATCH + seconds * contract.WAL_MEMORY_MB / 1024 * GB_S
    ) + 0.023 * (2**40 / 1e9) * contract.WAL_BATCH_WINDOW_SECONDS / (30 * 86400)
    return total, seconds


def test_the_wal_cost_per_tib_is_the_sum_of_its_priced_counts(requests: wal_model.Requests) -> None:
    rows = {r["mode"]: r for r in wal_model.table_rows(requests, 0.1125, 0.54, backup_cost_per_tib=0.64)}
    expected = {
        # quiet: one staged object per segment; per batch the worker's LIST and the pack's PUT, one data key
        "wal-push, quiet": by_hand(4, 2, 1, 2 / BATCH, 1 / BATCH, 1, True),
        "wal-push --async, quiet": by_hand(3, 1 + 1 / BATCH, 1, 2 / BATCH, 1 / BATCH, 1, True),
        # a backlog: bundles of a whole slot, a batch of them; the worker's LIST once per batch
        "wal-push": by_hand(SYNC_GETS, SYNC_PUTS, 1 + PER, PER + PER / BATCH, PER, PER, True),
        "wal-push --async": by_hand(2 + PER, PER + PER / BATCH, 1 + PER, PER + PER / BATCH, PER, PER, True),
    }
    for mode, (total, seconds) in expected.items():
        assert rows[mode]["segment_seconds"] == pytest.approx(seconds, abs=1e-3), mode
        assert rows[mode]["wal_cost_per_tib"] == pytest.approx(total, abs=1e-3), mode
        assert rows[mode]["wal_over_backup"] == pytest.approx(total / 0.64, abs=1e-3), mode
    # The quiet push's staged PUT and LIST per 16 MiB segment alone are the backup path's whole TiB.
    assert rows["wal-push, quiet"]["costs_per_tib"]["host s3 PUT-class"] == pytest.approx(SEGMENTS * 2 * PUT)


def test_the_floor_of_one_staged_object_per_segment_is_below_every_quiet_row(requests: wal_model.Requests) -> None:
    rows = wal_model.table_rows(requests, 0.1125, 0.54, backup_cost_per_tib=0.551)
    floor = rows[-1]
    # The staged PUT, its SQS message, the worker's GET of it, and the codec's CPU at one vCPU's GB-s.
    expected = SEGMENTS * (PUT + SQS + GET + 0.1125 * 1769 / 1024 * GB_S)
    assert floor["mode"] == "floor: one staged object per segment" and floor["wal_cost_per_tib"] == pytest.approx(expected, abs=1e-4)
    assert floor["wal_over_backup"] == pytest.approx(expected / 0.551, abs=1e-3) and floor["wal_over_backup"] > 0.99
    for row in rows[:-1]:
        if row["mode"].endswith("quiet"):
            assert row["wal_cost_per_tib"] > floor["wal_cost_per_tib"], row["mode"]
            assert row["costs_per_tib"]["kms requests"] > 0 and row["costs_per_tib"]["worker s3 PUT-class"] > 0, "items the floor leaves out"


def test_each_policy_on_and_off_by_hand(counts: dict[frozenset[str], wal_model.Requests]) -> None:
    rows = {(r["policies"], r["mode"]): r for r in wal_model.policy_rows(counts, 0.1125, 0.54, 0.64)}
    sync, pusher = 2, 1 + 1 / BATCH  # the staged PUT and, per push or per directory in the pusher's life, the LIST of packs
    bundled_gets, bundled_puts = 2 + PER, PER + PER / BATCH
    expected = {
        ("none (before)", "wal-push"): by_hand(4, sync, 1, 1, 1, 1, False),
        ("none (before)", "wal-push --async"): by_hand(3, pusher, 1, 1, 1, 1, False),
        ("wal-pack", "wal-push"): by_hand(4, sync, 1, 2 / BATCH, 1 / BATCH, 1, False),
        ("wal-pack", "wal-push --async"): by_hand(3, pusher, 1, 2 / BATCH, 1 / BATCH, 1, False),
        # a bundle's members one object each, a LIST per bundle
        ("async-bundle", "wal-push --async"): by_hand(bundled_gets, bundled_puts, 1 + PER, 1 + PER, 1, PER, False),
        ("sync-bundle", "wal-push"): by_hand(SYNC_GETS, SYNC_PUTS, 1 + PER, 1 + PER, 1, PER, False),
        ("worker-list-once", "wal-push"): by_hand(4, sync, 1, 1, 1, 1, False),  # it lists for bundles: without them, no change
        ("worker-overlap", "wal-push"): by_hand(4, sync, 1, 1, 1, 1, False),  # it reads a pack's members: without packs, no change
        ("wal-pack + worker-overlap", "wal-push"): by_hand(4, sync, 1, 2 / BATCH, 1 / BATCH, 1, True),
        ("all but worker-list-once", "wal-push"): by_hand(SYNC_GETS, SYNC_PUTS, 1 + PER, 2 * PER, PER, PER, True),
        ("all but worker-list-once", "wal-push --async"): by_hand(bundled_gets, bundled_puts, 1 + PER, 2 * PER, PER, PER, True),
        ("all", "wal-push"): by_hand(SYNC_GETS, SYNC_PUTS, 1 + PER, PER + PER / BATCH, PER, PER, True),
        ("all", "wal-push --async"): by_hand(bundled_gets, bundled_puts, 1 + PER, PER + PER / BATCH, PER, PER, True),
    }
    for key, (value, _seconds) in expected.items():
        assert rows[key]["wal_cost_per_tib"] == pytest.approx(value, abs=1e-3), key
        assert rows[key]["wal_over_backup"] == pytest.approx(value / 0.64, abs=1e-3), key
    assert all(row["built"] for row in rows.values())
    assert ("sync-bundle", "wal-push --async") not in rows and ("async-bundle", "wal-push") not in rows
    assert rows[("all", "wal-push")]["wal_cost_per_tib"] < rows[("all but worker-list-once", "wal-push")]["wal_cost_per_tib"]
    assert rows[("all", "wal-push")]["wal_cost_per_tib"] < rows[("wal-pack + worker-overlap", "wal-push")]["wal_cost_per_tib"] - 0.5


def test_the_p99_to_the_final_form_is_within_a_minute(requests: wal_model.Requests) -> None:
    rows = {r["mode"]: r for r in wal_model.table_rows(requests, 0.1125, 0.54, backup_cost_per_tib=None)}
    quiet = rows["wal-push, quiet"]
    steps = quiet["p99_steps"]
    assert steps["batching window"] == contract.WAL_BATCH_WINDOW_SECONDS
    assert steps["full batch, one file after another"] == pytest.approx(BATCH * quiet["segment_seconds"], abs=0.01)
    assert quiet["p99_seconds_to_final"] == pytest.approx(sum(steps.values()), abs=0.01)
    assert quiet["p99_seconds_to_final"] <= 60
    # At a backlog (both modes): a full batch of whole bundles, BUNDLE_FILES segments per message.
    for mode in ("wal-push", "wal-push --async"):
        steps = rows[mode]["p99_steps"]
        assert steps["full batch, one file after another"] == pytest.approx(BATCH * BUNDLE_FILES * rows[mode]["segment_seconds"], abs=0.05)
        assert rows[mode]["p99_seconds_to_final"] <= 60


def test_cloud_model_prints_the_wal_table_with_its_stable_names(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from bench_lib.benchmarks.cloud_model import WAL_COLUMNS, wal_section

    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * (2**24 // 256))
    ctx = SimpleNamespace(dataset=lambda: SimpleNamespace(path=data), args=SimpleNamespace(level=3))
    tables, facts = wal_section(ctx, arm=1.0, ratio=0.5, backup_cost_per_tib=0.64)  # type: ignore[arg-type]
    wal = tables[0].to_json()
    modes = ["wal-push", "wal-push --async", "wal-push, quiet", "wal-push --async, quiet", "floor: one staged object per segment"]
    assert wal["title"].startswith("wal:") and [r["mode"] for r in wal["rows"]] == modes
    assert all(set(r) == set(WAL_COLUMNS) for r in wal["rows"])
    targets = {r["target"]: r for r in tables[2].to_json()["rows"]}
    assert targets["p99 s from push to final form (wal-push)"][""] == "PASS"
    verdict = "PASS" if wal["rows"][0]["wal_cost_per_tib"] <= 0.64 else "MISS"
    assert targets["WAL $ per TiB (wal-push) <= the backup path's"][""] == verdict
    assert "encode_wal measured here" in facts["wal codec CPU per 16 MiB segment on arm64"]
    policies = tables[3].to_json()
    assert policies["key"] == "wal_policies" and {r["policies"] for r in policies["rows"]} >= {"none (before)", "wal-pack", "sync-bundle", "all"}
