"""The cloud path's WAL rules without the cloud: braid.ops.wal_stage (the keyless host), braid.ops.wal_process (the WAL
worker) and braid.pipeline.wal_batch (its SQS batch), over a directory repository and an in-memory staging.

The emulated cloud runs the same code through S3, SQS and IAM (tests/cloud/test_wal_cloud.py); here each rule and
failure path is pinned on its own: exit codes and messages.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tests.wal_segments import segment_bytes, write_segment

from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.errors import AlreadyExistsError, InputError, IntegrityError, StorageError, WalConflictError, WalNotArchivedError
from braid.format.layout import wal_key, wal_staging_key
from braid.format.repository import Repository, RepositoryConfig
from braid.format.wal import WalFile
from braid.ops.wal import ArchiveInfo
from braid.ops.wal_fetch import fetch_wal_bytes
from braid.ops.wal_process import ALREADY, CONFLICT, GONE, STORED, Processed, process_staged
from braid.ops.wal_stage import STAGED, stage_wal
from braid.pipeline.wal_batch import process_batch, records_of, staged_record
from braid.ports.wal_staging import StagedWal

SEG = "000000010000000000000003"


class MemoryStaging:
    """WalStaging as S3WalStaging behaves: create-only keys, the SHA-256 kept and checked on read, versions by id."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, str, str]] = {}
        self.archived: dict[str, tuple[bytes, str]] = {}
        self.removed: list[tuple[str, str | None]] = []
        self.versions = 0

    def put_staged(self, key: str, data: bytes | bytearray, sha256: str) -> None:
        if key in self.objects:
            raise AlreadyExistsError(key)
        self.versions += 1
        self.objects[key] = (bytes(data), sha256, f"v{self.versions}")

    def staged(self, key: str) -> StagedWal | None:
        found = self.objects.get(key)
        return None if found is None else StagedWal(key, len(found[0]), found[1], found[2])

    def read_staged(self, key: str, version: str | None = None) -> StagedWal | None:
        found = self.objects.get(key)
        if found is None or (version is not None and found[2] != version):
            return None
        if hashlib.sha256(found[0]).hexdigest() != found[1]:
            raise IntegrityError(f"staged WAL {key} does not match its SHA-256: damaged")
        return StagedWal(key, len(found[0]), found[1], found[2], found[0])

    def read_staged_range(self, key: str, version: str | None, start: int, length: int) -> bytes | None:
        found = self.objects.get(key)
        if found is None or (version is not None and found[2] != version):
            return None
        return found[0][start : start + length]

    def archived_sha256(self, key: str) -> str | None:
        found = self.archived.get(key)
        return None if found is None else found[1]

    def put_archived(self, key: str, blob: bytes, sha256: str) -> None:
        if key in self.archived:
            raise AlreadyExistsError(key)
        self.archived[key] = (blob, sha256)

    def remove_staged(self, key: str, version: str | None) -> None:
        self.removed.append((key, version))
        if key in self.objects and (version is None or self.objects[key][2] == version):
            del self.objects[key]


class ArchivingStore(LocalStore):
    """The directory store, reading the archived objects the in-memory staging holds (as S3 serves the worker's PUTs)."""

    def __init__(self, root: Path, staging: MemoryStaging) -> None:
        super().__init__(root)
        self.staging = staging

    def get(self, key: str) -> bytes:
        if key in self.staging.archived:
            return self.staging.archived[key][0]
        return super().get(key)

    def head(self, key: str):  # type: ignore[no-untyped-def]
        if key in self.staging.archived:
            from braid.ports.store import ObjectInfo

            return ObjectInfo(key, len(self.staging.archived[key][0]))
        return super().head(key)


@pytest.fixture
def cloud(tmp_path: Path) -> tuple[Repository, LocalKeyFile, MemoryStaging]:
    staging = MemoryStaging()
    keys = LocalKeyFile.create(tmp_path / "master.key")
    config = RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, "2026-11-28T00:00:00Z", {"stack": "Braid"})
    repository = Repository.create(ArchivingStore(tmp_path / "repo", staging), config)
    return repository, keys, staging


