"""docs/cloud.md's disaster-recovery runbook, run as written on the emulated cloud; and its idle-cost counts.

The runbook's commands (the ```sh blocks of "Restoring on a fresh host" and
"Upgrading") run in one bash script on a host that has nothing of Braid: a
new HOME, no config file, no BRAID_* variable, no key file, a venv made from
the wheel `scripts/build-wheel` builds (pip installs its dependencies, as on
a real host: PyPI or pip's cache). Only the placeholders change: the bucket,
the region and the paths become the emulator's and the test's. The
credentials the runbook tells the reader to get are the stack's restore
role: here the emulator's `host-restore` caller, whose every request is
checked against the RestoreRole's policies (support.emulated_iam).
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cloud"))

from test_emulated_e2e import CHUNK, Emulator, MiB, braid, stream_bytes  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]

CLOUD_DOC = ROOT / "docs" / "cloud.md"
RESTORE_CALLER = "host-restore"  # support.emulated_iam.RESTORE_KEY: signs as the stack's RestoreRole


def section(title: str) -> str:
    text = CLOUD_DOC.read_text()
    start = text.index(f"\n### {title}\n")
    end = text.find("\n##", start + 1)
    return text[start : end if end >= 0 else len(text)]


def sh_blocks(title: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", section(title), re.S)


def database_files() -> dict[str, bytes]:
    """What a base backup's tar holds, in small."""
    return {"base/PG_VERSION": b"15\n", "base/1/1259": stream_bytes(6 * MiB, 5), "global/pg_control": stream_bytes(8192, 6)}


def tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture(scope="module")
def published(cloud: Emulator) -> str:
    run = braid(cloud, "host-agent-pg", "backup", "--name", "pg", "--chunk-size", CHUNK, stdin=tar_of(database_files()))
    assert run.code == 0, run.stderr + cloud.tail()
    return run.stdout.strip()


def test_a_fresh_host_restores_with_the_runbook_commands_and_the_restore_role_alone(cloud: Emulator, published: str, tmp_path: Path) -> None:
    host = {"/tmp/braid-dist": tmp_path / "dist", "/opt/braid": tmp_path / "opt-braid", "/srv/restored": tmp_path / "restored"}
    script = "\n".join(sh_blocks("Restoring on a fresh host") + sh_blocks("Upgrading"))
    assert "scripts/build-wheel" in script and "pip install" in script and "braid restore" in script
    for placeholder, value in [*host.items(), ("s3://BUCKET", cloud.env["BRAID_REPO"]), ("REGION", cloud.env["AWS_DEFAULT_REGION"])]:
        script = re.sub(rf"(?<![\w/]){re.escape(placeholder)}(?![\w])", str(value), script)
    assert not re.search(r"(?<![\w$])[A-Z]{4,}(?![\w=])", re.sub(r"#.*", "", script)), script  # no placeholder left
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "AWS_ENDPOINT_URL": cloud.env["AWS_ENDPOINT_URL"],  # the emulator stands in for AWS's endpoints
        "AWS_ACCESS_KEY_ID": RESTORE_CALLER,  # the restore role's credentials, as the runbook says to get them
        "AWS_SECRET_ACCESS_KEY": "emulated",
    }
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr + cloud.tail()

    restored = host["/srv/restored"]
    assert {str(p.relative_to(restored)): p.read_bytes() for p in restored.rglob("*") if p.is_file()} == database_files()
    assert published in done.stdout  # `braid list` on the new host names the backup
    assert not list(home.rglob("*.key")) and not (home / ".config" / "braid" / "config.toml").exists()  # no key file, no config made
    restore_requests = cloud.requests(caller=RESTORE_CALLER)
    denied = [r for r in restore_requests if r["status"] == 403]  # a 404 (an optional object such as prices.json) is not a refusal
    assert restore_requests and denied == []
    assert any(r["op"] == "Decrypt" for r in restore_requests)  # the restore role unwrapped the data key itself


def test_the_restore_role_cannot_stage_a_backup(cloud: Emulator) -> None:
    """The runbook's role is the restore role: it reads; backing up is the agent's (a fresh host that should back up needs the
    agent role, tagged with its name)."""
    run = braid(cloud, RESTORE_CALLER, "backup", "--name", "pg", "--chunk-size", CHUNK, stdin=stream_bytes(MiB, 7))
    assert run.code != 0 and "access denied" in run.stderr


def template() -> dict[str, Any]:
    from support.emulated_cloud import cached_stack

    stack: dict[str, Any] = cached_stack().template
    return stack


def idle_rows() -> dict[str, tuple[int, str]]:
    """The idle-cost table of docs/cloud.md: item -> (count, per month)."""
    text = CLOUD_DOC.read_text()
    start = text.index("| item | count | per month |")
    rows = {}
    for line in text[start : text.index("\n\n", start)].splitlines()[2:]:
        item, count, cost = (c.strip() for c in line.strip("|").split("|"))
        if count.isdigit():
            rows[item] = (int(count), cost)
    return rows


def test_the_idle_cost_counts_are_the_templates() -> None:
    resources = list(template()["Resources"].values())

    def count(kind: str) -> int:
        return sum(1 for r in resources if r["Type"] == kind)

    def alarm_metrics(alarm: dict[str, Any]) -> int:
        metrics = alarm["Properties"].get("Metrics")
        return sum(1 for m in metrics if "MetricStat" in m) if metrics else 1

    rows = idle_rows()
    by_word = {word: next(v for k, v in rows.items() if word in k) for word in ("KMS keys", "alarm metrics", "dashboard")}
    assert by_word["KMS keys"][0] == count("AWS::KMS::Key")
    assert by_word["alarm metrics"][0] == sum(alarm_metrics(r) for r in resources if r["Type"] == "AWS::CloudWatch::Alarm")
    assert by_word["dashboard"][0] == count("AWS::CloudWatch::Dashboard")
    for item, (number, cost) in rows.items():
        each = re.search(r"\$([\d.]+) each", item)
        if each:  # the row's figure is its count at its unit price
            assert abs(number * float(each.group(1)) - float(cost.strip("$"))) < 0.005, item


