"""Incremental chains and captured PostgreSQL facts on the emulated cloud, all through the real agent CLI.

The agent captures the small members of the stream as it passes and stages them; Finalize records the
PostgreSQL facts and encrypts the metadata exactly as the local engine does. For an incremental, the agent
picks the parent by its manifest (no key), and Prepare, which holds the data keys, authenticates the chain
and hands the parent's backup_manifest to the agent through the backup's own staging before the producer
starts. Every plaintext staging object, noncurrent versions included, is gone afterwards.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from test_emulated_e2e import CHUNK, Emulator, Run, assert_within_policy, braid

pytestmark = [pytest.mark.e2e, pytest.mark.cloud]

LABEL = b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nCHECKPOINT LOCATION: 0/2000060\nSTART TIMELINE: 1\n"


def pg_manifest(n: int) -> bytes:
    return (
        b'{ "PostgreSQL-Backup-Manifest-Version": 2, "Files": [], "WAL-Ranges": [{ "Timeline": 1, "Start-LSN": "0/2000028", "End-LSN": "0/2000100" }],'
        + f' "Link": {n} }}\n'.encode()
    )


def pg_tar(path: Path, n: int) -> Path:
    """A pg_basebackup -Ft -D - stand-in: backup_label, a data file, a WAL segment and this link's backup_manifest."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        members = (("backup_label", LABEL), ("PG_VERSION", b"18\n"), ("marker", f"link {n}".encode()),
                   ("pg_wal/000000010000000000000002", b"w" * 4096), ("backup_manifest", pg_manifest(n)))
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return path


def staging_versions(cloud: Emulator, name: str) -> list[str]:
    """Every version and delete marker left under staging/NAME/ (the bucket is versioned)."""
    found = []
    pages = cloud.client("s3").get_paginator("list_object_versions").paginate(Bucket=cloud.bucket, Prefix=f"staging/{name}/")
    for page in pages:
        found += [v["Key"] for v in page.get("Versions", [])] + [m["Key"] for m in page.get("DeleteMarkers", [])]
    return found


def show(cloud: Emulator, caller: str, ref: str) -> dict:
    run = braid(cloud, caller, "show", ref, "--json")
    assert run.code == 0, run.stderr
    return json.loads(run.stdout)


def backed_up(run: Run, cloud: Emulator) -> str:
    assert run.code == 0, run.stderr + cloud.tail()
    return run.stdout.strip()


def test_a_base_backup_through_the_cloud_records_its_wal_facts_and_metadata(cloud: Emulator, tmp_path: Path) -> None:
    tar = pg_tar(tmp_path / "base.tar", 0)
    ref = backed_up(braid(cloud, "agent-pgfacts", "backup", "--name", "pgfacts", "--chunk-size", CHUNK, "--", "cat", str(tar)), cloud)

    shown = show(cloud, "restore-pgfacts", ref)
    assert shown["wal"]["start_lsn"] == "0/2000028" and shown["wal"]["timeline"] == 1 and shown["wal"]["pg_version"] == 18, shown["wal"]
    assert shown["wal"]["stop_lsn"] == "0/2000100"
    assert shown["kind"] == "full" and shown["parent"] is None
    name, _, backup_id = ref.partition("@")
    assert cloud.keys(f"data/{name}/{backup_id}/metadata/") == [f"data/{name}/{backup_id}/metadata/backup_manifest"]
    assert staging_versions(cloud, name) == []  # the captured plaintext went by version, like the segments
    restored = braid(cloud, "restore-pgfacts", "restore", ref, "--output", str(tmp_path / "out.tar"))
    assert restored.code == 0, restored.stderr
    assert (tmp_path / "out.tar").read_bytes() == tar.read_bytes()
    assert_within_policy(cloud, "agent-pgfacts", "agent")


def incremental(cloud: Emulator, caller: str, name: str, tar: Path, seen: Path, *extra: str) -> Run:
    """An incremental whose producer copies its {parent_manifest} (and notes the path) before writing `tar`."""
    script = 'cp "$1" "$2" && echo "$1" > "$2.path" && ls -l "$1" | cut -c1-10 > "$2.mode" && cat "$3"'
    return braid(cloud, caller, "backup", "--name", name, "--incremental", *extra, "--chunk-size", CHUNK, "--",
                 "sh", "-c", script, "sh", "{parent_manifest}", str(seen), str(tar))


