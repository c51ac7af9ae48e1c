"""The local engine in-process: stream shapes, bounded memory, failing stores."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest

import braid.engine.driver
from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.engine.local import LocalEngine
from braid.engine.port import BackupRequest
from braid.engine.stream import BufferPool, InputSource
from braid.errors import InputError, StorageError
from braid.format.ids import BackupRef
from braid.format.layout import DATA, MANIFESTS
from braid.format.repository import Repository, RepositoryConfig
from braid.format.timestamps import utc_now
from braid.format.usage import Usage
from braid.ops.restore import OutputTarget, SharedDecoders, restore_backup
from braid.ports.store import Buffer


def make_repo(tmp_path: Path, store: LocalStore | None = None) -> tuple[Repository, LocalKeyFile]:
    keys = LocalKeyFile.create(tmp_path / "master.key")
    store = store or LocalStore(tmp_path / "repo")
    (tmp_path / "repo").mkdir(exist_ok=True)
    config = RepositoryConfig.new({"type": "local", "key_id": keys.key_id}, utc_now())
    return Repository.create(store, config), keys


def write_inputs(tmp_path: Path, sizes: list[int]) -> list[InputSource]:
    sources = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"in{i}.bin"
        path.write_bytes((b"row %d " % i) * (size // 8) + os.urandom(size - (size // 8) * len(b"row %d " % i)) if size else b"")
        sources.append(InputSource(i, str(path), str(path)))
    return sources


def backup(repo: Repository, keys: LocalKeyFile, sources: list[InputSource], chunk_size: int = 4096, workers: int = 3) -> tuple[LocalEngine, str]:
    engine = LocalEngine(repo, keys)
    manifest = engine.run(BackupRequest(BackupRef.new("db"), sources, chunk_size, 3, workers), lambda e: None)
    return engine, manifest.backup


def restore_to(repo: Repository, keys: LocalKeyFile, backup_id: str, tmp_path: Path) -> list[bytes]:
    sealed = repo.load(BackupRef.parse(backup_id))
    key = keys.unwrap(sealed.manifest.key)
    manifest = sealed.authenticate(key)
    targets = [OutputTarget(str(tmp_path / f"out{i}"), str(tmp_path / f"out{i}")) for i in range(len(manifest.inputs))]
    restore_backup(repo.store, manifest, key, targets, workers=2)
    return [Path(t.path).read_bytes() for t in targets if t.path]


@pytest.mark.parametrize(
    "sizes",
    [[0], [1], [4096], [4096 * 3 + 100], [10000, 0, 1], [50000, 3000, 4096 * 5]],
    ids=["empty", "one-byte", "exact-chunk", "mid-chunk", "three-unequal", "three-larger"],
)
def test_backup_restore_round_trip(tmp_path: Path, sizes: list[int]) -> None:
    repo, keys = make_repo(tmp_path)
    sources = write_inputs(tmp_path, sizes)
    _, backup_id = backup(repo, keys, sources)
    restored = restore_to(repo, keys, backup_id, tmp_path)
    assert restored == [Path(s.path).read_bytes() for s in sources if s.path]
    manifest = repo.load(BackupRef.parse(backup_id)).manifest
    assert [i.length for i in manifest.inputs] == sizes
    assert manifest.chunk_count == sum(-(-s // 4096) for s in sizes)


def test_the_published_manifest_opens_to_exactly_the_one_finalize_sealed(tmp_path: Path) -> None:
    """Finalize verifies its manifest by comparing the bytes read back with the sealed ones, not by re-opening
    them: that rests on what it seals opening, authenticated, to the manifest it built, with every field a
    real backup fills in (stats, timings, usage: whose JSON form rounds its CPU seconds)."""
    repo, keys = make_repo(tmp_path)
    engine = LocalEngine(repo, keys)
    manifest = engine.run(BackupRequest(BackupRef.new("db"), write_inputs(tmp_path, [10000, 0, 1]), 4096, 3, 3), lambda e: None)
    assert manifest.usage is not None and manifest.stats and manifest.timings
    sealed = repo.load(BackupRef.parse(manifest.backup))
    assert sealed.authenticate(keys.unwrap(sealed.manifest.key)) == replace(manifest, usage=Usage.from_json(manifest.usage.to_json()))


def test_memory_is_bounded_to_inputs_plus_workers_plus_one_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Backup: (inputs + workers + 1) chunk buffers, one per input to read into; restore likewise with outputs."""
    pools: list[BufferPool] = []

    class RecordedPool(BufferPool):
        def __init__(self, count: int, size: int) -> None:
            super().__init__(count, size)
            pools.append(self)

    monkeypatch.setattr(braid.engine.driver, "BufferPool", RecordedPool)
    repo, keys = make_repo(tmp_path)
    sources = write_inputs(tmp_path, [4096 * 200, 4096 * 150])
    _, backup_id = backup(repo, keys, sources, workers=2)
    (pool,) = pools
    bound = 2 + 2 + 1  # inputs + workers + 1
    assert pool.count == bound
    assert pool.max_in_use <= bound
    assert pool._created <= bound
    assert pool.in_use == 0  # every buffer came back
    assert repo.load(BackupRef.parse(backup_id)).manifest.stats["max_buffers_in_flight"] == pool.max_in_use <= bound

    sealed = repo.load(BackupRef.parse(backup_id))
    key = keys.unwrap(sealed.manifest.key)
    manifest = sealed.authenticate(key)
    targets = [OutputTarget(str(tmp_path / f"out{i}"), str(tmp_path / f"out{i}")) for i in range(2)]
    stats = restore_backup(repo.store, manifest, key, targets, workers=2)
    assert 2 <= stats.buffers <= 2 + 2 + 1  # outputs + workers + 1, of 350 chunks
    assert [Path(str(t.path)).read_bytes() for t in targets] == [Path(str(s.path)).read_bytes() for s in sources]


