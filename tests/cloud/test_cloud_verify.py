"""`braid verify` on an s3:// repository runs the stack's verify state machine (the emulated cloud).

The state machine is the one CDK synthesizes (support.moto_stack deploys
every state machine of the template); its functions run in the emulator
with their own roles. The host starts and follows one execution and reads
no chunk: the request log shows it. Damage is made the way it happens: a
chunk object replaced by one with a flipped byte (an operator's mistake, or
a bug in something else writing the bucket), or deleted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_emulated_e2e import CHUNK, Emulator, MiB, Run, assert_within_policy, braid, stream_bytes

from braid.contract import CHUNKS_PER_PACK, VERIFY_FAILED
from braid.pipeline.worker import pack_sizes
from support.event_docs import documented_events

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]


def backup(cloud: Emulator, name: str, size: int, seed: int) -> str:
    # One worker: the items are not spread over workers, so the worker stores them in packs (pack_sizes, docs/format.md).
    run = braid(cloud, f"agent-{name}", "backup", "--name", name, "--chunk-size", CHUNK, "--fan-out", "1", stdin=stream_bytes(size, seed))
    assert run.code == 0, run.stderr
    return run.stdout.strip()


def chunk_key(ref: str, index: int) -> str:
    name, _, ident = ref.partition("@")
    return f"data/{name}/{ident}/{index:010d}"


def verify(cloud: Emulator, caller: str, *args: str) -> Run:
    return braid(cloud, caller, "verify", *args, timeout=300)


def reports(run: Run) -> list[dict[str, Any]]:
    assert run.stdout.strip(), run.stderr
    return list(json.loads(run.stdout))


def host_read_chunks(cloud: Emulator, caller: str) -> list[dict[str, Any]]:
    return [r for r in cloud.requests(caller=caller) if r.get("service") == "s3" and str(r.get("key") or "").startswith("data/")]


def events_queue(cloud: Emulator) -> str:
    """An SQS queue the default bus forwards "Verify Failed" events to, as an operator's rule would."""
    sqs, events = cloud.client("sqs"), cloud.client("events")
    url = sqs.create_queue(QueueName="verify-failed")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name="verify-failed", EventPattern=json.dumps({"source": ["braid"], "detail-type": [VERIFY_FAILED]}))
    events.put_targets(Rule="verify-failed", Targets=[{"Id": "queue", "Arn": arn}])
    return url


def received(cloud: Emulator, url: str) -> list[dict[str, Any]]:
    messages = cloud.client("sqs").receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2).get("Messages", [])
    return [json.loads(m["Body"]) for m in messages]


def test_quick_and_deep_verify_of_a_good_backup_run_in_the_cloud_and_are_recorded(cloud: Emulator, tmp_path: Path) -> None:
    ref = backup(cloud, "good", 12 * MiB + 5, 1)
    assert [manifest_chunk(cloud, ref, i)["pack"] for i in range(3)] == [0, 0, 0]  # one item of 3 chunks: one pack of 3

    quick = verify(cloud, "restore-good", ref, "--json")
    deep = verify(cloud, "restore-good", ref, "--deep", "--json")

    assert quick.code == 0 and deep.code == 0, quick.stderr + deep.stderr
    ((q,), (d,)) = reports(quick), reports(deep)
    assert (q["backup"], q["mode"], q["ok"], q["chunks_total"], q["chunks_checked"]) == (ref, "quick", True, 3, 3)
    assert (d["backup"], d["mode"], d["ok"], d["chunks_checked"], d["bytes_checked"]) == (ref, "deep", True, 3, 12 * MiB + 5)
    assert host_read_chunks(cloud, "restore-good") == []  # the host downloaded nothing
    # Quick needs no map: one LIST of the backup's objects (presence, size), a HEAD per pack (S3's LIST has no
    # checksum value; the worker stored the 3 chunks as one pack, docs/format.md), no GET; deep reads each chunk's frame once.
    name, _, ident = ref.partition("@")
    planner = [r for r in cloud.requests() if r["caller"].startswith("emulatedpipeline-FunctionsVerifyplanRole")]
    chunk_requests = [r["op"] for r in planner if str(r.get("key") or "").startswith(f"data/{name}/{ident}/")]
    assert sorted(chunk_requests) == ["HeadObject"] * len(pack_sizes(3, CHUNKS_PER_PACK)) == ["HeadObject"]
    assert len([r for r in planner if r["op"] == "ListObjects" and r.get("prefix") == f"data/{name}/{ident}/"]) == 1
    worker_reads = [r for r in cloud.requests(op="GetObject") if str(r.get("key") or "").startswith(f"data/{name}/{ident}/")]
    assert len(worker_reads) == 3 and all(r["caller"].startswith("emulatedpipeline-FunctionsVerifyworkerRole") for r in worker_reads)
    assert cloud.requests(caller="restore-good", service="states", op="StartExecution")
    # Recorded beside the backup, and shown.
    records = cloud.keys(f"verify/{ref.replace('@', '/')}/")
    assert [k.rpartition("~")[0].rpartition("~")[2] for k in records] == ["quick", "deep"] and all(k.endswith("~ok.json") for k in records)
    shown = braid(cloud, "restore-good", "show", ref)
    assert shown.code == 0 and "verified    deep " in shown.stdout and "by stepfunctions: ok; all chunks, 3/3 chunks checked" in shown.stdout
    listed = braid(cloud, "restore-good", "list", "--json")
    (row,) = [r for r in json.loads(listed.stdout) if r["backup"] == ref]
    assert row["verified"]["mode"] == "deep" and row["verified"]["outcome"] == "ok"
    assert cloud.keys("verify-runs/") == []  # the run's work is gone
    # Restored from the pack by ranged reads of its frames, byte for byte.
    restored = braid(cloud, "restore-good", "restore", ref, "--output", str(tmp_path / "out"))
    assert restored.code == 0 and (tmp_path / "out").read_bytes() == stream_bytes(12 * MiB + 5, 1), restored.stderr
    assert_within_policy(cloud, "restore-good", "restore")


