"""IAM on the emulated cloud: every handler signs as its own role, and what a role may not do is refused.

The emulator (support.emulated_iam) renders the stack's roles, the bucket
policy and the key policy from the synthesized template and answers
AccessDenied as AWS would. These tests make requests with each role's
credentials, run the real agent as a host tagged for one backup name, and
read the request log to see that the handlers signed as their own roles.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cloud"))

from test_emulated_e2e import CHUNK, Emulator, MiB, braid, stream_bytes  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]



def role_ids() -> dict[str, str]:
    """step ("worker") -> the logical id of its role in the synthesized template."""
    from support.emulated_cloud import cached_stack
    from support.moto_stack import resources_of

    roles = resources_of(cached_stack().template, "AWS::IAM::Role")
    found = {}
    for lid in roles:
        for step in ("Prepare", "Plan", "Worker", "Finalize", "Cleanup", "Verify"):
            if lid.startswith(f"Functions{step}Role"):
                found[step.lower()] = lid
    return found


def as_key(cloud: Emulator, service: str, access_key: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=cloud.env["AWS_ENDPOINT_URL"],
        region_name=cloud.env["AWS_DEFAULT_REGION"],
        aws_access_key_id=access_key,
        aws_secret_access_key="emulated",
    )


def as_role(cloud: Emulator, service: str, step: str) -> Any:
    return as_key(cloud, service, f"emulatedpipeline-{role_ids()[step]}")


def refused(call: Any, code: str = "AccessDenied") -> bool:
    try:
        call()
    except ClientError as exc:
        return str(exc.response["Error"]["Code"]) == code
    return False


@pytest.fixture(scope="module")
def published(cloud: Emulator) -> str:
    """One backup through the whole pipeline, every handler checked against its role."""
    run = braid(cloud, "host-agent-iamdb", "backup", "--name", "iamdb", "--chunk-size", CHUNK, stdin=stream_bytes(7 * MiB, 21))
    assert run.code == 0, run.stderr + cloud.tail()
    return run.stdout.strip()


def test_each_handler_signs_as_its_own_role_and_nothing_it_needs_is_refused(cloud: Emulator, published: str) -> None:
    roles = role_ids()
    handler_callers = {r["caller"] for r in cloud.requests() if r["caller"].startswith("emulatedpipeline-")}
    for step in ("prepare", "plan", "worker", "finalize"):
        assert f"emulatedpipeline-{roles[step]}" in handler_callers, (step, handler_callers)
    # The worker's requests are its role's: its chunk writes carry its key.
    name, backup_id = published.split("@")
    chunk_writes = [r for r in cloud.requests(op="PutObject") if r["key"].startswith(f"data/{name}/{backup_id}/")]
    assert chunk_writes and {r["caller"] for r in chunk_writes} == {f"emulatedpipeline-{roles['worker']}"}
    # The host staged under its tag, and neither it nor any handler met a refusal.
    assert [r for r in cloud.requests() if "denied" in r] == []


def test_a_role_is_refused_what_its_policy_does_not_grant(cloud: Emulator, published: str) -> None:
    bucket = cloud.bucket
    name, backup_id = published.split("@")
    manifest = f"manifests/{name}/{backup_id}.json"
    worker_s3 = as_role(cloud, "s3", "worker")
    # The worker writes chunks, never manifests, and deletes nothing.
    assert refused(lambda: worker_s3.put_object(Bucket=bucket, Key=f"manifests/{name}/forged.json", Body=b"{}", IfNoneMatch="*"))
    assert refused(lambda: worker_s3.delete_object(Bucket=bucket, Key=f"data/{name}/{backup_id}/0000000000"))
    assert refused(lambda: worker_s3.get_object(Bucket=bucket, Key=manifest))
    # In staging it writes only item records: never a segment or a round another step trusts (review 3, L4).
    staging = f"staging/{name}/20200101T000000.000Z-0badc0de"  # not the published backup's: nothing of it is touched
    assert refused(lambda: worker_s3.put_object(Bucket=bucket, Key=f"{staging}/in0/seg00000", Body=b"forged"))
    assert refused(lambda: worker_s3.put_object(Bucket=bucket, Key=f"{staging}/plans/round-00001.json", Body=b"[]"))
    worker_s3.put_object(Bucket=bucket, Key=f"{staging}/failures/0000000000.json", Body=b"{}")
    # Prepare may make data keys, but only with the Braid encryption context; the worker may not make any.
    key = cloud.config()["key"]["key_id"]
    prepare_kms, worker_kms = as_role(cloud, "kms", "prepare"), as_role(cloud, "kms", "worker")
    prepare_kms.generate_data_key(KeyId=key, KeySpec="AES_256", EncryptionContext={"braid:backup": published})
    assert refused(lambda: prepare_kms.generate_data_key(KeyId=key, KeySpec="AES_256"), "AccessDeniedException")
    assert refused(lambda: worker_kms.generate_data_key(KeyId=key, KeySpec="AES_256", EncryptionContext={"braid:backup": published}), "AccessDeniedException")
    # Only the steps that report outcomes publish events.
    entry = [{"Source": "braid", "DetailType": "probe", "Detail": "{}"}]
    as_role(cloud, "events", "finalize").put_events(Entries=entry)
    assert refused(lambda: as_role(cloud, "events", "worker").put_events(Entries=entry), "AccessDeniedException")
    # Finalize may withdraw a manifest it published (its read-back check failed): allowed, not refused.
    finalize_s3 = as_role(cloud, "s3", "finalize")
    finalize_s3.put_object(Bucket=bucket, Key=f"manifests/{name}/withdrawn.json", Body=b"{}", IfNoneMatch="*")
    finalize_s3.delete_object(Bucket=bucket, Key=f"manifests/{name}/withdrawn.json")
    denied = {(r["caller"], r["op"]) for r in cloud.requests() if "denied" in r}
    assert (f"emulatedpipeline-{role_ids()['worker']}", "PutObject") in denied


def test_chunks_and_manifests_are_create_only_for_every_role(cloud: Emulator, published: str) -> None:
    """The bucket policy denies a write without If-None-Match under data/ and manifests/, whatever the role allows."""
    bucket = cloud.bucket
    name, backup_id = published.split("@")
    chunk = f"data/{name}/{backup_id}/0000000000"
    worker_s3 = as_role(cloud, "s3", "worker")
    before = cloud.client("s3").get_object(Bucket=bucket, Key=chunk)["Body"].read()

    assert refused(lambda: worker_s3.put_object(Bucket=bucket, Key=chunk, Body=b"replaced"))
    assert refused(lambda: worker_s3.put_object(Bucket=bucket, Key=chunk, Body=b"replaced", IfNoneMatch="*"), "PreconditionFailed")
    assert refused(lambda: as_role(cloud, "s3", "finalize").put_object(Bucket=bucket, Key=f"manifests/{name}/{backup_id}.json", Body=b"{}"))
    # Multipart: creating the upload and its parts carry no conditional header and stay allowed; completing needs it.
    fresh = f"data/{name}/{backup_id}/9999999999"
    upload = worker_s3.create_multipart_upload(Bucket=bucket, Key=fresh)["UploadId"]
    etag = worker_s3.upload_part(Bucket=bucket, Key=fresh, UploadId=upload, PartNumber=1, Body=b"x" * 1024)["ETag"]
    parts = {"Parts": [{"ETag": etag, "PartNumber": 1}]}
    assert refused(lambda: worker_s3.complete_multipart_upload(Bucket=bucket, Key=fresh, UploadId=upload, MultipartUpload=parts))
    # Staging is not create-only: the agent rewrites its records there.
    as_role(cloud, "s3", "plan").put_object(Bucket=bucket, Key=f"staging/{name}/{backup_id}/probe", Body=b"1")
    as_role(cloud, "s3", "plan").put_object(Bucket=bucket, Key=f"staging/{name}/{backup_id}/probe", Body=b"2")

    assert cloud.client("s3").get_object(Bucket=bucket, Key=chunk)["Body"].read() == before


def test_a_host_tagged_for_one_name_cannot_stage_or_read_another_names_backup(cloud: Emulator, published: str) -> None:
    data = stream_bytes(3 * MiB, 22)

    intruder = braid(cloud, "host-agent-otherdb", "backup", "--name", "iamdb", "--chunk-size", CHUNK, stdin=data)

    assert intruder.code != 0 and intruder.stdout == ""
    assert "AccessDenied" in intruder.stderr or "denied" in intruder.stderr.lower(), intruder.stderr
    assert not [r for r in cloud.requests(caller="host-agent-otherdb") if r.get("op") == "PutObject" and r.get("status") == 200]
    # Raw staged bytes of another name are not readable; its small records (list --incomplete) are.
    s3 = as_key(cloud, "s3", "host-agent-otherdb")
    name, backup_id = published.split("@")
    assert refused(lambda: s3.get_object(Bucket=cloud.bucket, Key=f"staging/{name}/{backup_id}/probe"))
    listed = braid(cloud, "host-agent-otherdb", "list", "--json")
    assert listed.code == 0 and published in [row["backup"] for row in json.loads(listed.stdout)], listed.stderr
    # The host tagged for the name it backs up stages it, and a restore host reads it back.
    owner = braid(cloud, "host-agent-iamdb", "backup", "--name", "iamdb", "--chunk-size", CHUNK, stdin=data)
    assert owner.code == 0, owner.stderr
    restored = braid(cloud, "host-restore", "restore", owner.stdout.strip())
    assert restored.code == 0, restored.stderr
    assert refused(lambda: as_key(cloud, "s3", "host-restore").put_object(Bucket=cloud.bucket, Key="staging/iamdb/x", Body=b""))