def test_full_and_two_incrementals_through_the_cloud_restore_as_a_chain(cloud: Emulator, tmp_path: Path) -> None:
    tars = [pg_tar(tmp_path / f"link{n}.tar", n) for n in range(3)]
    full = backed_up(braid(cloud, "agent-pgchain", "backup", "--name", "pgchain", "--chunk-size", CHUNK, "--", "cat", str(tars[0])), cloud)
    refs = [full]
    for n in (1, 2):
        seen = tmp_path / f"seen{n}"
        refs.append(backed_up(incremental(cloud, "agent-pgchain", "pgchain", tars[n], seen), cloud))
        # The producer read the parent's captured backup_manifest from a private file, gone once the backup ended.
        assert seen.read_bytes() == pg_manifest(n - 1)
        assert seen.with_name(f"seen{n}.mode").read_text().strip() == "-rw-------"
        assert not Path(seen.with_name(f"seen{n}.path").read_text().strip()).exists()

    for n, ref in enumerate(refs):
        shown = show(cloud, "restore-pgchain", ref)
        expected = {"kind": "full", "parent": None, "chain_full": None} if n == 0 else {"kind": "incremental", "parent": refs[n - 1], "chain_full": full}
        assert {k: shown[k] for k in expected} == expected
        assert shown["wal"]["start_lsn"] == "0/2000028" and shown["engine"] == "stepfunctions"
    assert staging_versions(cloud, "pgchain") == []  # captured members and the handed-over parent manifest: no version left
    # Each link's chain restores, in order, with its data as the producer wrote it.
    for n, ref in enumerate(refs):
        work = tmp_path / f"work{n}"
        restored = braid(cloud, "restore-pgchain", "restore", ref, "--chain", "--work-dir", str(work), "--", "sh", "-c", 'cat > "$1/data"', "sh", "{dir}")
        assert restored.code == 0, restored.stderr
        assert sorted(p.name for p in work.iterdir()) == [f"{i:02d}" for i in range(n + 1)]
        for i in range(n + 1):
            assert (work / f"{i:02d}" / "data").read_bytes() == tars[i].read_bytes()
    verified = braid(cloud, "restore-pgchain", "verify", refs[2], "--chain", "--deep")
    assert verified.code == 0, verified.stderr
    assert_within_policy(cloud, "agent-pgchain", "agent")


def test_a_corrupt_or_missing_parent_refuses_the_incremental_before_the_producer_runs(cloud: Emulator, tmp_path: Path) -> None:
    full = backed_up(braid(cloud, "agent-pgbad", "backup", "--name", "pgbad", "--chunk-size", CHUNK, "--", "cat", str(pg_tar(tmp_path / "base.tar", 0))), cloud)
    name, _, backup_id = full.partition("@")
    # What the host cannot check without a key: the parent's encrypted backup_manifest, replaced.
    cloud.client("s3").put_object(Bucket=cloud.bucket, Key=f"data/{name}/{backup_id}/metadata/backup_manifest", Body=b"BRMD" + b"\0" * 64)
    started = tmp_path / "started"

    run = braid(cloud, "agent-pgbad", "backup", "--name", "pgbad", "--incremental", "--", "sh", "-c", 'touch "$1"', "sh", str(started), "{parent_manifest}")

    assert run.code == 6, run.stderr + cloud.tail()
    (error,) = run.errors
    assert error.startswith(f"braid: error: the incremental's parent {full} is unreadable: backup_manifest of backup {full} does not match"), error
    assert not started.exists()  # refused before the producer ran
    listed = braid(cloud, "agent-pgbad", "list", "--name", "pgbad", "--json")
    assert [row["backup"] for row in json.loads(listed.stdout)] == [full]  # nothing published
    assert staging_versions(cloud, "pgbad") == [] and cloud.open_uploads("staging/pgbad/") == []

    missing = f"{name}@20200101T000000.000Z-00000000"
    run = braid(cloud, "agent-pgbad", "backup", "--name", "pgbad", f"--incremental={missing}", "--", "touch", str(started))
    assert run.code == 6, run.stderr
    assert run.errors[0].startswith(f"braid: error: the incremental's parent is missing: {missing} not found"), run.errors
    assert not started.exists() and staging_versions(cloud, "pgbad") == []


def test_the_cloud_prune_fan_out_keeps_the_whole_chain_a_kept_backup_needs(cloud: Emulator, tmp_path: Path) -> None:
    from test_prune_cloud import run_prune

    tars = [pg_tar(tmp_path / f"link{n}.tar", n) for n in range(2)]
    refs = [backed_up(braid(cloud, "agent-pgprune", "backup", "--name", "pgprune", "--chunk-size", CHUNK, "--", "cat", str(tars[0])), cloud)]
    refs.append(backed_up(braid(cloud, "agent-pgprune", "backup", "--name", "pgprune", "--incremental", "--chunk-size", CHUNK, "--", "cat", str(tars[1])), cloud))

    output = run_prune(cloud, "prune-chain", {"keep_last": 1})

    assert not [p for p in output["report"]["pruned"] if p.startswith("pgprune@")], output["report"]
    listed = braid(cloud, "restore-pgprune", "list", "--name", "pgprune", "--json")
    assert sorted(row["backup"] for row in json.loads(listed.stdout)) == refs
    work = tmp_path / "work"
    restored = braid(cloud, "restore-pgprune", "restore", refs[1], "--chain", "--work-dir", str(work), "--", "sh", "-c", 'cat > "$1/data"', "sh", "{dir}")
    assert restored.code == 0, restored.stderr
    assert [(work / f"{i:02d}" / "data").read_bytes() for i in range(2)] == [t.read_bytes() for t in tars]