def test_the_deployers_services_cover_every_resource_type_of_the_template() -> None:
    services = set(re.findall(r"^\| `([a-z0-9]+)` \|", section("What the deployer needs"), re.M))
    kinds = {r["Type"] for r in template()["Resources"].values()}
    named = {"CloudWatch": "cloudwatch", "Logs": "logs", "S3": "s3", "KMS": "kms", "IAM": "iam", "Lambda": "lambda",
             "StepFunctions": "states", "Events": "events", "SNS": "sns", "Scheduler": "scheduler", "SSM": "ssm", "SQS": "sqs"}
    needed = {named[kind.split("::")[1]] for kind in kinds}
    assert needed <= services, needed - services


DR_BUCKET = "braid-dr-copy"
DR_CALLER = "dr-operator"  # stands in for the second stack's roles: the emulator checks only the primary stack's


def test_a_lost_region_is_restored_from_the_copy_the_scheduled_copy_function_made(
    cloud: Emulator, published: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """"A lost region or account": the second repository (`braid init ... --kms-key`), the Copy function
    (functions/copy, in-process against the emulator's S3 and KMS) copying the published backup there, and the
    runbook's restore-from-the-copy commands on a host with no config, no key file and no BRAID_* variable."""
    import importlib.util

    import boto3

    from braid.adapters.aws import lambda_env
    from braid.contract import COPY_MEMORY_MB, ENV_BUCKET, ENV_COPY_KMS_KEY, ENV_COPY_TO, ENV_KMS_KEY_ID

    endpoint, region = cloud.env["AWS_ENDPOINT_URL"], cloud.env["AWS_DEFAULT_REGION"]
    session = boto3.Session(aws_access_key_id=DR_CALLER, aws_secret_access_key="emulated", region_name=region)
    session.client("s3", endpoint_url=endpoint).create_bucket(Bucket=DR_BUCKET)
    dr_key = session.client("kms", endpoint_url=endpoint).create_key(Description="braid DR")["KeyMetadata"]["Arn"]
    made = braid(cloud, DR_CALLER, "init", "--repo", f"s3://{DR_BUCKET}", "--engine", "local", "--kms-key", dr_key)
    assert made.code == 0, made.stderr

    source_bucket = cloud.env["BRAID_REPO"].removeprefix("s3://").split("/")[0]
    config = json.loads(session.client("s3", endpoint_url=endpoint).get_object(Bucket=source_bucket, Key="config.json")["Body"].read())
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": region, "AWS_REGION": region, "AWS_ACCESS_KEY_ID": DR_CALLER,
        "AWS_SECRET_ACCESS_KEY": "emulated", "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_METRICS_DISABLED": "true",
        ENV_BUCKET: source_bucket, ENV_KMS_KEY_ID: config["key"]["key_id"], ENV_COPY_TO: f"s3://{DR_BUCKET}", ENV_COPY_KMS_KEY: dr_key,
    }.items():
        monkeypatch.setenv(name, value)
    caches = (lambda_env._s3, lambda_env._kms, lambda_env._events)
    for cached in caches:
        cached.cache_clear()
    spec = importlib.util.spec_from_file_location("braid_copy_dr", ROOT / "functions" / "copy" / "app.py")
    assert spec is not None and spec.loader is not None
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)

    class Context:
        function_name, memory_limit_in_mb, aws_request_id = "Braid-Copy", COPY_MEMORY_MB, "dr"
        invoked_function_arn = f"arn:aws:lambda:{region}:123456789012:function:Braid-Copy"

        def get_remaining_time_in_millis(self) -> int:
            return 800_000

    try:
        run = app.handler({"prefix": ""}, Context())
        again = app.handler({"prefix": ""}, Context())
    finally:
        for cached in caches:  # no later test gets clients of this emulator
            cached.cache_clear()
    assert run["ok"] and run["copied"] == [published], run
    assert again["ok"] and again["pending"] == 0 and again["copied"] == []

    (block,) = [b for b in sh_blocks("A lost region or account") if "braid restore" in b]
    restored = tmp_path / "restored-dr"
    script = block.replace("/opt/braid/bin/braid", str(ROOT / ".venv" / "bin" / "braid"))
    for placeholder, value in [("s3://DR_BUCKET", f"s3://{DR_BUCKET}"), ("DR_REGION", region), ("/srv/restored", str(restored))]:
        script = re.sub(rf"(?<![\w/]){re.escape(placeholder)}(?![\w])", value, script)
    assert not re.search(r"(?<![\w$])[A-Z]{4,}(?![\w=])|DR_", re.sub(r"#.*", "", script)), script  # no placeholder left
    home = tmp_path / "dr-home"
    home.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "AWS_ENDPOINT_URL": endpoint,
           "AWS_ACCESS_KEY_ID": DR_CALLER, "AWS_SECRET_ACCESS_KEY": "emulated"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr + cloud.tail()
    assert published in done.stdout
    assert {str(p.relative_to(restored)): p.read_bytes() for p in restored.rglob("*") if p.is_file()} == database_files()
