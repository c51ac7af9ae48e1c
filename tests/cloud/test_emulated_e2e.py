"""End to end on the emulated cloud: the real agent CLI against `scripts/emulated-aws`.

The emulator runs as its own process (moto server on loopback, the stack
created from the CDK-synthesized template, handlers in-process) and prints
the environment the agent needs; `.venv/bin/braid` then runs as a separate
process with only that environment, as on a database host. The emulator's
request log (one JSON line per request it answered) is how the tests see
what went over the wire: parts uploaded, SlowDown retries, failed Lambda
invocations, and every request the agent and restore made, which is checked
against the stack's own IAM policies (moto does not enforce IAM).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from braid.agent.limits import DEFAULT_CONCURRENCY, default_concurrency, default_part_chunks, default_ramp_parts, default_segment_chunks
from braid.agent.segments import PartLayout
from support.signals import default_dispositions

ROOT = Path(__file__).resolve().parents[2]
EMULATOR = ROOT / "scripts" / "emulated-aws"
BRAID = ROOT / ".venv" / "bin" / "braid"
MiB = 1024**2
CHUNK = "5MiB"  # S3's minimum part size: the smallest chunk of a multi-part segment

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]


# -- the emulator -------------------------------------------------------------------


class Emulator:
    """`scripts/emulated-aws` as a subprocess; its exports, request log and logs."""

    def __init__(self, workdir: Path, *options: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.request_log = workdir / "requests.jsonl"
        self.log = workdir / "emulator.log"
        with open(self.log, "wb") as stderr:
            self.proc = subprocess.Popen(
                [str(EMULATOR), "--exit-with-parent", "--request-log", str(self.request_log), *options],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env={k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BRAID_"))},
                start_new_session=True,
            )
        self.env = self._read_exports(timeout=240)

    def _read_exports(self, timeout: float) -> dict[str, str]:
        out: list[bytes] = []
        reader = threading.Thread(target=lambda: out.append(self.proc.stdout.read() if self.proc.stdout else b""), daemon=True)
        reader.start()
        reader.join(timeout)
        if reader.is_alive() or not out:
            self.stop()
            raise AssertionError(f"emulator not ready after {timeout} s:\n{self.tail()}")
        env = {}
        for line in out[0].decode().splitlines():
            words = shlex.split(line)
            assert len(words) == 2 and words[0] == "export" and "=" in words[1], f"unexpected stdout line {line!r}:\n{self.tail()}"
            name, _, value = words[1].partition("=")
            env[name] = value
        assert set(env) == {"AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "BRAID_REPO"}, (env, self.tail())
        return env

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()

    # -- what the server saw ----------------------------------------------------------

    def requests(self, **match: Any) -> list[dict[str, Any]]:
        records = [json.loads(line) for line in self.request_log.read_text().splitlines() if line.strip()]
        return [r for r in records if all(r.get(k) == v for k, v in match.items())]

    # -- clients ------------------------------------------------------------------------

    @property
    def bucket(self) -> str:
        return self.env["BRAID_REPO"].removeprefix("s3://").partition("/")[0]

    def client(self, service: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=self.env["AWS_ENDPOINT_URL"],
            region_name=self.env["AWS_DEFAULT_REGION"],
            aws_access_key_id="test-inspector",
            aws_secret_access_key="test",
        )

    def keys(self, prefix: str) -> list[str]:
        pages = self.client("s3").get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def open_uploads(self, prefix: str = "") -> list[str]:
        return [u["Key"] for u in self.client("s3").list_multipart_uploads(Bucket=self.bucket, Prefix=prefix).get("Uploads", [])]

    def config(self) -> dict[str, Any]:
        return json.loads(self.client("s3").get_object(Bucket=self.bucket, Key="config.json")["Body"].read())

    # -- the agent ------------------------------------------------------------------------

    def braid_env(self, caller: str) -> dict[str, str]:
        """The emulator's exports, and nothing else of AWS; `caller` names the requests in the log."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BRAID_"))}
        env.update(self.env)
        env["AWS_ACCESS_KEY_ID"] = caller
        return env


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def errors(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("braid: ")]

    @property
    def summary(self) -> dict[str, Any]:
        """`backup --json`'s stdout: one JSON document (NAME@ID is its `backup`)."""
        document: dict[str, Any] = json.loads(self.stdout)
        return document

    def events(self, kind: str) -> list[dict[str, Any]]:
        found = []
        for line in self.stderr.splitlines():
            if line.startswith("{"):
                event = json.loads(line)
                if event.get("event") == kind:
                    found.append(event)
        return found


def braid(emulator: Emulator, caller: str, *args: str, stdin: bytes = b"", timeout: float = 180) -> Run:
    proc = subprocess.run([str(BRAID), *args], env=emulator.braid_env(caller), input=stdin, capture_output=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode())



@pytest.fixture
def start_emulator(tmp_path: Path) -> Iterator[Callable[..., Emulator]]:
    """A fresh emulator for a scenario with faults; torn down after the test."""
    started: list[Emulator] = []

    def start(*options: str) -> Emulator:
        emulator = Emulator(tmp_path / f"emulator-{len(started)}", *options)
        started.append(emulator)
        return emulator

    yield start
    for emulator in started:
        emulator.stop()


# -- streams ----------------------------------------------------------------------------


