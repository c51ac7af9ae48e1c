"""Object Lock on the emulated cloud (`scripts/emulated-aws --object-lock GOVERNANCE:2`), through the real CLI.

The stack is synthesized with `braid:objectLock`, its bucket made with
Object Lock, `braid init --stack` copies the setting into config.json, and
every request of the hosts (`host-agent-NAME`, `host-restore`,
`host-operator`) and handlers is checked against the stack's rendered IAM
(support.emulated_iam), which also asks for s3:PutObjectRetention on a PUT
with retention. A backup goes through the whole pipeline; prune and forget
meet it locked; the operator re-keys it; restore reads it back.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cloud"))

from test_emulated_e2e import CHUNK, Emulator, MiB, braid, stream_bytes  # noqa: E402

from braid.format.ids import BackupRef  # noqa: E402
from braid.format.layout import data_prefix, manifest_key, staging_prefix  # noqa: E402
from braid.format.lock import ObjectLock  # noqa: E402
from braid.format.timestamps import format_timestamp  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]

LOCK = ObjectLock("GOVERNANCE", 2)
ADMIN = "lock-admin"  # a caller the emulator does not check: the account's administrator


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    emulator = Emulator(tmp_path_factory.mktemp("emulated-lock"), "--object-lock", str(LOCK))
    try:
        yield emulator
    finally:
        emulator.stop()


def test_a_locked_stack_backs_up_locked_refuses_early_removal_and_rekeys(cloud: Emulator, tmp_path: Path) -> None:
    assert cloud.config()["object_lock"] == LOCK.to_json()  # braid init --stack, from the ObjectLock output
    data = [stream_bytes(6 * MiB, 31), stream_bytes(6 * MiB, 32)]
    refs = []
    for stream in data:
        run = braid(cloud, "host-agent-lockdb", "backup", "--name", "lockdb", "--chunk-size", CHUNK, stdin=stream)
        assert run.code == 0, run.stderr + cloud.tail()
        refs.append(BackupRef.parse(run.stdout.strip()))
    s3 = cloud.client("s3")
    for ref in refs:
        chunks = cloud.keys(data_prefix(ref))
        assert len(chunks) == 2
        for key in [*chunks, manifest_key(ref)]:
            head = s3.head_object(Bucket=cloud.bucket, Key=key)
            assert (head["ObjectLockMode"], head["ObjectLockRetainUntilDate"]) == ("GOVERNANCE", LOCK.until(ref)), key
        assert cloud.keys(staging_prefix(ref)) == []  # staging is unlocked: Finalize removed it

    until = format_timestamp(LOCK.until(refs[0]))
    pruned = braid(cloud, ADMIN, "prune", "--keep-last", "1", "--json")
    assert pruned.code == 0, pruned.stderr
    assert json.loads(pruned.stdout)["locked"] == [{"backup": str(refs[0]), "until": until}]
    forget = braid(cloud, ADMIN, "forget", str(refs[0]))
    assert forget.code == 12
    assert f"braid: error: backup {refs[0]} is under Object Lock retention (GOVERNANCE, 2 days from its start) until {until}" in forget.stderr

    # The operator re-wraps every backup to a new key, signing as the stack's OperatorRole.
    target = cloud.client("kms").create_key(Description="rotation target")["KeyMetadata"]["Arn"]
    rekey = braid(cloud, "host-operator", "rekey", "--kms-key", target, "--json")
    assert rekey.code == 0, rekey.stderr + cloud.tail()
    assert sorted(json.loads(rekey.stdout)["rewrapped"]) == sorted(str(r) for r in refs)
    for ref in refs:
        versions = [v for v in s3.list_object_versions(Bucket=cloud.bucket, Prefix=manifest_key(ref))["Versions"]]
        assert len(versions) == 2
        head = s3.head_object(Bucket=cloud.bucket, Key=manifest_key(ref))
        assert (head["ObjectLockMode"], head["ObjectLockRetainUntilDate"]) == ("GOVERNANCE", LOCK.until(ref))
    assert cloud.config()["key"]["key_id"] == target and cloud.config()["object_lock"] == LOCK.to_json()

    # The emulator does check the operator: a chunk is not its business.
    operator = boto3.client("s3", endpoint_url=cloud.env["AWS_ENDPOINT_URL"], region_name=cloud.env["AWS_DEFAULT_REGION"],
                            aws_access_key_id="host-operator", aws_secret_access_key="emulated")
    with pytest.raises(ClientError, match="AccessDenied"):
        operator.get_object(Bucket=cloud.bucket, Key=cloud.keys(data_prefix(refs[0]))[0])

    out = tmp_path / "restored"
    restored = braid(cloud, "host-restore", "restore", str(refs[1]), "--output", str(out))
    assert restored.code == 0, restored.stderr
    assert out.read_bytes() == data[1]


def test_the_wal_worker_archives_pushed_wal_locked_days_from_its_write(cloud: Emulator, tmp_path: Path) -> None:
    """`wal-push` stages raw WAL (unlocked: the worker removes it); the WAL worker, signing as its role (checked
    against the stack's IAM: s3:PutObjectRetention on archived WAL), stores each file, pack and history file locked."""
    from datetime import UTC, datetime

    from test_wal_cloud import wait_for
    from tests.wal_segments import write_segment

    from braid.ops.wal_packed import packed_members

    history = tmp_path / "00000002.history"
    history.write_bytes(b"1\t0/3000000\tno recovery target specified\n")
    files = [write_segment(tmp_path, f"00000001000000000000000{n}") for n in (1, 2, 3)] + [history]
    before = datetime.now(UTC)
    for path in files:
        pushed = braid(cloud, "host-agent-lockpg", "wal-push", "--name", "lockpg", str(path))
        assert pushed.code == 0, pushed.stderr + cloud.tail()

    def archived() -> dict[str, str]:
        found = {}
        for key in cloud.keys("wal/lockpg/"):
            members = packed_members("lockpg", key)
            for name in [m.name for m in members] if members else [key.rpartition("/")[2]]:
                found[name] = key
        return found

    done = wait_for("every file archived", lambda: (lambda a: a if all(p.name in a for p in files) else None)(archived()), cloud)
    after = datetime.now(UTC)
    s3 = cloud.client("s3")
    for key in set(done.values()) - {"wal/lockpg/archive.json"}:
        head = s3.head_object(Bucket=cloud.bucket, Key=key)
        assert head["ObjectLockMode"] == "GOVERNANCE", key
        assert LOCK.wal_until(before) <= head["ObjectLockRetainUntilDate"] <= LOCK.wal_until(after), key
    assert "ObjectLockMode" not in s3.head_object(Bucket=cloud.bucket, Key="wal/lockpg/archive.json")
    wait_for("staging purged", lambda: not cloud.keys("wal-staging/lockpg/"), cloud)  # staged WAL stays unlocked
    fetched = tmp_path / "fetched"
    got = braid(cloud, "host-restore", "wal-fetch", "--name", "lockpg", "--prefetch", "0", files[1].name, str(fetched))
    assert got.code == 0 and fetched.read_bytes() == files[1].read_bytes(), got.stderr
