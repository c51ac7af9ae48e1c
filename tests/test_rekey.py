"""braid rekey: re-wraps every backup's data key, rewriting only manifests; interrupted and
rerun; restore works with the new key and not the old one; KMS ReEncrypt on moto."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
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
from braid.errors import KeyAccessError
from braid.format.ids import BackupRef
from braid.format.keys import encryption_context
from braid.format.layout import REKEY, manifest_key
from braid.format.manifest import open_manifest
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import utc_now
from braid.ops.open import open_backup
from braid.ops.rekey import rekey_repository
from conftest import run_braid
from support.faulty_store import FaultRule, FaultyStore
from support.kill_points import LocalRepo, Tally, kill_rekey, manifests_naming, pattern


def data_files(repo: Path) -> dict[str, str]:
    """Every chunk's bytes (hashed): a rekey must never touch one."""
    return {p.relative_to(repo).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in (repo / "data").rglob("*") if p.is_file()}


def key_of(repo: Path, backup: str) -> str:
    ref = BackupRef.parse(backup)
    return str(open_manifest((repo / manifest_key(ref)).read_bytes(), backup).manifest.key.key_id)


def test_restore_after_rekey_works_with_the_new_key_and_not_the_old(repo: Path, tmp_path: Path) -> None:
    inputs = {run_braid("backup", "--repo", str(repo), "--name", "db", "--chunk-size", "4KiB", stdin=pattern(20_000 + i, i)).out.strip(): pattern(20_000 + i, i) for i in range(3)}
    chunks = data_files(repo)
    old_key = key_of(repo, next(iter(inputs)))
    new_file = tmp_path / "new.key"

    result = run_braid("rekey", "--repo", str(repo), "--new-key-file", str(new_file), "--json")

    assert result.code == 0, result.stderr
    report = json.loads(result.out)
    new_key = report["key_id"]
    assert sorted(report["rewrapped"]) == sorted(inputs) and report["config_switched"] and new_key != old_key
    assert oct(new_file.stat().st_mode & 0o777) == "0o600"
    assert data_files(repo) == chunks  # only manifests were rewritten
    assert not (repo / "rekey").exists() or not any((repo / "rekey").rglob("*.json"))
    for backup, original in inputs.items():
        assert key_of(repo, backup) == new_key
        restored = run_braid("restore", "--repo", str(repo), backup, "--key-file", str(new_file))
        assert restored.code == 0 and restored.stdout == original, restored.stderr
    shown = json.loads(run_braid("show", "--repo", str(repo), backup, "--json").out)
    assert shown["key_id"] == new_key and shown["rekeyed"]["from"] == old_key
    assert f"key         {new_key} (re-wrapped" in run_braid("show", "--repo", str(repo), backup).out
    assert run_braid("verify", "--repo", str(repo), "--all", "--deep", "--key-file", str(new_file)).code == 0
    # The old key file is refused, for the repository and for each backup.
    refused = run_braid("restore", "--repo", str(repo), backup)
    assert refused.code == 4 and "wrong key file" in refused.stderr and refused.stdout == b""
    old = LocalKeyFile.open(tmp_path / "xdg-config" / "braid" / "keys" / f"{json.loads((repo / 'config.json').read_text())['id']}.key")
    repository = Repository.open(LocalStore(repo))
    with pytest.raises(KeyAccessError, match="wrong key file"):
        open_backup(repository, BackupRef.parse(backup), old)
    # A rerun finds nothing left to do; new backups use the new key.
    again = json.loads(run_braid("rekey", "--repo", str(repo), "--new-key-file", str(new_file), "--json").out)
    assert again["rewrapped"] == [] and sorted(again["already"]) == sorted(inputs)
    made = run_braid("backup", "--repo", str(repo), "--name", "db", "--key-file", str(new_file), stdin=b"after")
    assert made.code == 0 and key_of(repo, made.out.strip()) == new_key


def test_rekey_killed_halfway_then_rerun(tmp_path: Path) -> None:
    repo = LocalRepo(tmp_path / "kill")
    made = {repo.backup("db", pattern(30_000, i)): pattern(30_000, i) for i in range(8)}
    new_file = tmp_path / "new.key"
    new_key = LocalKeyFile.create(new_file).key_id
    tally = Tally()

    killed = kill_rekey(repo, ["rekey", "--new-key-file", str(new_file)], ("rekeyed", 3), new_key, tally)

    assert killed and tally.losses == 0, tally.problems
    halfway = manifests_naming(repo, new_key)
    assert 3 <= halfway < len(made)
    # Mid-rekey every backup is listed and readable, each under the key it names.
    listed, unreadable = repo.listed()
    assert sorted(listed) == sorted(made) and unreadable == []
    repository = Repository.open(LocalStore(repo.path))
    old = LocalKeyFile.open(tmp_path / "kill" / "config" / "braid" / "keys" / f"{repository.config.id}.key")
    new = LocalKeyFile.open(new_file)
    assert repository.config.key["key_id"] == old.key_id  # switched only when every manifest is done
    for backup in made:
        ref = BackupRef.parse(backup)
        opened = open_backup(repository, ref, new if key_of(repo.path, backup) == new_key else old)
        assert opened.manifest.backup == backup

    rerun = repo.run("rekey", "--new-key-file", str(new_file), "--json")

    assert rerun.code == 0, rerun.stderr
    report = json.loads(rerun.stdout)
    assert len(report["rewrapped"]) + len(report["already"]) == len(made) and len(report["already"]) >= halfway
    assert manifests_naming(repo, new_key) == len(made)
    for backup, original in made.items():
        restored = repo.run("restore", backup, "--key-file", str(new_file))
        assert restored.code == 0 and restored.stdout == original, restored.stderr
        assert repo.run("restore", backup).code == 4