def test_shared_decoders_make_their_buffers_once_for_several_backups(tmp_path: Path) -> None:
    """A chain's links restored in turn on one SharedDecoders: one set of chunk buffers for all of them, not one per backup."""
    repo, keys = make_repo(tmp_path)
    opened = []
    for n in range(3):
        (tmp_path / f"b{n}").mkdir()
        sources = write_inputs(tmp_path / f"b{n}", [4096 * (40 + n)])
        _, backup_id = backup(repo, keys, sources, workers=2)
        sealed = repo.load(BackupRef.parse(backup_id))
        key = keys.unwrap(sealed.manifest.key)
        opened.append((sealed.authenticate(key), key, sources[0]))
    shared = SharedDecoders([manifest for manifest, _, _ in opened], 2)
    try:
        for n, (manifest, key, source) in enumerate(opened):
            target = OutputTarget(str(tmp_path / f"out{n}"), str(tmp_path / f"out{n}"))
            stats = restore_backup(repo.store, manifest, key, [target], workers=2, shared=shared)
            assert stats.buffers == shared.plaintexts.made  # the shared buffers, not buffers of its own
            assert Path(str(target.path)).read_bytes() == Path(str(source.path)).read_bytes()
    finally:
        shared.close()
    assert 1 <= shared.plaintexts.made <= 1 + 2 + 1  # one restore's outputs + workers + 1, for the three backups
    assert shared.plaintexts.size == max(c.length for manifest, _, _ in opened for c in manifest.chunks())


class FailingStore(LocalStore):
    """A repository disk that fills up after a number of chunk writes."""

    def __init__(self, root: Path, fail_after: int) -> None:
        super().__init__(root)
        self.fail_after = fail_after
        self.writes = 0
        self.lock = threading.Lock()

    def put(self, key: str, data: Buffer, *, checksum: str | None = None, create_only: bool = False, durable: bool = True) -> None:
        if key.startswith(DATA):
            with self.lock:
                self.writes += 1
                full = self.writes > self.fail_after
            if full:
                raise StorageError(f"repository disk is full while writing {key}; free space and run the backup again")
        super().put(key, data, checksum=checksum, create_only=create_only, durable=durable)


def test_full_disk_marks_nothing_complete_and_cleans_up(tmp_path: Path) -> None:
    store = FailingStore(tmp_path / "repo", fail_after=5)
    repo, keys = make_repo(tmp_path, store)
    sources = write_inputs(tmp_path, [4096 * 40])
    with pytest.raises(StorageError, match="disk is full"):
        backup(repo, keys, sources)
    assert repo.backups() == []
    assert list(store.list(MANIFESTS)) == []
    assert list(store.list(DATA)) == []


def test_failing_manifest_write_publishes_nothing(tmp_path: Path) -> None:
    class ManifestFails(LocalStore):
        def put(self, key: str, data: Buffer, *, checksum: str | None = None, create_only: bool = False, durable: bool = True) -> None:
            if key.startswith(MANIFESTS):
                raise StorageError("repository disk is full")
            super().put(key, data, checksum=checksum, create_only=create_only, durable=durable)

    store = ManifestFails(tmp_path / "repo")
    repo, keys = make_repo(tmp_path, store)
    with pytest.raises(StorageError):
        backup(repo, keys, write_inputs(tmp_path, [9000]))
    assert repo.backups() == [] and list(store.list(DATA)) == []