def test_a_push_is_staged_then_archived_encrypted_and_removed_from_staging(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    path = write_segment(tmp_path, SEG, marker=b"PLAINTEXT-MARKER")
    assert stage_wal(repository, staging, "pg", path).outcome == STAGED
    assert fetch_wal_bytes(repository, keys, "pg", SEG, staging) == path.read_bytes()  # served from staging, checked
    done = process_staged(repository, keys, staging, "pg", WalFile.parse(SEG), "v1")
    assert (done.outcome, done.size) == (STORED, path.stat().st_size)
    assert not staging.objects and staging.removed == [(wal_staging_key("pg", WalFile.parse(SEG)), "v1")]
    blob, recorded = staging.archived[wal_key("pg", WalFile.parse(SEG))]
    assert recorded == hashlib.sha256(path.read_bytes()).hexdigest() and b"PLAINTEXT-MARKER" not in blob
    assert fetch_wal_bytes(repository, keys, "pg", SEG, staging) == path.read_bytes()  # the archived form, decrypted
    assert process_staged(repository, keys, staging, "pg", WalFile.parse(SEG), "v1").outcome == GONE  # a redelivered event
    info = json.loads((tmp_path / "repo" / "wal" / "pg" / "archive.json").read_bytes())
    assert info["segment_size"] == 1 << 20


def test_duplicates_are_accepted_and_other_bytes_refused_naming_both_checksums(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    path = write_segment(tmp_path, SEG)
    stage_wal(repository, staging, "pg", path)
    assert stage_wal(repository, staging, "pg", path).outcome == ALREADY  # still staged
    other = tmp_path / "other" / SEG
    other.parent.mkdir()
    other.write_bytes(segment_bytes(SEG, seed=5))
    mine, theirs = hashlib.sha256(path.read_bytes()).hexdigest(), hashlib.sha256(other.read_bytes()).hexdigest()
    with pytest.raises(WalConflictError, match=f"staged sha256:{mine}, pushed sha256:{theirs}") as refused:
        stage_wal(repository, staging, "pg", other)
    assert refused.value.exit_code == 7
    process_staged(repository, keys, staging, "pg", WalFile.parse(SEG))
    assert stage_wal(repository, staging, "pg", path).outcome == ALREADY  # archived: staged again, found archived
    assert process_staged(repository, keys, staging, "pg", WalFile.parse(SEG)).outcome == ALREADY  # the copy goes
    assert not staging.objects
    with pytest.raises(WalConflictError, match=f"archived sha256:{mine}, pushed sha256:{theirs}"):
        stage_wal(repository, staging, "pg", other)
    # The refused bytes were staged before the archive was checked: the worker removes them and keeps the archive.
    before = staging.archived[wal_key("pg", WalFile.parse(SEG))]
    done = process_staged(repository, keys, staging, "pg", WalFile.parse(SEG))
    assert done.outcome == CONFLICT and theirs in done.detail and not staging.objects
    assert staging.archived[wal_key("pg", WalFile.parse(SEG))] == before


def test_a_file_archived_by_a_host_with_the_key_cannot_be_compared_without_it(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, _keys, staging = cloud
    path = write_segment(tmp_path, SEG)
    staging.archived[wal_key("pg", WalFile.parse(SEG))] = (b"stored by wal-push with a key", "")
    with pytest.raises(IntegrityError, match="without a recorded checksum") as failed:
        stage_wal(repository, staging, "pg", path)
    assert failed.value.exit_code == 6


def test_a_segment_of_another_cluster_or_not_whole_is_refused_before_staging(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    first = write_segment(tmp_path, "000000010000000000000001")
    stage_wal(repository, staging, "pg", first)
    process_staged(repository, keys, staging, "pg", WalFile.parse(first.name))  # records the cluster
    stranger = tmp_path / SEG
    stranger.write_bytes(segment_bytes(SEG, sysid=42))
    with pytest.raises(IntegrityError, match="system identifier 42"):
        stage_wal(repository, staging, "pg", stranger)
    cut = tmp_path / "000000010000000000000004"
    cut.write_bytes(segment_bytes(cut.name)[:1000])
    with pytest.raises(InputError, match="not a whole segment"):
        stage_wal(repository, staging, "pg", cut)
    assert not staging.objects
    # The worker refuses one that got into staging anyway (staged before the first segment recorded the cluster).
    staging.put_staged(wal_staging_key("pg", WalFile.parse(SEG)), stranger.read_bytes(), hashlib.sha256(stranger.read_bytes()).hexdigest())
    with pytest.raises(IntegrityError, match="system identifier 42"):
        process_staged(repository, keys, staging, "pg", WalFile.parse(SEG), known={"pg": ArchiveInfo("pg", 7_412_345_678_901_234_567, 1 << 20)})
    assert staging.objects, "kept for the retry (and the dead-letter queue): nothing lost"


def test_fetch_checks_staged_bytes_and_missing_is_not_archived(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repository, keys, staging = cloud
    with pytest.raises(WalNotArchivedError) as missing:
        fetch_wal_bytes(repository, keys, "pg", SEG, staging)
    assert missing.value.exit_code == 1
    key = wal_staging_key("pg", WalFile.parse(SEG))
    staging.objects[key] = (b"damaged", hashlib.sha256(b"other").hexdigest(), "v9")
    with pytest.raises(IntegrityError, match="damaged") as damaged:
        fetch_wal_bytes(repository, keys, "pg", SEG, staging)
    assert damaged.value.exit_code == 6


def _event(*keys: str, test: bool = False) -> str:
    if test:
        return json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent"})
    return json.dumps({"Records": [{"eventName": "ObjectCreated:Put", "s3": {"object": {"key": k, "versionId": "v1"}}} for k in keys]})


def test_sqs_messages_name_staged_files_and_each_failure_is_reported_alone() -> None:
    record = staged_record("tenant/a/wal-staging/pg/000000010000000000000003.partial", "v1")
    assert record is not None and (record.prefix, record.name, record.file.name, record.version) == ("tenant/a", "pg", "000000010000000000000003.partial", "v1")
    assert staged_record("wal-staging/pg/000000010000000000000003", None).prefix == ""  # type: ignore[union-attr]
    for other in ("staging/pg/x", "wal-staging/pg/not-a-wal-file", "xwal-staging/pg/000000010000000000000003", "wal-staging/pg/a/b"):
        assert staged_record(other, None) is None, other
    assert list(records_of(_event(test=True))) == []
    assert [r.file.name for r in records_of(_event("wal-staging/pg/00000002.history"))] == ["00000002.history"]

    def process(records):  # type: ignore[no-untyped-def]
        return [StorageError("S3 failed") if r.file.name.endswith("5") else Processed(r.name, r.file.name, STORED) for r in records]

    messages = {"Records": [
        {"messageId": "m1", "body": _event("wal-staging/pg/000000010000000000000004")},
        {"messageId": "m2", "body": _event("wal-staging/pg/000000010000000000000005")},
        {"messageId": "m3", "body": "not json"},
        {"messageId": "m4", "body": _event(test=True)},
    ]}
    response, done = process_batch(messages, process)
    assert response == {"batchItemFailures": [{"itemIdentifier": "m2"}, {"itemIdentifier": "m3"}]}
    assert [d.file for d in done] == ["000000010000000000000004"]
