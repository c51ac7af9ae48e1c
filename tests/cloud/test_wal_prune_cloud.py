"""The scheduled prune and the WAL archive on the emulated cloud: the synthesized prune state machine, each step as its
own role, removes exactly the archived WAL the kept backups do not need, a pack only once no kept backup needs any of
its members, never a history file; its output and report say what went. The WAL is archived by the stack's WAL worker
from what hosts staged (tests/cloud/test_wal_cloud.py), so the archive holds files alone and a pack.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_emulated_e2e import Emulator, braid
from test_emulated_iam import as_key, refused
from test_prune_cloud import repository_of, run_prune
from test_wal_cloud import archived, push, wait_for
from tests.wal_segments import segment_bytes, write_segment

from braid.format.pg_backup import WalInfo
from braid.format.wal import format_lsn
from support.synthetic_backup import write_backup

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]

MIB = 1 << 20
DAY = datetime(2024, 5, 1, 2, 0, tzinfo=UTC)
HISTORY = "00000002.history"


def seg(n: int) -> str:
    return f"0000000100000000000000{n:02X}"


def starting_in(n: int) -> WalInfo:
    """A base backup's `wal` field: it starts in segment `n` of timeline 1 (1 MiB segments)."""
    return WalInfo({"timeline": 1, "start_lsn": format_lsn(n * MIB + 0x28), "stop_lsn": format_lsn(n * MIB + 0x1000)})


def stage(cloud: Emulator, names: list[str]) -> None:
    """Stage files back to back, as wal-push stages them: one batch for the WAL worker, which packs them."""
    s3 = cloud.client("s3")
    for name in names:
        data = segment_bytes(name)
        digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
        s3.put_object(Bucket=cloud.bucket, Key=f"wal-staging/pg/{name}", Body=data, ChecksumAlgorithm="SHA256", ChecksumSHA256=digest)


def left(cloud: Emulator) -> list[str]:
    """The files archived under wal/pg/ (alone or in a pack), without the archive's record."""
    return sorted(name for name in archived(cloud) if name != "archive.json")


def prune_role(cloud: Emulator, service: str) -> Any:
    from support.emulated_cloud import cached_stack
    from support.moto_stack import resources_of

    (lid,) = [lid for lid in resources_of(cached_stack().template, "AWS::IAM::Role") if lid.startswith("FunctionsPruneRole")]
    return as_key(cloud, service, f"emulatedpipeline-{lid}")


def test_the_scheduled_prune_removes_exactly_the_wal_kept_backups_do_not_need(cloud: Emulator, tmp_path: Path) -> None:
    for n in (1, 2, 3, 4):  # each archived alone: pushed once the one before is archived
        done = push(cloud, write_segment(tmp_path, seg(n)))
        assert done.code == 0, done.stderr
        wait_for(f"{seg(n)} archived", lambda n=n: seg(n) in archived(cloud), cloud)  # type: ignore[misc]
    stage(cloud, [seg(5), seg(6)])
    wait_for("the pack archived", lambda: seg(5) in archived(cloud) and seg(6) in archived(cloud), cloud)
    pack = "wal/pg/0000000100000000/pack-00000005-00000006"
    assert archived(cloud)[seg(5)] == archived(cloud)[seg(6)] == [pack]
    for name in (seg(7), seg(8)):
        assert push(cloud, write_segment(tmp_path, name)).code == 0
        wait_for(f"{name} archived", lambda name=name: name in archived(cloud), cloud)  # type: ignore[misc]
    (tmp_path / HISTORY).write_bytes(b"1\t0/900000\tno recovery target specified\n")
    assert push(cloud, tmp_path / HISTORY).code == 0
    wait_for("the history file archived", lambda: HISTORY in archived(cloud), cloud)

    repository, keys = repository_of(cloud)
    old = write_backup(repository, keys, "pg", DAY, wal=starting_in(2))
    mid = write_backup(repository, keys, "pg", DAY + timedelta(days=1), wal=starting_in(6))  # starts inside the pack
    new = write_backup(repository, keys, "pg", DAY + timedelta(days=2), wal=starting_in(8))

    # Keep two: 1..4 go; 5 stays, in the pack that holds 6, which `mid` needs to reach consistency.
    output = run_prune(cloud, "prune-wal-1", {"keep_last": 2})
    assert output["report"]["ok"] and output["report"]["pruned"] == [str(old)], output["report"]
    (summary,) = output["plan"]["wal"]
    assert (summary["files"], summary["first"], summary["last"], summary["error"]) == (4, seg(1), seg(4), None)
    (section,) = output["report"]["wal"]
    assert section["files"] == [seg(n) for n in (1, 2, 3, 4)]
    assert sorted((s["backup"], s["segno"]) for s in section["kept_from"]) == sorted([(str(mid), 6), (str(new), 8)])
    assert left(cloud) == sorted([seg(5), seg(6), seg(7), seg(8), HISTORY])

    # Keep one: the pack goes whole (no kept backup needs 5 or 6), and 7; the history file stays.
    output = run_prune(cloud, "prune-wal-2", {"keep_last": 1})
    assert output["report"]["ok"] and output["report"]["pruned"] == [str(mid)]
    assert output["report"]["wal"][0]["files"] == [seg(5), seg(6), seg(7)]
    assert left(cloud) == sorted([seg(8), HISTORY]) and not cloud.keys(pack)

    # A restore host sees an archive continuous from the kept backup's start; a pruned segment is "not archived" (exit 1).
    verified = braid(cloud, "host-restore", "verify", "--wal", "--name", "pg")
    assert verified.code == 0 and "continuous" in verified.stdout, (verified.stdout, verified.stderr)
    gone = braid(cloud, "host-restore", "wal-fetch", "--name", "pg", "--prefetch", "0", seg(5), str(tmp_path / "gone"))
    assert gone.code == 1 and not (tmp_path / "gone").exists(), gone.stderr

    # Least privilege, as the emulator enforces the rendered policies: the planner may delete a segment directory's
    # objects, never an archive's record nor a history file, and nothing of staged WAL.
    s3 = prune_role(cloud, "s3")
    s3.delete_object(Bucket=cloud.bucket, Key=f"wal/pg/0000000100000000/{seg(0x30)}")  # allowed (nothing there)
    for key in ("wal/pg/archive.json", f"wal/pg/history/{HISTORY}", f"wal-staging/pg/{seg(9)}"):
        assert refused(lambda key=key: s3.delete_object(Bucket=cloud.bucket, Key=key)), key  # type: ignore[misc]
    assert HISTORY in archived(cloud) and cloud.keys("wal/pg/archive.json")