def test_unreadable_input_fails_before_anything_is_stored(tmp_path: Path) -> None:
    repo, keys = make_repo(tmp_path)
    missing = InputSource(0, str(tmp_path / "nope"), str(tmp_path / "nope"))
    with pytest.raises(InputError, match="does not exist"):
        backup(repo, keys, [missing])
    assert list(repo.store.list("")) == [i for i in repo.store.list("") if i.key == "config.json"]


def test_local_store_leaves_no_partial_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put("a/b", b"x" * 10)
    with pytest.raises(StorageError):
        store.put("a/c", b"y", checksum="crc64nvme:AAAAAAAAAAA=")
    assert [i.key for i in store.list("")] == ["a/b"]
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "s" / "a").iterdir())


def stored_keys(store: LocalStore, prefix: str) -> Iterable[str]:
    return [i.key for i in store.list(prefix)]


def test_retried_worker_cannot_replace_a_published_chunk(tmp_path: Path) -> None:
    from braid.engine.chunk_worker import ChunkTask, store_chunk
    from braid.errors import IntegrityError
    from braid.format.chunk import ChunkCodec
    from braid.format.layout import chunk_key

    repo, keys = make_repo(tmp_path)
    ref = BackupRef.new("db")
    data_key, _ = keys.generate_data_key({"braid:backup": str(ref)})
    codec = ChunkCodec(data_key)
    first = store_chunk(codec, repo.store, ref, ChunkTask(0, 0, 0), b"a" * 5000)
    original = repo.store.get(chunk_key(ref, 0))
    again = store_chunk(codec, repo.store, ref, ChunkTask(0, 0, 0), b"a" * 5000)
    assert again == first and repo.store.get(chunk_key(ref, 0)) == original
    with pytest.raises(IntegrityError, match="already exists with different content"):
        store_chunk(codec, repo.store, ref, ChunkTask(0, 0, 0), b"b" * 5000)
    assert repo.store.get(chunk_key(ref, 0)) == original


def test_a_manifest_that_does_not_read_back_is_withdrawn(tmp_path: Path) -> None:
    class CorruptingReads(LocalStore):
        def get(self, key: str) -> bytes:
            data = super().get(key)
            return data[:-1] + b"!" if key.startswith(MANIFESTS) else data

    store = CorruptingReads(tmp_path / "repo")
    repo, keys = make_repo(tmp_path, store)
    from braid.errors import IntegrityError

    with pytest.raises(IntegrityError, match="read back differently"):
        backup(repo, keys, write_inputs(tmp_path, [9000]))
    assert list(store.list(MANIFESTS)) == [] and list(store.list(DATA)) == []


def test_chunks_are_synced_before_the_manifest_is_published(tmp_path: Path) -> None:
    """Workers write without fsync; finalize syncs every chunk, then publishes."""
    order: list[str] = []

    class Recording(LocalStore):
        def put(self, key: str, data: Buffer, *, checksum: str | None = None, create_only: bool = False, durable: bool = True) -> None:
            order.append(f"put {'lease' if key.endswith('/lease') else key.split('/')[0]} durable={durable}")
            super().put(key, data, checksum=checksum, create_only=create_only, durable=durable)

        def sync(self, keys: Iterable[str]) -> None:
            keys = list(keys)
            order.append(f"sync {len(keys)}")
            super().sync(keys)

    store = Recording(tmp_path / "repo")
    repo, keys = make_repo(tmp_path, store)
    order.clear()
    backup(repo, keys, write_inputs(tmp_path, [4096 * 3]))
    # The lease (braid.engine.lease) goes first, so a concurrent prune sees the backup alive from its first chunk.
    # The catalog's summary and log marker (braid.ops.catalog) precede the manifest, durably, so a published backup is never missing from `list`.
    expected = ["put lease durable=False"] + ["put data durable=False"] * 3 + ["sync 3"] + ["put catalog durable=True"] * 2 + ["put manifests durable=True"]
    assert order == expected


def test_sync_of_a_missing_object_is_an_error(tmp_path: Path) -> None:
    from braid.errors import NotFoundError

    store = LocalStore(tmp_path / "s")
    store.put("a/b", b"x", durable=False)
    store.sync(["a/b"])
    with pytest.raises(NotFoundError):
        store.sync(["a/missing"])