@pytest.mark.parametrize("mode", ["fail", "after"])
def test_a_failed_switch_leaves_a_manifest_that_opens_and_a_rerun_finishes(tmp_path: Path, mode: str) -> None:
    """The manifest's PUT refused before it happened (old version stays), or after (new version is in): both open."""
    keys = LocalKeyFile.create(tmp_path / "old.key")
    new = LocalKeyFile.create(tmp_path / "new.key")
    store = LocalStore(tmp_path / "repo")
    repository = Repository.create(store, RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, utc_now()))
    refs = []
    for _ in range(2):
        ref = BackupRef.new("db")
        key, wrapped = keys.generate_data_key(encryption_context(repository.config.id, str(ref)))
        finalize_backup(store, ref=ref, repository_id=repository.config.id, key=key, wrapped=wrapped, chunk_size=4096,
                        inputs=[InputRecord(0, "stdin", 0)], entries=[], level=3, created=utc_now(), timings={}, engine="local")
        refs.append(ref)
    faulty = FaultyStore(store, [FaultRule("put", 1.0, mode, "manifests/", times=1)])
    flaky = Repository(faulty, repository.config)

    first = rekey_repository(flaky, keys, new, keys.rewrapper(new), {"type": "local", "key_id": new.key_id})

    assert faulty.total_injected == 1 and len(first.failed) == 1 and not first.config_switched
    assert Repository.open(store).config.key["key_id"] == keys.key_id
    failed = BackupRef.parse(first.failed[0][0])
    sealed = Repository.open(store).load(failed)
    expected = keys if mode == "fail" else new
    assert sealed.manifest.key.key_id == expected.key_id
    sealed.authenticate(expected.unwrap(sealed.manifest.key))
    assert [info.key for info in store.list(REKEY)] != []  # the verified copy waits for the rerun

    second = rekey_repository(Repository.open(store), keys, new, keys.rewrapper(new), {"type": "local", "key_id": new.key_id})

    assert second.failed == [] and second.config_switched
    assert [info.key for info in store.list(REKEY)] == []
    for ref in refs:
        opened = open_backup(Repository.open(store), ref, new)
        assert opened.manifest.key.key_id == new.key_id and opened.manifest.rekeyed is not None


def test_a_manifest_that_does_not_authenticate_is_not_rewrapped(repo: Path, tmp_path: Path) -> None:
    good = run_braid("backup", "--repo", str(repo), "--name", "db", stdin=b"good").out.strip()
    bad = run_braid("backup", "--repo", str(repo), "--name", "db", stdin=b"bad").out.strip()
    # Re-seal `bad` under a key of its own: checksum fine, MAC by someone else.
    path = repo / manifest_key(BackupRef.parse(bad))
    sealed = open_manifest(path.read_bytes(), bad)
    from braid.format.keys import DataKey
    from braid.format.manifest import seal_body

    path.write_bytes(seal_body(sealed.body, DataKey(os.urandom(32)).manifest_mac(sealed.body)))
    before = path.read_bytes()

    result = run_braid("rekey", "--repo", str(repo), "--new-key-file", str(tmp_path / "new.key"))

    assert result.code == 6 and "could not be re-wrapped" in result.stderr and bad in result.stderr and "failed authentication" in result.stderr
    assert path.read_bytes() == before  # never rewritten
    assert key_of(repo, good) == LocalKeyFile.open(tmp_path / "new.key").key_id
    assert json.loads((repo / "config.json").read_text())["key"]["key_id"] != key_of(repo, good)  # not switched while one is left


def test_usage_errors(repo: Path, tmp_path: Path) -> None:
    wrong = run_braid("rekey", "--repo", str(repo), "--kms-key", "arn:aws:kms:us-east-1:123456789012:key/x")
    assert wrong.code == 2 and "--kms-key is for s3:// repositories" in wrong.stderr
    both = run_braid("rekey", "--repo", str(repo), "--kms-key", "k", "--new-key-file", str(tmp_path / "n.key"))
    assert both.code == 2 and "not allowed with" in both.stderr
    missing = run_braid("rekey", "--repo", str(repo), "--key-file", str(tmp_path / "nope.key"), "--new-key-file", str(tmp_path / "n.key"))
    assert missing.code == 4 and "not found" in missing.stderr


