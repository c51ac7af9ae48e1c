"""WAL archiving through the stack on the emulated cloud: the host stages raw WAL, the WAL worker archives it.

The stack as CDK synthesizes it (scripts/emulated-aws): S3's notification
of each object created under `wal-staging/` goes to the WAL queue, the
emulator's poller (support.sqs_poller, as Lambda's event source mapping)
hands the queue's real messages in batches to the WAL worker, whose partial
batch response leaves failed messages for redelivery and, after
maxReceiveCount, the dead-letter queue. Hosts sign as the stack's roles
(`host-agent-pg` pushes, `host-restore` fetches) and every request is
checked against the rendered IAM policies.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.cloud.test_emulated_e2e import Emulator, braid
from tests.wal_segments import SYSID, segment_bytes, write_segment

from support.residents import stop_residents

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]

AGENT = "host-agent-pg"
RESTORE = "host-restore"
MARKER = b"BRAID-CLOUD-WAL-PLAINTEXT"
SEGMENTS = [f"00000001000000000000000{n}" for n in range(1, 5)]
HISTORY = "00000002.history"


def wait_for(what: str, check: Callable[[], Any], emulator: Emulator, timeout: float = 120) -> Any:
    """Poll `check` until it returns something true: the event (the worker's work) the test waits for, not a margin."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what}: not after {timeout} s\n{emulator.tail(60)}")


def versions(emulator: Emulator, prefix: str) -> list[tuple[str, bool]]:
    """Every object version and delete marker under `prefix`: (key, is a delete marker)."""
    s3 = emulator.client("s3")
    found: list[tuple[str, bool]] = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=emulator.bucket, Prefix=prefix):
        found += [(v["Key"], False) for v in page.get("Versions") or []]
        found += [(m["Key"], True) for m in page.get("DeleteMarkers") or []]
    return found


def all_bytes(emulator: Emulator, prefix: str) -> list[bytes]:
    """The bytes of every version under `prefix` (noncurrent ones too)."""
    s3 = emulator.client("s3")
    out = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=emulator.bucket, Prefix=prefix):
        for v in page.get("Versions") or []:
            out.append(s3.get_object(Bucket=emulator.bucket, Key=v["Key"], VersionId=v["VersionId"])["Body"].read())
    return out


def archived_key(name: str) -> str:
    return f"wal/pg/history/{name}" if name.endswith(".history") else f"wal/pg/{name[:16]}/{name}"


def archived(emulator: Emulator) -> dict[str, list[str]]:
    """Every file archived under wal/pg/, with the keys holding it: its own object's, or a pack's (policy wal-pack)."""
    from braid.ops.wal_packed import packed_members

    found: dict[str, list[str]] = {}
    for key in emulator.keys("wal/pg/"):
        members = packed_members("pg", key)
        for name in [m.name for m in members] if members else [key.rpartition("/")[2]]:
            found.setdefault(name, []).append(key)
    return found


def etags(emulator: Emulator, prefix: str) -> dict[str, str]:
    s3 = emulator.client("s3")
    return {key: s3.head_object(Bucket=emulator.bucket, Key=key)["ETag"] for key in emulator.keys(prefix)}


def push(emulator: Emulator, path: Path, caller: str = AGENT) -> Any:
    return braid(emulator, caller, "wal-push", "--name", "pg", str(path))


