"""The fault suite on the emulated cloud: S3 faults on every request kind, agents killed, secrets kept.

One emulator for the module (`scripts/emulated-aws --fast-retries`, so a
pipeline past its retries fails in seconds), its S3 faults set per test
through its control endpoint (support.s3_faults): 500 InternalError, 503
SlowDown and connection resets, for the agent's requests and the in-process
Lambda handlers' alike.

- At 5%, plus the first request of every operation: a backup and its
  restore come out identical, and the faults really happened on every
  request kind a backup and a restore make.
- Past the retry budget (the pipeline's writes failing every time): exit 9,
  one clear line, nothing published, nothing staged.
- An agent SIGKILLed at random points (mid-upload, and while it waits for
  the pipeline), under 5% faults: `--resume` completes, and no part that
  S3 had stored is sent again.
- Security on what is really stored and logged: a planted marker is in no
  version of any object once the backup is published (staging is raw
  database bytes: it must be gone, versions included); nonces never repeat;
  the data key is in none of the handlers' Powertools logs nor the agent's
  and restore's --debug output.

The agent past its own retry budget (10 attempts with backoff up to 30 s: a
minute and more per request) is in `scripts/soak --cloud`, not here.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_emulated_e2e import BRAID, Emulator, Run, braid, chunks_of, parts_of, ref_prefix, staged_parts

from braid.format.chunk import ChunkHeader
from braid.format.keys import DataKey
from braid.format.manifest import open_manifest

MiB = 1024**2
CHUNK = "5MiB"
pytestmark = [pytest.mark.e2e, pytest.mark.cloud]

# What a backup and its restore do to S3, agent and pipeline together: each must have failed at least once.
REQUEST_KINDS = {
    "PutObject",
    "GetObject",
    "GetObject (ranged)",
    "HeadObject",
    "ListObjects",
    "CreateMultipartUpload",
    "UploadPart",
    "CompleteMultipartUpload",
    "ListMultipartUploads",
    "DeleteObjects",
}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    started = Emulator(tmp_path_factory.mktemp("faulty-cloud"), "--fast-retries")
    try:
        yield started
    finally:
        started.stop()


def faults(emulator: Emulator, **settings: Any) -> dict[str, Any]:
    """Set the emulator's S3 faults (POST), or read them and what was injected (no settings)."""
    url = emulator.env["AWS_ENDPOINT_URL"] + "/_emulator/s3-faults"
    request = urllib.request.Request(url, data=json.dumps(settings).encode() if settings else None, method="POST" if settings else "GET")
    with urllib.request.urlopen(request, timeout=30) as response:
        report: dict[str, Any] = json.loads(response.read())
    return report


@pytest.fixture(autouse=True)
def no_faults_after(emulator: Emulator) -> Iterator[None]:
    yield
    faults(emulator, rate=0.0)