def stream_bytes(size: int, seed: int) -> bytes:
    """Half random, half a repeated row: compressible, and distinct per input."""
    rng = random.Random(seed)
    row = f"row {seed:04d} of a table; ".encode()
    half = size // 2
    return (rng.randbytes(half) + row * ((size - half) // len(row) + 1))[:size]


class PipeWriter(threading.Thread):
    """Feeds a named pipe as a database tool does; `pause_after` stops mid-stream until released."""

    def __init__(self, path: Path, data: bytes, pause_after: int | None = None) -> None:
        super().__init__(daemon=True)
        if not path.exists():
            os.mkfifo(path)
        self.path, self.data, self.pause_after = path, data, pause_after
        self.release = threading.Event()
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            with open(self.path, "wb") as pipe:
                cut = len(self.data) if self.pause_after is None else self.pause_after
                pipe.write(self.data[:cut])
                pipe.flush()
                if cut < len(self.data):
                    self.release.wait(120)
                    return  # the reader was killed: stop, as the database tool would
                pipe.write(self.data[cut:])
        except BrokenPipeError:
            pass
        except BaseException as exc:  # pragma: no cover - reported by finish()
            self.error = exc

    def finish(self) -> None:
        self.release.set()
        self.join(30)
        assert not self.is_alive(), f"writer of {self.path} is stuck"
        assert self.error is None, self.error


class PipeReader(threading.Thread):
    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        os.mkfifo(path)
        self.path = path
        self.data = b""
        self.start()

    def run(self) -> None:
        with open(self.path, "rb") as pipe:
            self.data = pipe.read()


def backup_pipes(emulator: Emulator, tmp: Path, caller: str, name: str, inputs: list[bytes], *extra: str) -> Run:
    """`braid backup` of `inputs` through named pipes, fed concurrently."""
    writers = [PipeWriter(tmp / f"{name}-in{i}", data) for i, data in enumerate(inputs)]
    args = ["backup", "--name", name, "--chunk-size", CHUNK, "--json", *extra]
    for writer in writers:
        args += ["--input", str(writer.path)]
    run = braid(emulator, caller, *args)
    for writer in writers:
        writer.release.set()
        writer.join(30)
    return run


def restore_two(emulator: Emulator, tmp: Path, caller: str, ref: str) -> list[bytes]:
    """Restore a two-input backup: the first input to a named pipe, the second to a file."""
    reader = PipeReader(tmp / f"restore-{ref.replace('@', '_')}-0")
    target = tmp / f"restore-{ref.replace('@', '_')}-1"
    run = braid(emulator, caller, "restore", ref, "--output", str(reader.path), "--output", str(target))
    reader.join(60)
    assert run.code == 0, run.stderr
    return [reader.data, target.read_bytes()]


def chunks_of(sizes: list[int], chunk: int = 5 * MiB) -> int:
    return sum(-(-size // chunk) for size in sizes)


def parts_of(sizes: list[int], chunk: int = 5 * MiB, concurrency: int | None = None) -> int:
    """Staging parts the agent sends at its defaults: each input's first segment starts with the ramp's one-chunk
    parts, then `default_part_chunks` chunks each (a segment's last may hold fewer)."""
    concurrency = concurrency or default_concurrency(len(sizes))  # the agent's default for that many inputs
    per_part, per_segment = default_part_chunks(chunk, len(sizes), concurrency), default_segment_chunks(chunk)
    ramp = default_ramp_parts(per_part, per_segment)
    parts = 0
    for size in sizes:
        chunks = -(-size // chunk)
        for first in range(0, chunks, per_segment):
            parts += PartLayout(per_part, ramp if first == 0 else 0).parts(min(per_segment, chunks - first))
    return parts


# -- IAM: every request of a role's commands, allowed by the stack's policy for it -----


S3_ACTIONS = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "ListParts": "s3:ListMultipartUploadParts",
    "DeleteObject": "s3:DeleteObject",
    "ListObjects": "s3:ListBucket",
    "ListMultipartUploads": "s3:ListBucketMultipartUploads",
}
BUCKET_LEVEL = {"ListObjects", "ListMultipartUploads"}


def stack_policies(emulator: Emulator) -> dict[str, list[dict[str, Any]]]:
    """The agent's managed policy and the restore role's policy, rendered for the emulated resources."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support.cfn_render import Resolver
    from support.emulated_cloud import cached_stack
    from support.moto_stack import data_key_id, machine_kind, resources_of

    template = cached_stack().template
    config = emulator.config()
    machine, key = config["cloud"]["state_machine_arn"], config["key"]["key_id"]
    resolver = Resolver()
    (bucket_id,) = [lid for lid in resources_of(template, "AWS::S3::Bucket") if lid.startswith("StorageRepository")]
    resolver.refs[bucket_id] = emulator.bucket
    resolver.attributes[(bucket_id, "Arn")] = f"arn:aws:s3:::{emulator.bucket}"
    key_id = data_key_id(template)
    resolver.attributes[(key_id, "Arn")] = key
    arns = {"Backup": machine, "Verify": config["cloud"]["verify_state_machine_arn"]}  # the host policies name no other
    for machine_id in resources_of(template, "AWS::StepFunctions::StateMachine"):
        arn = arns.get(machine_kind(machine_id))
        if arn is None:
            continue
        resolver.refs[machine_id] = arn
        resolver.attributes[(machine_id, "Name")] = arn.rpartition(":")[2]
    policies = {}
    for lid, resource in template["Resources"].items():
        if lid.startswith("AccessAgentPolicy") and resource["Type"] == "AWS::IAM::ManagedPolicy":
            policies["agent"] = resolver.render(resource["Properties"]["PolicyDocument"])["Statement"]
        if lid.startswith("AccessRestoreRoleDefaultPolicy") and resource["Type"] == "AWS::IAM::Policy":
            policies["restore"] = resolver.render(resource["Properties"]["PolicyDocument"])["Statement"]
    assert set(policies) == {"agent", "restore"}, "the stack's host policies were not found"
    return policies


def allowed(statements: list[dict[str, Any]], action: str, resource: str, context: dict[str, Any]) -> bool:
    """IAM's decision on the identity policy alone (support.iam_policy, the evaluator the emulator enforces with)."""
    from support.iam_policy import ALLOW, Request, evaluate

    return evaluate(Request("arn:aws:iam::123456789012:role/host", action, resource, context), statements) == ALLOW


def request_permission(record: dict[str, Any], bucket: str, key_arn: str) -> tuple[str, str, dict[str, Any]]:
    service, op = record["service"], record["op"]
    if service == "s3":
        if op not in S3_ACTIONS:
            raise AssertionError(f"unmapped S3 request {record}")
        resource = f"arn:aws:s3:::{bucket}" if op in BUCKET_LEVEL else f"arn:aws:s3:::{bucket}/{record['key']}"
        return S3_ACTIONS[op], resource, {"s3:prefix": record["prefix"]} if "prefix" in record else {}
    if service == "states" and op in ("StartExecution", "DescribeExecution"):
        return f"states:{op}", record.get("stateMachineArn") or record["executionArn"], {}
    if service == "states" and op == "SendTaskSuccess":  # the wake (braid.agent.wake): authorized by its token, on no resource
        return "states:SendTaskSuccess", "*", {}
    if service == "kms" and op == "Decrypt":
        context = {f"kms:EncryptionContext:{k}": "present" for k in record.get("context", [])}
        return "kms:Decrypt", record.get("KeyId") or key_arn, context
    raise AssertionError(f"unmapped request {record}")


def host_tag(records: list[dict[str, Any]]) -> str:
    """The `braid-name` a host must be tagged with: the one backup name whose staging it wrote."""
    names = {r["key"].split("/")[1] for r in records if r.get("op") in ("PutObject", "UploadPart") and r.get("key", "").startswith("staging/")}
    assert len(names) <= 1, f"one host staged several names: {sorted(names)}"
    return names.pop() if names else "none"


def assert_within_policy(emulator: Emulator, caller: str, role: str) -> None:
    """Every request `caller` made is allowed by the stack's `role` policy (an agent tagged with the name it staged)."""
    statements = stack_policies(emulator)[role]
    key_arn = emulator.config()["key"]["key_id"]
    records = emulator.requests(caller=caller)
    assert records, f"no requests from {caller}"
    tag = {"aws:PrincipalTag/braid-name": host_tag(records)} if role == "agent" else {}
    denied = []
    for record in records:
        action, resource, context = request_permission(record, emulator.bucket, key_arn)
        context = {**tag, **context}
        if not allowed(statements, action, resource, context):
            denied.append(f"{action} on {resource} ({record['op']})")
    assert not denied, f"the {role} policy would deny:\n" + "\n".join(sorted(set(denied)))


def staged_parts(emulator: Emulator, prefix: str, status: int | None = 200, since: float = 0) -> list[tuple[str, int]]:
    return [
        (r["key"], r["part"])
        for r in emulator.requests(op="UploadPart")
        if r["key"].startswith(prefix) and (status is None or r["status"] == status) and r["t"] >= since
    ]


def ref_prefix(ref: str) -> str:
    name, _, backup_id = ref.partition("@")
    return f"staging/{name}/{backup_id}/"


# -- tests -------------------------------------------------------------------------------


def test_two_pipes_back_up_and_restore_identically_and_list_show_verify_work(cloud: Emulator, tmp_path: Path) -> None:
    inputs = [stream_bytes(23 * MiB + 4321, 1), stream_bytes(7 * MiB + 17, 2)]

    run = backup_pipes(cloud, tmp_path, "agent-pipes", "pg", inputs)

    assert run.code == 0, run.stderr
    ref = run.summary["backup"]
    assert ref.startswith("pg@") and run.errors == []
    done = run.events("done")[-1]
    assert (done["plaintext_bytes"], done["chunks"], done["inputs"]) == (sum(map(len, inputs)), chunks_of(list(map(len, inputs))), 2)
    assert restore_two(cloud, tmp_path, "restore-pipes", ref) == inputs

    listed = braid(cloud, "restore-pipes", "list", "--json")
    assert listed.code == 0, listed.stderr
    assert ref in [row["backup"] for row in json.loads(listed.stdout)]
    shown = braid(cloud, "restore-pipes", "show", ref, "--json")
    assert shown.code == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert [i["bytes"] for i in detail["input_details"]] == list(map(len, inputs))
    assert detail["engine"] == "stepfunctions" and detail["key_id"] == cloud.config()["key"]["key_id"]
    verified = braid(cloud, "restore-pipes", "verify", ref, "--deep")
    assert verified.code == 0 and "ok (deep" in verified.stdout, verified.stdout + verified.stderr

    # Published, and nothing raw left behind.
    assert cloud.keys(ref_prefix(ref)) == [] and cloud.open_uploads(ref_prefix(ref)) == []
    assert sorted(set(staged_parts(cloud, ref_prefix(ref)))) == sorted(staged_parts(cloud, ref_prefix(ref)))  # each part sent once
    assert_within_policy(cloud, "agent-pipes", "agent")
    assert_within_policy(cloud, "restore-pipes", "restore")
    # The agent's every request went through its light client (no botocore: its start-up), restore's through botocore.
    agent = cloud.requests(caller="agent-pipes")
    assert {r["service"] for r in agent} >= {"s3", "states"} and {r["client"] for r in agent} == {"light"}
    assert {r["client"] for r in cloud.requests(caller="restore-pipes")} == {"botocore"}


def test_backup_of_stdin_needs_nothing_but_the_exported_environment(cloud: Emulator) -> None:
    data = stream_bytes(3 * MiB + 5, 12)

    run = braid(cloud, "agent-stdin", "backup", "--name", "plain", stdin=data)

    assert run.code == 0, run.stderr
    ref = run.stdout.strip()
    restored = subprocess.run([str(BRAID), "restore", ref], env=cloud.braid_env("restore-stdin"), capture_output=True, timeout=120)
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout == data
    assert_within_policy(cloud, "agent-stdin", "agent")


def test_no_wait_returns_once_staged_and_status_follows_to_completion(cloud: Emulator, tmp_path: Path) -> None:
    data = stream_bytes(11 * MiB, 3)
    source = tmp_path / "dump.bin"
    source.write_bytes(data)

    staged = braid(cloud, "agent-nowait", "backup", "--name", "nowait", "--input", str(source), "--chunk-size", CHUNK, "--no-wait")

    assert staged.code == 0, staged.stderr
    ref = staged.stdout.strip()
    assert f"braid status {ref}" in staged.stderr
    once = braid(cloud, "agent-nowait", "status", ref, "--once", "--json")
    assert once.code == 0, once.stderr
    assert json.loads(once.stdout)["status"] in ("RUNNING", "SUCCEEDED")
    followed = braid(cloud, "agent-nowait", "status", "nowait@latest")  # the newest backup of the name, still without a manifest
    assert followed.code == 0, followed.stderr
    assert followed.stdout.strip() == ref
    final = json.loads(braid(cloud, "agent-nowait", "status", "nowait@latest", "--once", "--json").stdout)
    assert (final["backup"], final["status"], final["chunks_done"]) == (ref, "SUCCEEDED", 3)
    unknown = braid(cloud, "agent-nowait", "status", "nowiat@latest", "--once")
    assert (unknown.code, unknown.errors) == (8, [f"braid: error: no backups named 'nowiat' in {cloud.env['BRAID_REPO']} (did you mean nowait?)"])
    restored = tmp_path / "restored.bin"
    assert braid(cloud, "restore-nowait", "restore", ref, "--output", str(restored)).code == 0
    assert restored.read_bytes() == data
    assert_within_policy(cloud, "agent-nowait", "agent")


def test_an_agent_killed_mid_upload_resumes_without_resending_finished_parts(cloud: Emulator, tmp_path: Path) -> None:
    inputs = [stream_bytes(27 * MiB + 99, 4), stream_bytes(8 * MiB, 5)]
    # Parts of 2 chunks (two inputs at --concurrency 8), after a ramp of one-chunk parts over each input's first
    # segment (braid.agent.limits.default_ramp_parts): these short inputs go out one chunk per part. Each writer
    # stops after whole chunks, so exactly those parts are uploaded before the kill: input 0's first three,
    # input 1's first. The resumed run, at the default --concurrency, keeps the session's layout.
    assert default_part_chunks(5 * MiB, 2, 8) == 2 and default_ramp_parts(2, default_segment_chunks(5 * MiB)) >= chunks_of([len(i) for i in inputs])
    first = [PipeWriter(tmp_path / "in0", inputs[0], pause_after=15 * MiB), PipeWriter(tmp_path / "in1", inputs[1], pause_after=5 * MiB)]
    args = ["backup", "--name", "resumed", "--chunk-size", CHUNK, "--json", "--concurrency", "8", "--input", str(first[0].path), "--input", str(first[1].path)]
    agent = subprocess.Popen([str(BRAID), *args], env=cloud.braid_env("agent-resume"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(staged_parts(cloud, "staging/resumed/")) < 4:
        assert agent.poll() is None, agent.communicate()
        assert time.monotonic() < deadline, "the agent did not upload the first parts"
        time.sleep(0.05)
    agent.send_signal(signal.SIGKILL)
    _, killed_stderr = agent.communicate(timeout=30)
    killed_at = time.time()
    for writer in first:
        writer.finish()
    (session,) = [r["key"] for r in cloud.requests(caller="agent-resume", op="PutObject") if r["key"].endswith("/session.json")]
    _, name, backup_id, _ = session.split("/")
    ref = f"{name}@{backup_id}"
    # The agent named the backup as soon as it existed: what --resume needs survives a SIGKILL.
    started = [e for e in (json.loads(line) for line in killed_stderr.decode().splitlines() if line.startswith("{")) if e.get("event") == "started"]
    assert [(e["backup"], e["resumed"]) for e in started] == [(ref, False)]
    assert started[0]["message"] == f"braid: backup {ref} started; if interrupted, continue with 'braid backup --resume {ref} ...'"
    # The agent kept a lease in staging while it uploaded: retention sees it alive
    # between completed segments (S3 lists nothing for parts in progress).
    leases = [r for r in cloud.requests(caller="agent-resume", op="PutObject") if r["key"] == f"staging/{name}/{backup_id}/lease"]
    assert leases, "the agent wrote no lease in its staging area"
    # Until it is resumed it is an incomplete backup, listed with the way back in.
    listed = braid(cloud, "agent-list", "list", "--incomplete", "--json")
    assert listed.code == 0, listed.stderr
    (found,) = [row for row in json.loads(listed.stdout) if row["backup"] == ref]
    assert (found["state"], found["inputs"]) == ("uploading", [str(first[0].path), str(first[1].path)]) and "staging" in found["where"]
    assert found["hint"] == f"if its agent is gone, continue with 'braid backup --resume {ref}' and the same inputs"
    assert_within_policy(cloud, "agent-list", "agent")
    # The agent's memory bound is --concurrency chunk buffers: beyond the machine's memory it is refused up front.
    greedy = braid(cloud, "agent-list", "backup", "--name", "greedy", "--concurrency", "100000")
    assert greedy.code == 2 and greedy.errors[-1].startswith("braid: error: --concurrency 100000 with --chunk-size 64 MiB needs up to ")
    # So is a chunk size the pipeline's worker could not hold (its lanes hold ~5x the chunk each).
    huge = braid(cloud, "agent-list", "backup", "--name", "huge", "--chunk-size", "128MiB")
    assert huge.code == 2 and "--chunk-size 128 MiB is more than the cloud pipeline's worker can hold" in huge.errors[-1], huge.stderr
    assert "the largest allowed is 67 MiB" in huge.errors[-1]
    before = staged_parts(cloud, ref_prefix(ref))
    assert sorted(before) == [(f"{ref_prefix(ref)}in0/seg00000", n) for n in (1, 2, 3)] + [(f"{ref_prefix(ref)}in1/seg00000", 1)]

    again = [PipeWriter(tmp_path / "in0", inputs[0]), PipeWriter(tmp_path / "in1", inputs[1])]
    run = braid(cloud, "agent-resume", "backup", "--resume", ref, "--json", "--input", str(again[0].path), "--input", str(again[1].path))
    for writer in again:
        writer.finish()

    assert run.code == 0, run.stderr
    assert run.summary["backup"] == ref
    after = staged_parts(cloud, ref_prefix(ref), since=killed_at)
    assert not set(before) & set(after), f"finished parts sent again: {sorted(set(before) & set(after))}"
    assert len(before) + len(after) == parts_of(list(map(len, inputs)), concurrency=8)
    (end,) = run.events("stream-end")
    assert (end["parts_skipped"], end["parts_uploaded"]) == (4, len(after)) == (4, 4)  # input 0's last three parts, input 1's second
    assert restore_two(cloud, tmp_path, "restore-resume", ref) == inputs
    assert_within_policy(cloud, "agent-resume", "agent")


def test_an_interrupted_agent_says_how_to_resume(cloud: Emulator, tmp_path: Path) -> None:
    writer = PipeWriter(tmp_path / "in0", stream_bytes(22 * MiB, 13), pause_after=20 * MiB)  # one whole part of 4 chunks (the default)
    assert default_part_chunks(5 * MiB, 1, DEFAULT_CONCURRENCY) == 4
    args = ["backup", "--name", "interrupted", "--chunk-size", CHUNK, "--input", str(writer.path)]
    agent = subprocess.Popen([str(BRAID), *args], env=cloud.braid_env("agent-sigint"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_dispositions)
    deadline = time.monotonic() + 60
    while not staged_parts(cloud, "staging/interrupted/"):
        assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()
        time.sleep(0.05)

    agent.send_signal(signal.SIGINT)
    out, err = agent.communicate(timeout=60)
    writer.finish()

    (session,) = [r["key"] for r in cloud.requests(caller="agent-sigint", op="PutObject") if r["key"].endswith("/session.json")]
    ref = "{1}@{2}".format(*session.split("/"))
    assert agent.returncode == 130 and out == b""
    assert err.decode().splitlines()[-1] == (
        f"braid: interrupted; what was uploaded stays staged: continue with 'braid backup --resume {ref}' and the same inputs"
    )
    assert cloud.open_uploads(ref_prefix(ref)) != []  # kept for --resume


def test_resume_of_a_commands_backup_finishes_it_from_staging_once_staged_whole(cloud: Emulator, tmp_path: Path) -> None:
    """The command is not run again (it would make a new stream): a stream staged whole finishes from staging."""
    data = stream_bytes(11 * MiB, 5)
    (tmp_path / "dump.bin").write_bytes(data)
    command = ["--", "cat", str(tmp_path / "dump.bin")]
    staged = braid(cloud, "agent-cmdresume", "backup", "--name", "cmdresume", "--chunk-size", CHUNK, "--no-wait", *command)
    assert staged.code == 0, staged.stderr
    ref = staged.stdout.strip()
    (tmp_path / "dump.bin").write_bytes(b"not what was staged")  # resuming must not read the command's output again

    resumed = braid(cloud, "agent-cmdresume", "backup", "--resume", ref, *command)

    assert resumed.code == 0, resumed.stderr
    assert resumed.stdout.strip() == ref
    restored = tmp_path / "restored.bin"
    assert braid(cloud, "restore-cmdresume", "restore", ref, "--output", str(restored)).code == 0
    assert restored.read_bytes() == data


def test_resume_of_a_commands_backup_not_staged_whole_says_so_and_how_to_start_again(cloud: Emulator, tmp_path: Path) -> None:
    writer = PipeWriter(tmp_path / "in0", stream_bytes(22 * MiB, 17), pause_after=20 * MiB)
    args = ["backup", "--name", "cmdpartial", "--chunk-size", CHUNK, "--input", str(writer.path)]
    agent = subprocess.Popen([str(BRAID), *args], env=cloud.braid_env("agent-cmdpartial"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_dispositions)
    deadline = time.monotonic() + 60
    while not staged_parts(cloud, "staging/cmdpartial/"):
        assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()
        time.sleep(0.05)
    agent.send_signal(signal.SIGINT)
    agent.communicate(timeout=60)
    writer.finish()
    (session,) = [r["key"] for r in cloud.requests(caller="agent-cmdpartial", op="PutObject") if r["key"].endswith("/session.json")]
    ref = "{1}@{2}".format(*session.split("/"))

    refused = braid(cloud, "agent-cmdpartial", "backup", "--resume", ref, "--", "cat", "/dev/null")

    assert (refused.code, refused.errors) == (2, [
        f"braid: error: {ref} cannot be resumed: its command's stream was not staged whole (the stream ended before every byte was"
        " uploaded), and a command makes a new stream each run; start a new backup: braid backup --name cmdpartial -- COMMAND"
    ])


def test_a_worker_that_fails_once_is_retried_and_the_backup_succeeds(start_emulator: Callable[..., Emulator], tmp_path: Path) -> None:
    emulator = start_emulator("--fail-worker", "once")
    inputs = [stream_bytes(12 * MiB, 6), stream_bytes(3 * MiB, 7)]

    run = backup_pipes(emulator, tmp_path, "agent", "retried", inputs)

    assert run.code == 0, run.stderr + emulator.tail()
    invocations = [r for r in emulator.requests(op="Invoke") if "Worker" in r["function"]]
    assert len([r for r in invocations if "function_error" in r]) == 1
    assert len(invocations) >= 2
    assert restore_two(emulator, tmp_path, "restore", run.summary["backup"]) == inputs


def test_a_worker_that_always_fails_holds_the_backup_for_resume_and_says_so(start_emulator: Callable[..., Emulator], tmp_path: Path) -> None:
    emulator = start_emulator("--fail-worker", "always", "--fast-retries")
    inputs = [stream_bytes(6 * MiB, 8), stream_bytes(2 * MiB, 9)]

    run = backup_pipes(emulator, tmp_path, "agent", "doomed", inputs)

    assert run.code == 9, run.stderr + emulator.tail()
    assert run.stdout == ""
    assert len(run.errors) == 1 and run.stderr.rstrip().splitlines()[-1] == run.errors[0], run.stderr
    message = run.errors[0]
    ref = message.removeprefix("braid: error: backup ").split(" ", 1)[0]
    assert message.startswith(f"braid: error: backup {ref} is held: workers kept failing on "), message
    assert "Nothing finished is lost" in message and f"'braid backup --resume {ref}' and the same inputs" in message, message
    # Nothing published, nothing thrown away: the staged stream waits for the resume.
    assert emulator.keys("manifests/") == []
    assert any(k.endswith("held.json") for k in emulator.keys("staging/")) and any("/in0/seg" in k for k in emulator.keys("staging/"))
    failed = [r for r in emulator.requests(op="Invoke") if "Worker" in r["function"] and "function_error" in r]
    assert len(failed) >= 3 * 3  # an item's attempts, mapped once and planned again twice
    status = braid(emulator, "agent", "status", ref, "--once", "--json")
    assert status.code == 9 and status.errors == [message]
    assert json.loads(status.stdout)["status"] == "RUNNING"
    assert braid(emulator, "agent", "status", ref).errors == [message]


def test_abandon_of_a_held_backup_ends_its_execution_and_leaves_no_staging_version(start_emulator: Callable[..., Emulator], tmp_path: Path) -> None:
    emulator = start_emulator("--fail-worker", "always", "--fast-retries")
    held = backup_pipes(emulator, tmp_path, "agent", "given-up", [stream_bytes(6 * MiB, 21)])
    assert held.code == 9 and "is held" in held.stderr, held.stderr
    ref = held.errors[0].removeprefix("braid: error: backup ").split(" ", 1)[0]
    refused = braid(emulator, "agent", "backup", "--abandon", ref, "--name", "given-up")
    assert (refused.code, refused.errors) == (2, ["braid: error: --abandon takes the exact NAME@ID of a held backup, and nothing else to back up"])

    abandoned = braid(emulator, "agent", "backup", "--abandon", ref)

    assert abandoned.code == 0, abandoned.stderr + emulator.tail()
    assert f"{ref} abandoned" in abandoned.stderr
    name, _, backup_id = ref.partition("@")
    left = emulator.client("s3").list_object_versions(Bucket=emulator.bucket, Prefix=f"staging/{name}/{backup_id}/")
    assert left.get("Versions", []) + left.get("DeleteMarkers", []) == [] and emulator.open_uploads("staging/") == []
    assert emulator.keys("manifests/") == []
    status = braid(emulator, "agent", "status", ref, "--once", "--json")
    assert json.loads(status.stdout)["status"] == "FAILED" and "braid backup --abandon" in status.stderr, status.stdout + status.stderr
    again = braid(emulator, "agent", "backup", "--abandon", ref)
    assert again.code == 8, again.stderr  # nothing staged is left to abandon


def test_a_worker_failing_past_every_retry_holds_the_backup_and_resume_finishes_it_once_healed(
    start_emulator: Callable[..., Emulator], tmp_path: Path
) -> None:
    """--fail-worker first=12: the one item's 4 attempts (--fast-retries: 3 retries), mapped once and
    planned again twice, all fail. The map tolerates failed items (as on AWS, it then succeeds and reports
    them), so the pipeline holds the backup with what it finished instead of throwing it away
    (exit 9). The emulator then heals; --resume finishes the backup without sending a part again."""
    emulator = start_emulator("--fail-worker", "first=12", "--fast-retries")
    data = stream_bytes(3 * MiB, 14)  # one chunk: one item

    held = braid(emulator, "agent", "backup", "--name", "exhausted", "--chunk-size", CHUNK, stdin=data)

    assert held.code == 9, held.stderr + emulator.tail()
    message = held.errors[-1]
    ref = message.removeprefix("braid: error: backup ").split(" ", 1)[0]
    assert message.startswith(f"braid: error: backup {ref} is held: workers kept failing on ") and f"--resume {ref}" in message, message
    worker_calls = [r for r in emulator.requests(op="Invoke") if "Worker" in r["function"]]
    assert len(worker_calls) == 12 and all("function_error" in r for r in worker_calls)
    machine = emulator.config()["cloud"]["state_machine_arn"]
    sfn = emulator.client("stepfunctions")
    (execution,) = [e for e in sfn.list_executions(stateMachineArn=machine)["executions"] if e["name"] == ref]
    # The stream's one round and each re-plan ran as a Distributed Map run of its one item, whose failed worker ends in
    # ItemFailed (a success with no output: review 3, M1); the worker calls above all failed.
    history = [e for page in sfn.get_paginator("get_execution_history").paginate(executionArn=execution["executionArn"]) for e in page["events"]]
    entered = Counter(e["stateEnteredEventDetails"]["name"] for e in history if e["type"].endswith("StateEntered"))
    assert entered["ProcessChunks"] == 3, entered
    runs = [sfn.describe_map_run(mapRunArn=r["mapRunArn"]) for r in sfn.list_map_runs(executionArn=execution["executionArn"])["mapRuns"]]
    assert len(runs) == 3 and all(r["status"] == "SUCCEEDED" and r["itemCounts"]["total"] == 1 for r in runs), runs
    assert emulator.keys("manifests/") == [] and any(k.endswith("held.json") for k in emulator.keys("staging/"))
    held_at = time.time()

    resumed = braid(emulator, "agent", "backup", "--resume", ref, stdin=data)

    assert resumed.code == 0, resumed.stderr + emulator.tail()
    assert resumed.stdout.strip() == ref
    assert staged_parts(emulator, ref_prefix(ref), since=held_at) == []  # every part was already staged
    restored = subprocess.run([str(BRAID), "restore", ref], env=emulator.braid_env("restore"), capture_output=True, timeout=120)
    assert restored.returncode == 0 and restored.stdout == data
    assert emulator.keys("staging/") == []


def test_fail_worker_refuses_a_mode_it_does_not_know() -> None:
    for mode in ("twice", "first=0", "first=x"):
        done = subprocess.run([str(EMULATOR), "--fail-worker", mode], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "use once, always or first=K" in done.stderr, done.stderr


def test_slowdown_on_uploads_is_retried_and_the_backup_succeeds(start_emulator: Callable[..., Emulator], tmp_path: Path) -> None:
    emulator = start_emulator("--s3-slowdown", "3")
    inputs = [stream_bytes(16 * MiB, 10), stream_bytes(6 * MiB, 11)]

    run = backup_pipes(emulator, tmp_path, "agent", "throttled", inputs)

    assert run.code == 0, run.stderr + emulator.tail()
    ref = run.summary["backup"]
    throttled = staged_parts(emulator, ref_prefix(ref), status=503)
    stored = staged_parts(emulator, ref_prefix(ref))
    assert len(throttled) == 3
    assert set(throttled) <= set(stored)  # each throttled part was sent again and stored
    assert len(stored) == len(set(stored)) == parts_of(list(map(len, inputs)))
    assert restore_two(emulator, tmp_path, "restore", ref) == inputs


# -- stall detection measures upload progress -------------------------------------------------

STALL = 15  # --stall-timeout: the smallest the CLI allows (the planner's poll)
RATE_LIMIT = 512 * 1024  # --rate-limit 512KiB


def test_a_slow_agent_uploading_a_segment_for_longer_than_the_stall_window_is_not_declared_dead(cloud: Emulator) -> None:
    """16 MiB at 512 KiB/s is one segment (5 MiB chunks: 410 parts per segment) completed only after ~32 s,
    more than twice the 15 s stall window: no segment record appears inside it, only the agent's lease,
    renewed 4 times per window, shows the upload is alive."""
    data = stream_bytes(16 * MiB, 21)
    started = time.monotonic()

    run = braid(cloud, "agent-slow", "backup", "--name", "slow", "--chunk-size", CHUNK, "--rate-limit", "512KiB", "--stall-timeout", str(STALL), stdin=data)

    assert run.code == 0, run.stderr + cloud.tail()
    assert time.monotonic() - started >= 2 * STALL
    ref = run.stdout.strip()
    renewals = [r for r in cloud.requests(caller="agent-slow", op="PutObject") if r["key"] == f"{ref_prefix(ref)}lease"]
    assert len(renewals) >= 2 * 4, renewals  # every STALL / 4 seconds while uploading
    restored = subprocess.run([str(BRAID), "restore", ref], env=cloud.braid_env("restore-slow"), capture_output=True, timeout=120)
    assert restored.returncode == 0 and restored.stdout == data


def test_a_stopped_agent_is_declared_stalled_and_once_continued_stops_at_once_with_the_pipelines_cause(cloud: Emulator, tmp_path: Path) -> None:
    data = stream_bytes(16 * MiB, 22)
    args = ["backup", "--name", "frozen", "--chunk-size", CHUNK, "--rate-limit", "512KiB", "--stall-timeout", str(STALL)]
    stdout, stderr = open(tmp_path / "out", "wb+"), open(tmp_path / "err", "wb+")  # noqa: SIM115 - read after the agent exits
    agent = subprocess.Popen([str(BRAID), *args], env=cloud.braid_env("agent-frozen"), stdin=subprocess.PIPE, stdout=stdout, stderr=stderr)
    feeder = threading.Thread(target=lambda: _feed(agent, data), daemon=True)
    feeder.start()
    deadline = time.monotonic() + 60
    while not staged_parts(cloud, "staging/frozen/"):
        assert agent.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()
        time.sleep(0.05)
    (session,) = [r["key"] for r in cloud.requests(caller="agent-frozen", op="PutObject") if r["key"].endswith("/session.json")]
    ref = "{1}@{2}".format(*session.split("/"))

    agent.send_signal(signal.SIGSTOP)  # the host freezes: no part, no lease renewal
    try:
        sfn = cloud.client("stepfunctions")
        machine = cloud.config()["cloud"]["state_machine_arn"]
        deadline = time.monotonic() + 6 * STALL
        while True:
            (execution,) = [e for e in sfn.list_executions(stateMachineArn=machine)["executions"] if e["name"] == ref]
            if execution["status"] != "RUNNING" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        described = sfn.describe_execution(executionArn=execution["executionArn"])
        assert described["status"] == "FAILED", described
        assert "no new staged segment and no lease renewal from the agent" in described.get("cause", ""), described
    finally:
        agent.send_signal(signal.SIGCONT)
    continued = time.monotonic()
    try:
        agent.wait(timeout=240)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait(10)
        raise AssertionError(f"the agent kept going after the pipeline gave the backup up:\n{(tmp_path / 'err').read_text()[-4000:]}") from None
    feeder.join(10)
    out, err = (tmp_path / "out").read_bytes(), (tmp_path / "err").read_bytes()
    stdout.close()
    stderr.close()

    # At once: its watch's wait has long passed, and the parts in flight find their upload aborted (404 NoSuchUpload).
    # An agent that kept going would send the rest of the stream at its rate limit first: over half of it is left.
    assert time.monotonic() - continued < len(data) / 2 / RATE_LIMIT, err.decode()[-3000:]
    errors = [line for line in err.decode().splitlines() if line.startswith("braid: ")]
    assert agent.returncode == 9 and out == b"", err.decode()
    assert f"backup {ref}" in errors[-1] and "no new staged segment and no lease renewal" in errors[-1], errors
    assert cloud.keys("manifests/frozen/") == []


def _feed(agent: subprocess.Popen[bytes], data: bytes) -> None:
    assert agent.stdin is not None
    try:
        agent.stdin.write(data)
        agent.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the agent stopped reading: it was given up


# -- a coordinator's failure keeps finished work ----------------------------------------------------


def test_finalize_failing_holds_the_backup_and_resume_publishes_it_without_resending_or_reprocessing(
    start_emulator: Callable[..., Emulator], tmp_path: Path
) -> None:
    """--fail-finalize once: every chunk is stored, then Finalize fails (StorageError: not a Lambda error its
    Retry covers). The backup is held, not cleaned up: the agent stops naming the step and its error;
    --resume sends no part again, runs no worker again, and publishes it."""
    emulator = start_emulator("--fail-finalize", "once")
    data = stream_bytes(12 * MiB, 23)

    held = braid(emulator, "agent", "backup", "--name", "coordinator", "--chunk-size", CHUNK, stdin=data)

    assert held.code == 9, held.stderr + emulator.tail()
    message = held.errors[-1]
    ref = message.removeprefix("braid: error: backup ").split(" ", 1)[0]
    assert message.startswith(f"braid: error: backup {ref} is held: Finalize failed: StorageError: injected fault"), message
    assert f"'braid backup --resume {ref}' and the same inputs" in message, message
    assert emulator.keys("manifests/") == [] and any(k.endswith("held.json") for k in emulator.keys(ref_prefix(ref)))
    stored = emulator.keys(f"data/coordinator/{ref.partition('@')[2]}/")
    assert len(stored) == 3  # every chunk stored, and kept
    status = braid(emulator, "agent", "status", ref, "--once", "--json")
    assert status.code == 9 and json.loads(status.stdout)["status"] == "RUNNING", status
    assert status.errors == [message], "\n".join([*status.errors, message])
    workers = len([r for r in emulator.requests(op="Invoke") if "Worker" in r["function"]])
    held_at = time.time()

    resumed = braid(emulator, "agent", "backup", "--resume", ref, stdin=data)

    assert resumed.code == 0, resumed.stderr + emulator.tail()
    assert resumed.stdout.strip() == ref
    assert staged_parts(emulator, ref_prefix(ref), since=held_at) == []  # no part sent again
    assert len([r for r in emulator.requests(op="Invoke") if "Worker" in r["function"]]) == workers  # no chunk processed again
    restored = subprocess.run([str(BRAID), "restore", ref], env=emulator.braid_env("restore"), capture_output=True, timeout=120)
    assert restored.returncode == 0 and restored.stdout == data
    assert emulator.keys(ref_prefix(ref)) == []
