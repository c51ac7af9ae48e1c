"""braid copy: chunks copied as stored and restorable with the target's own key; idempotent and resumable;
a corrupt source chunk or a wrong target key publishes nothing; a chain's parent first; s3:// targets on moto
(a key file, KMS Encrypt, and KMS to KMS with ReEncrypt)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto import mock_aws

from braid.adapters.aws.clients import kms_client, s3_client
from braid.adapters.aws.kms import KmsKeyService
from braid.adapters.aws.s3 import S3Store
from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.cli.main import main
from braid.engine.finalize import InputRecord, finalize_backup
from braid.format.ids import BackupRef
from braid.format.keys import encryption_context
from braid.format.layout import data_prefix, manifest_key, summary_key
from braid.format.manifest import open_manifest
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import utc_now
from braid.ops.open import open_backup
from conftest import run_braid
from support.kill_points import pattern


def data_files(repo: Path) -> dict[str, str]:
    return {p.relative_to(repo).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in (repo / "data").rglob("*") if p.is_file()}


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """Two local repositories, each with its own key file."""
    paths = (tmp_path / "r1", tmp_path / "k1", tmp_path / "r2", tmp_path / "k2")
    for repo, key in ((paths[0], paths[1]), (paths[2], paths[3])):
        assert run_braid("init", "--repo", str(repo), "--key-file", str(key)).code == 0
    return paths


def backup(repo: Path, key: Path, name: str, data: bytes) -> str:
    result = run_braid("backup", "--repo", str(repo), "--key-file", str(key), "--name", name, "--chunk-size", "4KiB", stdin=data)
    assert result.code == 0, result.stderr
    return result.out.strip()


def test_copy_restores_identically_with_the_targets_key_and_a_rerun_copies_nothing(two: tuple[Path, Path, Path, Path]) -> None:
    r1, k1, r2, k2 = two
    inputs = {backup(r1, k1, name, pattern(30_000 + i, i)): pattern(30_000 + i, i) for i, name in enumerate(["pg", "pg", "db2"])}

    result = run_braid("copy", "--repo", str(r1), "--key-file", str(k1), "--all", "--to", str(r2), "--to-key-file", str(k2))

    assert result.code == 0, result.stderr
    assert sorted(result.out.split()) == sorted(inputs)
    assert "3 backup(s) copied" in result.stderr
    assert data_files(r2) == data_files(r1)  # chunks as stored, byte for byte
    for ref, original in inputs.items():
        restored = run_braid("restore", "--repo", str(r2), "--key-file", str(k2), ref)
        assert restored.code == 0 and restored.stdout == original, restored.stderr
        # The copy is bound to the target: its key, its repository id, and it names where it came from.
        shown = json.loads(run_braid("show", "--repo", str(r2), "--key-file", str(k2), ref, "--json").out)
        assert shown["key_id"] == LocalKeyFile.open(k2).key_id and shown["copied"]["from"] == json.loads((r1 / "config.json").read_text())["id"]
        assert "copied      from repository" in run_braid("show", "--repo", str(r2), ref).out
        # The source's key does not open it.
        assert run_braid("restore", "--repo", str(r2), "--key-file", str(k1), ref).code == 4
    assert run_braid("verify", "--repo", str(r2), "--key-file", str(k2), "--all", "--deep").code == 0
    listed = json.loads(run_braid("list", "--repo", str(r2), "--json").out)
    assert sorted(row["backup"] for row in listed) == sorted(inputs)

    again = run_braid("copy", "--repo", str(r1), "--key-file", str(k1), "--all", "--to", str(r2), "--to-key-file", str(k2), "--json")
    assert again.code == 0, again.stderr
    report = json.loads(again.out)
    assert report["copied"] == [] and sorted(report["already"]) == sorted(inputs) and report["objects_copied"] == 0


def test_an_interrupted_copy_resumes_with_only_what_is_missing(two: tuple[Path, Path, Path, Path]) -> None:
    r1, k1, r2, k2 = two
    ref = backup(r1, k1, "pg", pattern(40_000, 7))
    assert run_braid("copy", "--repo", str(r1), "--key-file", str(k1), ref, "--to", str(r2), "--to-key-file", str(k2)).code == 0
    # As a copy interrupted before its manifest: two chunks were never written, no manifest, no summary.
    parsed = BackupRef.parse(ref)
    (r2 / manifest_key(parsed)).unlink()
    (r2 / summary_key(parsed)).unlink()
    chunks = sorted((r2 / data_prefix(parsed)).iterdir())
    for chunk in chunks[:2]:
        chunk.unlink()
    assert run_braid("list", "--repo", str(r2), "--rebuild-catalog", "--json").out.strip() == "[]"

    result = run_braid("copy", "--repo", str(r1), "--key-file", str(k1), "pg@latest", "--to", str(r2), "--to-key-file", str(k2), "--json")

    assert result.code == 0, result.stderr
    report = json.loads(result.out)
    assert report["copied"] == [ref] and report["objects_copied"] == 2
    assert run_braid("restore", "--repo", str(r2), "--key-file", str(k2), ref).stdout == pattern(40_000, 7)


def test_a_corrupt_source_chunk_is_not_copied_and_nothing_is_published(two: tuple[Path, Path, Path, Path]) -> None:
    r1, k1, r2, k2 = two
    ref = BackupRef.parse(backup(r1, k1, "pg", pattern(20_000, 3)))
    victim = sorted((r1 / data_prefix(ref)).iterdir())[1]
    raw = bytearray(victim.read_bytes())
    raw[-3] ^= 0x01
    victim.write_bytes(bytes(raw))

    result = run_braid("copy", "--repo", str(r1), "--key-file", str(k1), str(ref), "--to", str(r2), "--to-key-file", str(k2))

    assert result.code == 6, result.stderr
    assert "chunk 1 of backup" in result.stderr and "does not match its manifest (corrupt); not copied" in result.stderr
    assert f"braid verify --deep {ref}" in result.stderr
    assert not (r2 / manifest_key(ref)).exists() and not (r2 / summary_key(ref)).exists()


def test_a_wrong_target_key_file_is_refused_before_anything_is_written(two: tuple[Path, Path, Path, Path], tmp_path: Path) -> None:
    r1, k1, r2, _k2 = two
    ref = backup(r1, k1, "pg", pattern(10_000, 1))
    result = run_braid("copy", "--repo", str(r1), "--key-file", str(k1), ref, "--to", str(r2), "--to-key-file", str(k1))
    assert result.code == 4 and "wrong key file" in result.stderr, result.stderr
    assert not (r2 / "data").exists() and not (r2 / "manifests").exists()
    missing = run_braid("copy", "--repo", str(r1), "--key-file", str(k1), ref, "--to", str(r2))  # its default path holds nothing
    assert missing.code == 4 and "key file" in missing.stderr and "not found" in missing.stderr


def test_usage_errors(two: tuple[Path, Path, Path, Path], tmp_path: Path) -> None:
    r1, k1, r2, k2 = two
    ref = backup(r1, k1, "pg", pattern(5_000, 2))
    common = ["--repo", str(r1), "--key-file", str(k1)]
    both = run_braid("copy", *common, ref, "--all", "--to", str(r2))
    assert both.code == 2 and "not both" in both.stderr
    neither = run_braid("copy", *common, "--to", str(r2))
    assert neither.code == 2 and "give the backup to copy" in neither.stderr
    named = run_braid("copy", *common, ref, "--name", "pg", "--to", str(r2))
    assert named.code == 2 and "--name goes with --all" in named.stderr
    no_target = run_braid("copy", *common, ref)
    assert no_target.code == 2 and "--to" in no_target.stderr
    itself = run_braid("copy", *common, ref, "--to", str(r1), "--to-key-file", str(k1))
    assert itself.code == 2 and "is the source repository itself" in itself.stderr
    none = run_braid("copy", *common, "--all", "--name", "pgg", "--to", str(r2), "--to-key-file", str(k2))
    assert none.code == 2 and "no backups named 'pgg'" in none.stderr and "did you mean pg" in none.stderr
    absent = run_braid("copy", *common, "pg@20261128T000000.000Z-00000000", "--to", str(r2), "--to-key-file", str(k2))
    assert absent.code == 8 and "not found" in absent.stderr
    target_missing = run_braid("copy", *common, ref, "--to", str(tmp_path / "nothere"))
    assert target_missing.code == 3 and "does not exist" in target_missing.stderr


def test_a_chains_parent_is_copied_first(two: tuple[Path, Path, Path, Path]) -> None:
    """An incremental names its `parent` in its manifest (docs/format.md, Chains): copying it copies the parent first."""
    r1, k1, r2, k2 = two
    parent = backup(r1, k1, "pg", pattern(12_000, 4))
    made = run_braid("backup", "--repo", str(r1), "--key-file", str(k1), "--name", "pg", "--chunk-size", "4KiB", "--incremental", stdin=pattern(12_000, 5))
    assert made.code == 0, made.stderr
    child = BackupRef.parse(made.out.strip())

    result = run_braid("copy", "--repo", str(r1), "--key-file", str(k1), str(child), "--to", str(r2), "--to-key-file", str(k2), "--json")

    assert result.code == 0, result.stderr
    assert json.loads(result.out)["copied"] == [parent, str(child)]
    copied = json.loads(Repository.open(LocalStore(r2)).load(child).body)
    assert (copied["kind"], copied["parent"], copied["chain_full"]) == ("incremental", parent, parent)  # every other field kept
    assert run_braid("restore", "--repo", str(r2), "--key-file", str(k2), parent).stdout == pattern(12_000, 4)
    assert run_braid("restore", "--repo", str(r2), "--key-file", str(k2), str(child)).stdout == pattern(12_000, 5)


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def aws(aws_env: None) -> Iterator[object]:
    with mock_aws():
        s3_client(region="us-east-1").create_bucket(Bucket="braid-copy")
        yield kms_client(region="us-east-1")


def test_copy_to_s3_with_a_key_file_and_with_kms(two: tuple[Path, Path, Path, Path], tmp_path: Path, aws: object) -> None:
    r1, k1, _r2, _k2 = two
    ref = backup(r1, k1, "pg", pattern(50_000, 9))
    code, _out, err = run_cli("init", "--repo", "s3://braid-copy/keyed", "--engine", "local", "--key-file", str(tmp_path / "k3"))
    assert code == 0, err
    arn = aws.create_key(Description="braid copy")["KeyMetadata"]["Arn"]  # type: ignore[attr-defined]
    kms_repo = Repository.create(S3Store(s3_client(region="us-east-1"), "braid-copy", "kms"), RepositoryConfig.new({"type": "kms", "key_id": arn}, utc_now()))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("braid.adapters.aws.clients.kms_client", lambda **_: aws)
        keyed = run_cli("copy", "--repo", str(r1), "--key-file", str(k1), ref, "--to", "s3://braid-copy/keyed", "--to-key-file", str(tmp_path / "k3"))
        to_kms = run_cli("copy", "--repo", str(r1), "--key-file", str(k1), ref, "--to", "s3://braid-copy/kms", "--json")
        assert keyed[0] == 0 and to_kms[0] == 0, keyed[2] + to_kms[2]
        assert json.loads(to_kms[1])["copied"] == [ref]
        for url, key_file in (("s3://braid-copy/keyed", str(tmp_path / "k3")), ("s3://braid-copy/kms", None)):
            key_args = ["--key-file", key_file] if key_file else []
            code, out, err = run_cli("verify", "--repo", url, *key_args, ref, "--deep", "--engine", "local", "--json")
            assert code == 0 and json.loads(out)[0]["ok"], err
    opened = open_backup(kms_repo, BackupRef.parse(ref), KmsKeyService(aws, arn))  # type: ignore[arg-type]
    assert opened.manifest.key.key_id == arn and opened.manifest.repository == kms_repo.config.id


def test_kms_to_kms_reencrypts_inside_kms(aws: object) -> None:
    s3 = s3_client(region="us-east-1")
    source_arn = aws.create_key(Description="source")["KeyMetadata"]["Arn"]  # type: ignore[attr-defined]
    target_arn = aws.create_key(Description="target")["KeyMetadata"]["Arn"]  # type: ignore[attr-defined]
    source = Repository.create(S3Store(s3, "braid-copy", "a"), RepositoryConfig.new({"type": "kms", "key_id": source_arn}, utc_now()))
    target = Repository.create(S3Store(s3, "braid-copy", "b"), RepositoryConfig.new({"type": "kms", "key_id": target_arn}, utc_now()))
    ref = BackupRef.new("pg")
    key, wrapped = KmsKeyService(aws, source_arn).generate_data_key(encryption_context(source.config.id, str(ref)))  # type: ignore[arg-type]
    finalize_backup(source.store, ref=ref, repository_id=source.config.id, key=key, wrapped=wrapped, chunk_size=4096,
                    inputs=[InputRecord(0, "stdin", 0)], entries=[], level=3, created=utc_now(), timings={}, engine="stepfunctions")
    calls: list[str] = []
    aws.meta.events.register("before-call.kms.*", lambda model, **_: calls.append(model.name))  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("braid.adapters.aws.clients.kms_client", lambda **_: aws)
        code, out, err = run_cli("copy", "--repo", "s3://braid-copy/a", str(ref), "--to", "s3://braid-copy/b", "--json")
    assert code == 0, err
    assert "ReEncrypt" in calls and "Encrypt" not in calls
    opened = open_backup(target, ref, KmsKeyService(aws, target_arn))  # type: ignore[arg-type]
    assert opened.key.fingerprint == key.fingerprint and opened.manifest.key.context == encryption_context(target.config.id, str(ref))
    assert open_manifest(target.store.get(manifest_key(ref)), "copy").manifest.copied["from"] == source.config.id  # type: ignore[index]