def marked(marker: bytes, size: int, seed: int) -> bytes:
    """Random bytes (stored uncompressed) with the marker every 4 KiB, then the marker repeated with rows (compresses)."""
    rng = random.Random(seed)
    half = size // 2
    noisy = bytearray(rng.randbytes(half))
    for at in range(0, half - len(marker), 4096):
        noisy[at : at + len(marker)] = marker
    rows = b"".join(marker + f" row {i};".encode() for i in range((size - half) // 40 + 1))[: size - half]
    return bytes(noisy) + rows


def write_inputs(tmp: Path, inputs: list[bytes]) -> list[str]:
    paths = []
    for number, data in enumerate(inputs):
        path = tmp / f"input-{number}.bin"
        path.write_bytes(data)
        paths.append(str(path))
    return paths


def backup_files(emulator: Emulator, caller: str, name: str, paths: list[str], *extra: str) -> Run:
    return braid(emulator, caller, "backup", "--name", name, "--chunk-size", CHUNK, "--json", *[a for p in paths for a in ("--input", p)], *extra)


def restore_files(emulator: Emulator, caller: str, ref: str, tmp: Path, count: int, *extra: str) -> tuple[Run, list[bytes]]:
    targets = [tmp / f"restored-{ref.partition('@')[2]}-{n}.bin" for n in range(count)]
    run = braid(emulator, caller, "restore", ref, *[a for t in targets for a in ("--output", str(t))], *extra)
    return run, [t.read_bytes() if t.exists() else b"" for t in targets]


def nothing_staged(emulator: Emulator, ref: str) -> None:
    """No object, no version, no open upload left under the backup's staging prefix."""
    s3 = emulator.client("s3")
    versions = s3.list_object_versions(Bucket=emulator.bucket, Prefix=ref_prefix(ref))
    assert emulator.keys(ref_prefix(ref)) == [] and emulator.open_uploads(ref_prefix(ref)) == []
    assert versions.get("Versions", []) == [] and versions.get("DeleteMarkers", []) == []


# -- the fault controls --------------------------------------------------------------------


def test_fault_settings_that_make_no_sense_are_refused_at_start_and_at_runtime(emulator: Emulator, capsys: pytest.CaptureFixture[str]) -> None:
    from support.emulated_cloud import main

    assert main(["--s3-faults", "0.05", "--s3-fault-kinds", "500,timeout"]) == 2
    assert capsys.readouterr().err == "emulated-aws: error: fault kinds must be some of 500, 503, reset, not ['timeout']\n"
    assert main(["--s3-faults", "1.5"]) == 2
    assert capsys.readouterr().err == "emulated-aws: error: fault rate 1.5 is not in [0, 1]\n"
    with pytest.raises(urllib.error.HTTPError) as refused:
        faults(emulator, rate=0.5, callers="everyone")
    assert refused.value.code == 400
    assert json.loads(refused.value.read()) == {"error": "fault callers must be one of agent, pipeline, all"}
    assert faults(emulator)["settings"]["rate"] == 0.0  # the running settings were kept


# -- faults on every request kind -----------------------------------------------------------


@dataclass
class FaultedBackup:
    ref: str
    inputs: list[bytes]
    marker: bytes
    backup: Run
    restore: Run
    report: dict[str, Any]


@pytest.fixture(scope="module")
def faulted(emulator: Emulator, tmp_path_factory: pytest.TempPathFactory) -> FaultedBackup:
    """A two-input backup and its restore, through 5% S3 faults plus the first request of every kind."""
    tmp = tmp_path_factory.mktemp("faulted")
    marker = os.urandom(32)
    inputs = [marked(marker, 11 * MiB + 4321, 1), marked(marker, 6 * MiB + 17, 2)]
    paths = write_inputs(tmp, inputs)
    faults(emulator, rate=0.05, seed=11, callers="all", first_of_each=True)
    backup = backup_files(emulator, "agent-faults", "faulted", paths, "--debug")
    ref = backup.summary["backup"]  # --json: the summary document
    restore, restored = restore_files(emulator, "restore-faults", ref, tmp, 2, "--debug", "--json")
    report = faults(emulator)
    faults(emulator, rate=0.0)
    assert backup.code == 0, backup.stderr + emulator.tail()
    assert restore.code == 0, restore.stderr
    assert restored == inputs
    return FaultedBackup(ref, inputs, marker, backup, restore, report)


def test_a_backup_and_restore_through_s3_faults_on_every_request_kind_come_out_identical(emulator: Emulator, faulted: FaultedBackup) -> None:
    report = faulted.report

    assert REQUEST_KINDS <= set(report["by_op"]), f"not every request kind was failed: {sorted(report['by_op'])}"
    assert set(report["injected"]) == {"500", "503", "reset"} and report["total"] >= len(REQUEST_KINDS)
    faulted_requests = [r for r in emulator.requests() if "fault" in r]
    assert len(faulted_requests) == report["total"]
    callers = {r["caller"] for r in faulted_requests}
    assert callers >= {"agent-faults", "restore-faults"} and any(c.startswith("emulatedpipeline-") for c in callers), callers
    # The agent saw its faults as retries, and still published exactly its stream.
    retries = faulted.backup.events("retry")
    # (a HEAD has no body to carry an error code: its 500 or 503 is reported by status)
    assert retries and {e["reason"] for e in retries} <= {"InternalError", "SlowDown", "500", "503", "ConnectionClosedError"}, retries
    done = faulted.backup.events("done")[-1]
    assert (done["plaintext_bytes"], done["chunks"]) == (sum(map(len, faulted.inputs)), chunks_of(list(map(len, faulted.inputs))))
    stored = staged_parts(emulator, ref_prefix(faulted.ref))
    assert len(stored) == len(set(stored)) == parts_of(list(map(len, faulted.inputs)))  # each part stored once, faults or not
    nothing_staged(emulator, faulted.ref)
    verified = braid(emulator, "restore-faults", "verify", faulted.ref, "--deep")
    assert verified.code == 0, verified.stderr


def test_past_the_retry_budget_the_backup_fails_clearly_and_nothing_is_published_or_staged(emulator: Emulator, tmp_path: Path) -> None:
    paths = write_inputs(tmp_path, [os.urandom(7 * MiB)])
    faults(emulator, rate=1.0, callers="pipeline", ops=["PutObject"], kinds=["500", "503", "reset"])

    run = backup_files(emulator, "agent-doomed", "budget", paths)
    report = faults(emulator)

    assert (run.code, run.stdout) == (9, "")
    assert len(run.errors) == 1 and run.stderr.rstrip().splitlines()[-1] == run.errors[0], run.stderr
    message = run.errors[0]
    ref = message.removeprefix("braid: error: backup ").split(" ", 1)[0]
    assert message.startswith(f"braid: error: backup {ref} failed (StorageError): S3 kept "), message
    assert "after retries" in message and message.endswith(
        "Nothing was published. What to do: S3 kept refusing or failing requests; check the bucket and retry the backup"
    ), message
    assert report["total"] >= 5 and set(report["by_op"]) == {"PutObject"}  # every attempt of the first write, at least
    name, _, backup_id = ref.partition("@")
    assert emulator.keys(f"manifests/{name}/") == [] and emulator.keys(f"data/{name}/{backup_id}/") == []
    nothing_staged(emulator, ref)


# -- agents killed, under faults ---------------------------------------------------------


def staged_times(emulator: Emulator, prefix: str) -> list[tuple[tuple[str, int], float, float]]:
    """((segment key, part number), when the request began, when S3 held it) of every part S3 stored under `prefix`."""
    stored = [r for r in emulator.requests(op="UploadPart", status=200) if r["key"].startswith(prefix)]
    return [((r["key"], r["part"]), r["t"], r.get("done", r["t"])) for r in stored]


def wait_for_execution(emulator: Emulator, caller: str) -> str:
    """The final status of the execution the agent `caller` was watching."""
    arn = emulator.requests(caller=caller, op="DescribeExecution")[0]["executionArn"]
    client, deadline = emulator.client("stepfunctions"), time.monotonic() + 120
    while (status := client.describe_execution(executionArn=arn)["status"]) == "RUNNING":
        assert time.monotonic() < deadline, f"{arn} still running"
        time.sleep(0.2)
    return str(status)


def kill_point_reached(emulator: Emulator, caller: str, name: str, kind: str, when: int | str) -> bool:
    """("parts", k): k parts of the backup stored; ("waiting", _): the stream is staged whole (its stream-end
    record written) and the agent polls its execution. Its watch polls while it uploads too, so a poll alone
    could land the kill mid-upload."""
    if kind == "parts":
        return len(staged_parts(emulator, f"staging/{name}/")) >= int(when)
    ended = any(r["key"].endswith("/stream-end.json") and r.get("status") == 200 for r in emulator.requests(caller=caller, op="PutObject"))
    return ended and bool(emulator.requests(caller=caller, op="DescribeExecution"))


def kill_and_resume(emulator: Emulator, tmp: Path, caller: str, name: str, inputs: list[bytes], kind: str, when: int | str) -> bool:
    """Back up `inputs`, SIGKILL the agent at the kill point, `--resume`, and check the outcome
    (scripts/soak runs this at random points). Returns whether the kill landed."""
    paths = write_inputs(tmp, inputs)
    total = parts_of(list(map(len, inputs)))
    args = ["backup", "--name", name, "--chunk-size", CHUNK, "--json", *[a for p in paths for a in ("--input", p)]]
    agent = subprocess.Popen([str(BRAID), *args], env=emulator.braid_env(caller), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not kill_point_reached(emulator, caller, name, kind, when):
        if agent.poll() is not None:
            break
        assert time.monotonic() < deadline, f"the agent never reached {kind} {when}"
        time.sleep(0.02)
    agent.send_signal(signal.SIGKILL)
    out, killed_stderr = agent.communicate(timeout=30)
    killed = agent.returncode == -signal.SIGKILL
    assert killed or agent.returncode == 0, killed_stderr.decode()
    killed_at = time.time()
    (started,) = [json.loads(line) for line in killed_stderr.decode().splitlines() if line.startswith('{"') and '"started"' in line]
    ref = started["backup"]
    if when == "finished":
        assert wait_for_execution(emulator, caller) == "SUCCEEDED"

    resumed_at = time.time()
    run = braid(emulator, caller, "backup", "--resume", ref, "--json", *[a for p in paths for a in ("--input", p)])

    assert run.code == 0, run.stderr + emulator.tail()
    assert run.summary["backup"] == ref
    # Stored by the killed agent: every part whose request began before the kill. One in flight may
    # be stored after the kill: --resume must find it if S3 held it when the resume began; one S3
    # finished storing only after that is not there for the resume to find (as on S3), and sending
    # it again is right.
    stored = staged_times(emulator, ref_prefix(ref))
    before = {part for part, at, _done in stored if at < killed_at}
    visible = {part for part, at, done in stored if at < killed_at and done < resumed_at}
    after = staged_parts(emulator, ref_prefix(ref), since=killed_at)
    assert not visible & set(after), f"kill at {kind} {when}: stored parts sent again: {sorted(visible & set(after))}"
    assert len(before | set(after)) == total
    if kind == "waiting":
        assert after == [] and len(before) == total
        # Its stream was staged whole: the resumed agent writes nothing to staging (a lease or a resume request
        # written after Finalize removed the staging would stay there), it follows the pipeline.
        late = [r["key"] for r in emulator.requests(caller=caller, op="PutObject") if r["t"] >= resumed_at and r["key"].startswith(ref_prefix(ref))]
        assert late == [], late
    restore, restored = restore_files(emulator, f"restore-{caller}", ref, tmp, len(inputs))
    assert restore.code == 0 and restored == inputs, restore.stderr
    nothing_staged(emulator, ref)
    return killed


def test_an_agent_killed_at_random_points_resumes_without_resending_a_stored_part(emulator: Emulator, tmp_path: Path) -> None:
    """Killed mid-upload (after a random number of parts), while waiting for the pipeline, and
    while waiting with the pipeline then finishing alone: each --resume ends with the backup."""
    rng = random.Random(2026)
    inputs = [os.urandom(21 * MiB + 5), os.urandom(6 * MiB)]  # 5 and 2 chunks: 3 + 1 parts of 2 chunks
    points: list[tuple[str, int | str]] = [("parts", rng.randint(1, parts_of([len(d) for d in inputs]) - 2)), ("waiting", "running"), ("waiting", "finished")]
    faults(emulator, rate=0.05, seed=3, callers="agent")

    landed = [kill_and_resume(emulator, tmp_path, f"agent-kill-{n}", f"killed{n}", inputs, kind, when) for n, (kind, when) in enumerate(points)]

    assert landed == [True, True, True]
    assert faults(emulator)["total"] >= 1


# -- security -----------------------------------------------------------------------------


def test_no_version_of_any_object_holds_the_plaintext_once_published(emulator: Emulator, faulted: FaultedBackup) -> None:
    s3 = emulator.client("s3")
    carrying, seen = [], 0
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=emulator.bucket):
        for version in page.get("Versions", []):
            body = s3.get_object(Bucket=emulator.bucket, Key=version["Key"], VersionId=version["VersionId"])["Body"].read()
            seen += 1
            if faulted.marker in body or faulted.marker[:16] in body or faulted.marker[16:] in body:
                carrying.append((version["Key"], version["IsLatest"]))

    name, _, backup_id = faulted.ref.partition("@")
    assert seen >= len(emulator.keys(f"data/{name}/{backup_id}/")) + 2  # chunks, manifest, config at least
    assert carrying == [], f"plaintext stored in {carrying}"
    # Staging held the raw stream while the backup ran: it went, with every version and upload.
    assert [r for r in emulator.requests(caller="agent-faults", op="UploadPart", status=200) if r["key"].startswith(ref_prefix(faulted.ref))]
    nothing_staged(emulator, faulted.ref)


def test_nonces_never_repeat_within_a_cloud_backup(emulator: Emulator, faulted: FaultedBackup) -> None:
    name, _, backup_id = faulted.ref.partition("@")
    s3 = emulator.client("s3")
    keys = emulator.keys(f"data/{name}/{backup_id}/")
    # Every frame of every pack (where they are: the manifest's entries; the nonces, not the MAC, are under test).
    raw = s3.get_object(Bucket=emulator.bucket, Key=f"manifests/{name}/{backup_id}.json")["Body"].read()
    entries = list(open_manifest(raw, "manifest").manifest.chunks())
    packs = {key: s3.get_object(Bucket=emulator.bucket, Key=key)["Body"].read() for key in keys}
    nonces = {}
    for entry in entries:
        key = f"data/{name}/{backup_id}/{entry.pack:010d}"
        header, _ = ChunkHeader.unpack(packs[key][entry.pack_offset : entry.pack_offset + entry.stored_length], key)
        assert (header.backup, header.index) == (faulted.ref, entry.index)
        nonces[header.nonce] = entry.index
    assert len(entries) == chunks_of(list(map(len, faulted.inputs))) == len(nonces)
    assert sorted({f"data/{name}/{backup_id}/{e.pack:010d}" for e in entries}) == sorted(keys)  # every object is a pack of them


def json_documents(blob: bytes) -> list[dict[str, Any]]:
    """Every JSON object in the captured log. The in-process handlers run on
    several threads writing one stream, so two records can share a line."""
    text = blob.decode(errors="replace")
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    position = text.find("{")
    while position >= 0:
        try:
            doc, end = decoder.raw_decode(text, position)
        except ValueError:
            position = text.find("{", position + 1)
            continue
        if isinstance(doc, dict):
            found.append(doc)
        position = text.find("{", end)
    return found


def test_the_data_key_is_never_logged_by_the_pipeline_nor_printed_by_the_agent(emulator: Emulator, faulted: FaultedBackup) -> None:
    name, _, backup_id = faulted.ref.partition("@")
    raw = emulator.client("s3").get_object(Bucket=emulator.bucket, Key=f"manifests/{name}/{backup_id}.json")["Body"].read()
    wrapped = open_manifest(raw, faulted.ref).manifest.key
    material = emulator.client("kms").decrypt(CiphertextBlob=wrapped.ciphertext, EncryptionContext=wrapped.context, KeyId=wrapped.key_id)["Plaintext"]
    secrets = {"data key": material, "chunk encryption key": DataKey(material).encryption_key}
    logs = emulator.log.read_bytes()
    powertools = [doc for doc in json_documents(logs) if doc.get("service") == "braid"]

    # The capture is real: the handlers logged this backup, its retries included, through Powertools.
    # Log lines only: Powertools' metric documents carry the service too, and no message. The emulator runs every
    # handler in one process, so their invocations share Powertools' logger: one starting on another thread (the WAL
    # worker taking S3's test event) can replace a line's keys. A line of no backup may be this one's.
    lines = [doc for doc in powertools if "message" in doc]
    mine = [line for line in lines if line.get("backup") in (faulted.ref, None)]
    assert {line["message"] for line in mine} >= {"data key staged", "item stored", "backup published"}, sorted({line["message"] for line in mine})
    assert any("retrying in" in line["message"] for line in lines)
    for label, text in {"pipeline logs": logs, "agent": faulted.backup.stderr.encode(), "restore": faulted.restore.stderr.encode()}.items():
        for what, secret in secrets.items():
            b64 = base64.b64encode(secret)
            for form in (secret, secret.hex().encode(), secret.hex().upper().encode(), b64, b64.rstrip(b"="), base64.urlsafe_b64encode(secret).rstrip(b"=")):
                assert form not in text, f"the {what} appears in the {label}"