def manifest_chunk(cloud: Emulator, ref: str, index: int) -> dict[str, Any]:
    """The manifest's entry of one chunk (docs/format.md, BODY), read as any JSON reader would."""
    name, _, ident = ref.partition("@")
    raw = cloud.client("s3").get_object(Bucket=cloud.bucket, Key=f"manifests/{name}/{ident}.json")["Body"].read()
    (entry,) = [c for i in json.loads(raw)["manifest"]["inputs"] for c in i["chunks"] if c["index"] == index]
    return dict(entry)


def test_a_flipped_byte_fails_quick_and_deep_verify_naming_the_chunk_and_announces_it(cloud: Emulator) -> None:
    ref = backup(cloud, "flipped", 12 * MiB + 5, 2)
    s3 = cloud.client("s3")
    second = manifest_chunk(cloud, ref, 1)
    assert second["pack"] == 0  # chunks 0-2 are one pack: the flip is in its second frame
    key = chunk_key(ref, second["pack"])
    body = bytearray(s3.get_object(Bucket=cloud.bucket, Key=key)["Body"].read())
    body[second["pack_offset"] + second["stored_length"] // 2] ^= 0x01
    s3.put_object(Bucket=cloud.bucket, Key=key, Body=bytes(body), ChecksumAlgorithm="CRC64NVME")  # S3 keeps the new object's checksum
    queue = events_queue(cloud)

    quick = verify(cloud, "restore-flipped", ref)
    deep = verify(cloud, "restore-flipped", ref, "--deep")

    assert quick.code == 6, quick.stderr
    assert f"pack of chunks 0-2 of backup {ref}: stored checksum mismatch (corrupt in the repository)" in quick.stdout
    note, error = quick.stderr.strip().splitlines()
    assert note.startswith("verifying in the cloud: arn:aws:states:") and ":execution:Braid-Verify:verify-" in note
    assert error == f"braid: error: 1 of 1 backup(s) failed verification; first: pack of chunks 0-2 of backup {ref}: stored checksum mismatch (corrupt in the repository)"
    assert deep.code == 6, deep.stderr
    assert f"{ref}: FAILED (deep, 2/3 chunks)" in deep.stdout and f"chunk 1 of backup {ref}: stored size or checksum mismatch" in deep.stdout
    assert host_read_chunks(cloud, "restore-flipped") == []
    announced = [e for e in received(cloud, queue) if e["detail"]["backup"] == ref]
    assert len(announced) == 2 and all(e["detail-type"] == VERIFY_FAILED for e in announced)
    assert all(set(e["detail"]) == documented_events()[VERIFY_FAILED] for e in announced)  # docs/cloud.md's event table
    assert any("chunk 1 of backup" in f for e in announced for f in e["detail"]["failures"])
    listed = json.loads(braid(cloud, "restore-flipped", "list", "--json").stdout)
    assert [r["verified"]["outcome"] for r in listed if r["backup"] == ref] == ["failed"]
    shown = braid(cloud, "restore-flipped", "show", ref)
    assert "by stepfunctions: FAILED (1 problem(s); first: chunk 1 of backup" in shown.stdout


def test_a_deleted_pack_fails_quick_and_deep_verify_and_restore_naming_its_chunks(cloud: Emulator, tmp_path: Path) -> None:
    ref = backup(cloud, "deleted", 27 * MiB + 5, 3)  # 6 chunks, one item: packs of chunks 0-2 and 3-5
    assert [manifest_chunk(cloud, ref, i)["pack"] for i in range(6)] == [0, 0, 0, 3, 3, 3]
    cloud.client("s3").delete_object(Bucket=cloud.bucket, Key=chunk_key(ref, 3))

    quick = verify(cloud, "restore-deleted", ref, "--json")
    deep = verify(cloud, "restore-deleted", ref, "--deep", "--json")

    for run, mode, first in ((quick, "quick", "pack of chunks 3-5"), (deep, "deep", "chunk 3")):
        assert run.code == 6, run.stderr
        (report,) = reports(run)
        assert (report["mode"], report["ok"], report["chunks_checked"]) == (mode, False, 3)
        assert report["failures"][0].startswith(f"{first} of backup {ref} is missing from the repository"), report
        assert f"failed verification; first: {first} of backup" in run.stderr
    assert deep.stdout and any(f.startswith(f"chunk 5 of backup {ref} is missing") for f in reports(deep)[0]["failures"])
    restored = braid(cloud, "restore-deleted", "restore", ref, "--output", str(tmp_path / "out"))
    assert restored.code == 6 and not (tmp_path / "out").exists()
    assert f"braid: error: chunk 3 of backup {ref} is missing from the repository (its pack {chunk_key(ref, 3)} is gone)" in restored.stderr, restored.stderr


def test_rotation_covers_every_chunk_over_its_runs_and_a_sample_checks_a_share(cloud: Emulator) -> None:
    ref = backup(cloud, "rotated", 20 * MiB + 5, 4)  # 5 chunks

    runs = [reports(verify(cloud, "restore-rotated", ref, "--rotate", "3", "--json"))[0] for _ in range(4)]

    assert [(r["selection"]["part"], r["selection"]["of"]) for r in runs] == [(1, 3), (2, 3), (3, 3), (1, 3)]
    assert [r["chunks_checked"] for r in runs] == [2, 2, 1, 2] and sum(r["chunks_checked"] for r in runs[:3]) == runs[0]["chunks_total"] == 5
    sampled = reports(verify(cloud, "restore-rotated", ref, "--deep", "--sample", "40", "--json"))[0]
    assert sampled["selection"] == {"kind": "sample", "percent": 40.0} and sampled["chunks_checked"] == 2 and sampled["ok"]


def test_all_checks_every_backup_and_a_missing_backup_is_the_hosts_error(cloud: Emulator) -> None:
    first, second = backup(cloud, "every", 6 * MiB, 5), backup(cloud, "every", 6 * MiB, 6)

    run = verify(cloud, "restore-every", "--all", "--json")
    assert {r["backup"] for r in reports(run)} >= {first, second}

    missing = verify(cloud, "restore-every", "every@20200101T000000.000Z-0badc0de")
    assert missing.code == 8 and "every@20200101T000000.000Z-0badc0de" in missing.stderr


def test_the_verify_roles_sign_as_themselves_and_hosts_need_only_to_start_and_follow(cloud: Emulator) -> None:
    from test_emulated_iam import as_key, refused

    from support.emulated_cloud import cached_stack
    from support.moto_stack import resources_of

    ref = backup(cloud, "iamverify", 6 * MiB, 7)
    # Hosts signing as their roles are checked request by request: the agent's role may start and follow a verify too.
    assert verify(cloud, "host-agent-iamverify", ref, "--deep").code == 0
    assert verify(cloud, "host-restore", ref).code == 0
    roles = {step: lid for lid in resources_of(cached_stack().template, "AWS::IAM::Role")
             for step in ("verifyplan", "verifyworker", "verifyrecord") if lid.startswith(f"Functions{step.capitalize()}Role")}
    callers = {r["caller"] for r in cloud.requests() if r["caller"].startswith("emulatedpipeline-")}
    assert {f"emulatedpipeline-{lid}" for lid in roles.values()} <= callers
    assert [r for r in cloud.requests() if "denied" in r] == []

    def s3(step: str) -> Any:
        return as_key(cloud, "s3", f"emulatedpipeline-{roles[step]}")

    chunk, record = chunk_key(ref, 0), cloud.keys(f"verify/{ref.replace('@', '/')}/")[0]
    # The worker reads and writes nothing: no record, no chunk, no deletion.
    assert refused(lambda: s3("verifyworker").put_object(Bucket=cloud.bucket, Key=record.replace(".json", "x.json"), Body=b"{}"))
    assert refused(lambda: s3("verifyworker").put_object(Bucket=cloud.bucket, Key="verify-runs/x/plan.json", Body=b"{}"))
    assert refused(lambda: s3("verifyworker").delete_object(Bucket=cloud.bucket, Key=chunk))
    # The recorder never reads backup data; the planner never writes a record.
    assert refused(lambda: s3("verifyrecord").get_object(Bucket=cloud.bucket, Key=chunk))
    assert refused(lambda: s3("verifyplan").put_object(Bucket=cloud.bucket, Key=record.replace(".json", "x.json"), Body=b"{}"))
    assert refused(lambda: s3("verifyplan").delete_object(Bucket=cloud.bucket, Key="verify-runs/x/plan.json"))