def fetch(emulator: Emulator, name: str, dest: Path) -> Any:
    return braid(emulator, RESTORE, "wal-fetch", "--name", "pg", "--prefetch", "0", name, str(dest))


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The stack, with the WAL worker failing its first batch (redelivered after 1 s)."""
    emulator = Emulator(tmp_path_factory.mktemp("wal-cloud"), "--fail-wal", "first=1", "--sqs-redelivery", "1")
    yield emulator
    emulator.stop()


def test_pushed_wal_is_archived_encrypted_and_no_raw_version_stays(cloud: Emulator, tmp_path: Path) -> None:
    files = [write_segment(tmp_path, name, marker=MARKER) for name in SEGMENTS]
    history = tmp_path / HISTORY
    history.write_bytes(b"1\t0/3000000\tbefore the bad DELETE\n" + MARKER + b"\n")
    label = tmp_path / "000000010000000000000002.00000028.backup"
    label.write_bytes(b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\n" + MARKER + b"\n")
    partial = tmp_path / "000000010000000000000006.partial"
    partial.write_bytes(MARKER + bytes(range(256)) * 64)
    files += [history, label, partial]  # every kind PostgreSQL archives
    for path in files:
        done = push(cloud, path)
        assert (done.code, done.stderr) == (0, ""), done.stderr
    # Durable at exit 0: staged (or already archived, if the worker was quick).
    assert all(cloud.keys(f"wal-staging/pg/{p.name}") or p.name in archived(cloud) for p in files)

    # The first batch fails (--fail-wal first=1); SQS delivers it again and the worker archives every file.
    wait_for("every file archived", lambda: all(p.name in archived(cloud) for p in files), cloud)
    singles = [history, label, partial]  # never packed: only whole segments are
    assert all(archived(cloud)[p.name] == [archived_key(p.name)] for p in singles)
    wait_for("staging purged, every version", lambda: not versions(cloud, "wal-staging/"), cloud)
    assert len(cloud.requests(service="lambda", op="Invoke")) >= 2, "the failed batch was delivered again"
    failed = [line for line in cloud.log.read_text(errors="replace").splitlines() if "failed its batch" in line]
    assert failed and all("injected fault" in line for line in failed), failed  # only the injected failure: the worker's own run ends cleanly
    assert cloud.keys("wal/pg/archive.json")
    record = json.loads(cloud.client("s3").get_object(Bucket=cloud.bucket, Key="wal/pg/archive.json")["Body"].read())
    assert record["system_identifier"] == str(SYSID)
    assert not any(MARKER in body for body in all_bytes(cloud, "wal/") + all_bytes(cloud, "wal-staging/")), "plaintext WAL left in the bucket"

    for path in files:  # fetched from the archived form, verified, on a restore host
        dest = tmp_path / f"restored-{path.name}"
        got = fetch(cloud, path.name, dest)
        assert (got.code, got.stderr) == (0, ""), got.stderr
        assert dest.read_bytes() == path.read_bytes()

    before = etags(cloud, "wal/pg/")
    again = push(cloud, files[0])  # PostgreSQL re-archives after a crash: the same bytes are accepted
    assert (again.code, again.stderr) == (0, "")
    wait_for("the duplicate's staged copy removed by the worker", lambda: not versions(cloud, "wal-staging/"), cloud)
    assert etags(cloud, "wal/pg/") == before, "nothing archived again, nothing replaced"

    other = tmp_path / "other" / label.name  # a file stored alone: the host's HEAD finds it and refuses other bytes
    other.parent.mkdir()
    other.write_bytes(label.read_bytes() + b"other\n")
    refused = push(cloud, other)
    assert refused.code == 7, refused.stderr
    pushed, stored = hashlib.sha256(other.read_bytes()).hexdigest(), hashlib.sha256(label.read_bytes()).hexdigest()
    assert f"archived sha256:{stored}" in refused.stderr and f"pushed sha256:{pushed}" in refused.stderr
    assert refused.stderr.count("\n") == 1
    wait_for("the refused bytes removed from staging", lambda: not versions(cloud, "wal-staging/"), cloud)
    dest = tmp_path / "after-conflict"
    assert fetch(cloud, label.name, dest).code == 0 and dest.read_bytes() == label.read_bytes(), "nothing was overwritten"
    assert not any(MARKER in body for body in all_bytes(cloud, "wal-staging/"))

    missing = fetch(cloud, "0000000100000000000000FE", tmp_path / "missing")
    assert missing.code == 1, missing.stderr
    assert not (tmp_path / "missing").exists()


def test_a_bad_file_in_a_batch_fails_alone_and_is_kept(cloud: Emulator, tmp_path: Path) -> None:
    """A staged object the worker cannot process (no SHA-256: not staged by braid) fails its own message only;
    the files batched with it are archived, and it stays where it was (nothing lost) while SQS retries it."""
    s3 = cloud.client("s3")
    bad = "wal-staging/pg/000000010000000000000009"
    s3.put_object(Bucket=cloud.bucket, Key=bad, Body=segment_bytes("000000010000000000000009"))
    good = [write_segment(tmp_path, name) for name in ("00000001000000000000000A", "00000001000000000000000B")]
    for path in good:
        assert push(cloud, path).code == 0
    wait_for("the good files archived", lambda: all(p.name in archived(cloud) for p in good), cloud)
    assert "000000010000000000000009" not in archived(cloud)
    assert cloud.keys(bad) == [bad], "the file that failed is kept for the retry"
    # An operator removes the bad object (by version: no raw copy stays); the file pushed by braid then archives.
    (version,) = [v["VersionId"] for v in s3.list_object_versions(Bucket=cloud.bucket, Prefix=bad).get("Versions", [])]
    s3.delete_object(Bucket=cloud.bucket, Key=bad, VersionId=version)
    path = write_segment(tmp_path, "000000010000000000000009")
    assert push(cloud, path).code == 0
    wait_for("the file archived", lambda: "000000010000000000000009" in archived(cloud), cloud)
    wait_for("its staged version removed", lambda: not versions(cloud, bad), cloud)


def spend_injected_fault(cloud: Emulator, tmp_path: Path) -> None:
    """The fixture's one failed batch (--fail-wal first=1), spent on a segment of its own unless an earlier test
    spent it: a batch that fails is delivered again message by message, so a test of what one batch makes sees its
    files in one batch whichever tests ran before it (`-k`, a single test)."""
    if "injected fault" in cloud.log.read_text(errors="replace"):
        return
    path = write_segment(tmp_path, "0000000100000000000000F0")
    assert push(cloud, path).code == 0
    wait_for("the failed batch delivered again and archived", lambda: path.name in archived(cloud), cloud)


def test_segments_of_one_batch_are_one_pack_and_a_conflicting_push_of_a_packed_file_exits_7(cloud: Emulator, tmp_path: Path) -> None:
    """Policy wal-pack: whole segments of one directory batched together are one object under one data key; fetch reads
    each from it; a duplicate push is accepted and a push of other bytes (which the host's HEAD cannot see inside a
    pack: the LIST of the directory's packs and the pack's index answer) exits 7 naming both checksums; the worker
    drops its staged bytes: nothing archived again, nothing replaced, no raw bytes left."""
    spend_injected_fault(cloud, tmp_path)
    names = ["000000010000000000000040", "000000010000000000000041"]
    s3 = cloud.client("s3")
    data = {name: segment_bytes(name, marker=MARKER) for name in names}
    for name in names:  # staged back to back, as wal-push stages them: one batch (the batching window waits for the second)
        digest = base64.b64encode(hashlib.sha256(data[name]).digest()).decode()
        s3.put_object(Bucket=cloud.bucket, Key=f"wal-staging/pg/{name}", Body=data[name], ChecksumAlgorithm="SHA256", ChecksumSHA256=digest)
    wait_for("both archived", lambda: all(name in archived(cloud) for name in names), cloud)
    pack = "wal/pg/0000000100000000/pack-00000040-00000041"
    assert [archived(cloud)[name] for name in names] == [[pack], [pack]]
    wait_for("staging purged, every version", lambda: not versions(cloud, "wal-staging/"), cloud)
    assert not any(MARKER in body for body in all_bytes(cloud, "wal/") + all_bytes(cloud, "wal-staging/")), "plaintext WAL left in the bucket"
    for name in names:
        got = fetch(cloud, name, tmp_path / name)
        assert (got.code, got.stderr) == (0, "") and (tmp_path / name).read_bytes() == data[name], got.stderr

    before = etags(cloud, "wal/pg/")
    duplicate = tmp_path / "again" / names[0]
    duplicate.parent.mkdir()
    duplicate.write_bytes(data[names[0]])
    again = push(cloud, duplicate)
    assert (again.code, again.stderr) == (0, ""), again.stderr
    wait_for("the duplicate's staged copy removed by the worker", lambda: not versions(cloud, "wal-staging/"), cloud)
    other = tmp_path / "other" / names[1]
    other.parent.mkdir()
    other.write_bytes(segment_bytes(names[1], seed=7))
    refused = push(cloud, other)
    assert refused.code == 7, refused.stderr
    pushed, stored = hashlib.sha256(other.read_bytes()).hexdigest(), hashlib.sha256(data[names[1]]).hexdigest()
    assert f"{names[1]} is already archived under 'pg' with different content" in refused.stderr
    assert f"archived sha256:{stored}" in refused.stderr and f"pushed sha256:{pushed}" in refused.stderr
    assert refused.stderr.count("\n") == 1
    wait_for("the refused bytes removed from staging", lambda: not versions(cloud, "wal-staging/"), cloud)
    spool = tmp_path / "spool"
    try:  # the resident pusher (its own LIST of the directory's packs) refuses them the same way
        by_pusher = braid(cloud, AGENT, "wal-push", "--name", "pg", "--async", "--spool", str(spool), str(other))
    finally:
        stop_residents(spool.glob("*/pusher.lock"))  # it would idle out after a minute
    assert by_pusher.code == 7 and "could not archive" in by_pusher.stderr, by_pusher.stderr
    assert f"archived sha256:{stored}" in by_pusher.stderr and f"pushed sha256:{pushed}" in by_pusher.stderr
    wait_for("the refused bytes removed from staging", lambda: not versions(cloud, "wal-staging/"), cloud)
    assert etags(cloud, "wal/pg/") == before, "nothing archived again, nothing replaced"
    dest = tmp_path / "after-conflict"
    assert fetch(cloud, names[1], dest).code == 0 and dest.read_bytes() == data[names[1]]


def test_wal_push_of_another_name_is_denied(cloud: Emulator, tmp_path: Path) -> None:
    """A host tagged for another name cannot stage (or read) this name's WAL."""
    path = write_segment(tmp_path, "000000010000000000000010")
    denied = braid(cloud, "host-agent-other", "wal-push", "--name", "pg", str(path))
    assert denied.code == 7 and "access denied" in denied.stderr.lower(), denied.stderr
    assert not cloud.keys("wal-staging/pg/000000010000000000000010")