@pytest.fixture
def kms_repo(aws_env: None) -> Iterator[tuple[Repository, object, str, str]]:
    with mock_aws():
        kms = kms_client(region="us-east-1")
        old_arn = kms.create_key(Description="braid old")["KeyMetadata"]["Arn"]
        new_arn = kms.create_key(Description="braid new")["KeyMetadata"]["Arn"]
        s3 = s3_client(region="us-east-1")
        s3.create_bucket(Bucket="braid-rekey")
        store = S3Store(s3, "braid-rekey", "repo")
        repository = Repository.create(store, RepositoryConfig.new({"type": "kms", "key_id": old_arn}, utc_now()))
        yield repository, kms, old_arn, new_arn


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_kms_rekey_uses_reencrypt_and_the_old_key_is_refused(kms_repo: tuple[Repository, object, str, str]) -> None:
    repository, kms, old_arn, new_arn = kms_repo
    old = KmsKeyService(kms, old_arn)  # type: ignore[arg-type]
    refs = []
    for _ in range(3):
        ref = BackupRef.new("pg")
        key, wrapped = old.generate_data_key(encryption_context(repository.config.id, str(ref)))
        finalize_backup(repository.store, ref=ref, repository_id=repository.config.id, key=key, wrapped=wrapped, chunk_size=4096,
                        inputs=[InputRecord(0, "stdin", 0)], entries=[], level=3, created=utc_now(), timings={}, engine="stepfunctions")
        refs.append(ref)
    calls: list[str] = []
    kms.meta.events.register("before-call.kms.*", lambda model, **_: calls.append(model.name))  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("braid.adapters.aws.clients.kms_client", lambda **_: kms)
        code, out, err = run_cli("rekey", "--repo", "s3://braid-rekey/repo", "--kms-key", new_arn, "--json")

    assert code == 0, err
    report = json.loads(out)
    assert report["key_id"] == new_arn and sorted(report["rewrapped"]) == sorted(map(str, refs)) and report["config_switched"]
    assert calls.count("ReEncrypt") == 3
    fresh = Repository.open(repository.store)
    assert fresh.config.key == {"type": "kms", "key_id": new_arn}
    for ref in refs:
        opened = open_backup(fresh, ref, KmsKeyService(kms, new_arn))  # type: ignore[arg-type]
        assert opened.manifest.key.key_id == new_arn and opened.manifest.rekeyed == {"at": opened.manifest.rekeyed["at"], "from": old_arn}
        with pytest.raises(KeyAccessError):
            open_backup(fresh, ref, KmsKeyService(kms, old_arn))  # type: ignore[arg-type]
    # The old key can go: restore (unwrap-only, by the key each backup records) no longer needs it.
    kms.disable_key(KeyId=old_arn.rsplit("/", 1)[1])  # type: ignore[attr-defined]
    for ref in refs:
        assert open_backup(fresh, ref, KmsKeyService.for_unwrap(kms)).manifest.backup == str(ref)  # type: ignore[arg-type]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("braid.adapters.aws.clients.kms_client", lambda **_: kms)
        code, out, _err = run_cli("rekey", "--repo", "s3://braid-rekey/repo", "--json")
    assert code == 0 and json.loads(out)["rewrapped"] == []
    code, _out, err = run_cli("rekey", "--repo", "s3://braid-rekey/repo", "--new-key-file", "/tmp/x.key")
    assert code == 2 and "--new-key-file is for local repositories" in err


def test_a_backup_published_under_the_old_key_during_a_rekey_is_caught_by_a_rerun(repo: Path, tmp_path: Path) -> None:
    run_braid("backup", "--repo", str(repo), "--name", "db", stdin=b"first")
    new_file = tmp_path / "new.key"
    assert run_braid("rekey", "--repo", str(repo), "--new-key-file", str(new_file)).code == 0
    # A backup that generated its data key before the switch publishes afterwards, under the old key.
    repository = Repository.open(LocalStore(repo))
    old = LocalKeyFile.open(tmp_path / "xdg-config" / "braid" / "keys" / f"{repository.config.id}.key")
    ref = BackupRef.new("db")
    key, wrapped = old.generate_data_key(encryption_context(repository.config.id, str(ref)))
    finalize_backup(repository.store, ref=ref, repository_id=repository.config.id, key=key, wrapped=wrapped, chunk_size=4096,
                    inputs=[InputRecord(0, "stdin", 0)], entries=[], level=3, created=utc_now(), timings={}, engine="local")
    assert key_of(repo, str(ref)) == old.key_id

    again = run_braid("rekey", "--repo", str(repo), "--new-key-file", str(new_file), "--json")

    assert again.code == 0, again.stderr
    assert json.loads(again.out)["rewrapped"] == [str(ref)] and key_of(repo, str(ref)) == LocalKeyFile.open(new_file).key_id