@pytest.fixture(scope="module")
def stuck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The stack with a WAL worker that always fails: files stay in staging."""
    emulator = Emulator(tmp_path_factory.mktemp("wal-stuck"), "--fail-wal", "always", "--sqs-redelivery", "1")
    yield emulator
    emulator.stop()


def test_staged_wal_is_fetched_checked_and_kept_until_processed(stuck: Emulator, tmp_path: Path) -> None:
    path = write_segment(tmp_path, SEGMENTS[0], marker=MARKER)
    assert push(stuck, path).code == 0
    assert stuck.keys(f"wal-staging/pg/{SEGMENTS[0]}")
    dest = tmp_path / "RECOVERYXLOG"
    got = fetch(stuck, SEGMENTS[0], dest)
    assert (got.code, got.stderr) == (0, ""), got.stderr
    assert dest.read_bytes() == path.read_bytes()
    assert push(stuck, path).code == 0, "the same bytes, still staged: accepted"
    other = tmp_path / "other" / SEGMENTS[0]
    other.parent.mkdir()
    other.write_bytes(segment_bytes(SEGMENTS[0], seed=3))
    refused = push(stuck, other)
    assert refused.code == 7
    assert f"staged sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}" in refused.stderr
    assert f"pushed sha256:{hashlib.sha256(other.read_bytes()).hexdigest()}" in refused.stderr

    # Every delivery fails: after maxReceiveCount the message is in the dead-letter queue (whose alarm pages), and the file is still staged.
    sqs = stuck.client("sqs")
    dead = next(u for u in sqs.list_queues()["QueueUrls"] if "DeadLetters" in u)

    def dead_lettered() -> bool:
        attributes = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) >= 1

    wait_for("the message in the dead-letter queue", dead_lettered, stuck)
    assert stuck.keys(f"wal-staging/pg/{SEGMENTS[0]}"), "nothing lost: the staged file waits for a redrive"
    assert not stuck.keys(archived_key(SEGMENTS[0]))
    dest.unlink()
    assert fetch(stuck, SEGMENTS[0], dest).code == 0 and dest.read_bytes() == path.read_bytes()


def test_a_damaged_staged_file_is_not_fetched(stuck: Emulator, tmp_path: Path) -> None:
    """A staged object whose bytes do not match the SHA-256 S3 kept: wal-fetch fails with one line (never exit 1:
    PostgreSQL would take it for the end of the archive) and writes no DEST."""
    name = "000000010000000000000020"
    data = segment_bytes(name)
    wrong = hashlib.sha256(b"other bytes").digest()
    stuck.client("s3").put_object(
        Bucket=stuck.bucket, Key=f"wal-staging/pg/{name}", Body=data, ChecksumAlgorithm="SHA256", ChecksumSHA256=base64.b64encode(wrong).decode()
    )
    dest = tmp_path / "RECOVERYXLOG"
    got = fetch(stuck, name, dest)
    assert got.code >= 2 and got.stderr.count("\n") == 1 and ("SHA-256" in got.stderr or "checksum" in got.stderr), got.stderr
    assert not dest.exists()


def test_a_base_backup_without_its_wal_waits_for_it_archived_or_staged(stuck: Emulator, tmp_path: Path) -> None:
    """`pg_basebackup -X none` through the stack: the agent publishes nothing until the backup's WAL range is archived,
    and a segment still in staging counts (durable; this emulator's WAL worker never finishes one)."""
    from tests.test_pgdata_restore import base_backup

    tar = base_backup(wal=False)  # its backup_label starts in 000000010000000000000009
    refused = braid(stuck, "host-agent-pg", "backup", "--name", "pg", "--wal-wait", "0", "--quiet", stdin=tar)
    assert refused.code == 11, refused.stderr
    assert "carries no WAL (pg_basebackup -X none)" in refused.stderr and "missing 000000010000000000000009; nothing was published" in refused.stderr
    assert not stuck.keys("manifests/pg/")
    segment = write_segment(tmp_path, "000000010000000000000009", size=16 << 20)
    assert push(stuck, segment).code == 0
    assert stuck.keys("wal-staging/pg/000000010000000000000009") and not stuck.keys(archived_key(segment.name))
    published = braid(stuck, "host-agent-pg", "backup", "--name", "pg", "--wal-wait", "0", "--quiet", stdin=tar)
    assert published.code == 0, published.stderr
    assert stuck.keys("manifests/pg/")
