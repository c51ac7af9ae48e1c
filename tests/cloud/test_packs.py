"""Packs (docs/format.md, Packs): the cloud worker stores runs of up to CHUNKS_PER_PACK chunks (pack_sizes) as one object, and
every reader finds each chunk's frame in it: restore, quick and deep verify, Finalize; a retried or late worker
accepts its pack only if it is exactly its chunks. The pipeline's real steps run over a local store here
(tests/cloud/test_emulated_e2e.py runs them on the emulated AWS through the CLI)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from braid import contract
from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.engine.chunk_worker import ChunkTask, store_pack
from braid.errors import IntegrityError
from braid.format.checksum import stored_checksum
from braid.format.chunk import ChunkCodec
from braid.format.ids import BackupRef
from braid.format.keys import DataKey
from braid.format.layout import chunk_key, data_prefix, manifest_key
from braid.format.manifest import Manifest, open_manifest
from braid.format.repository import Repository, RepositoryConfig
from braid.format.staging import StagingArea
from braid.format.stored import stored_objects
from braid.format.timestamps import utc_now
from braid.ops.restore import OutputTarget, restore_backup
from braid.ops.verify import verify_backup
from braid.pipeline.finalize import finalize_step
from braid.pipeline.plan import plan_next_round
from braid.pipeline.prepare import load_data_key, prepare_backup
from braid.pipeline.worker import ChunkLanes, pack_sizes, process_item
from braid.ports.pipeline import PlainStoreJanitor, RecordingPublisher
from braid.ports.store import ObjectInfo
from support.staged_stream import stage_stream

CHUNK = 4096
K = contract.CHUNKS_PER_PACK
SEGMENT_PARTS = 16
# 18 chunks and a bit: one segment of 16 (one item, in packs of pack_sizes: 4, 4, 4, 4) and one of 3 (one pack of 3);
# compressible, each chunk its own.
DATA = b"".join(b"row %06d of chunk %d; " % (n, n // 160) for n in range(3200))[: 18 * CHUNK + 1234]
CHUNKS = 19
LAYOUT = pack_sizes(SEGMENT_PARTS, K) + pack_sizes(CHUNKS - SEGMENT_PARTS, K)
FIRST = LAYOUT[0]  # chunks in the first pack (0..FIRST-1); the second starts at FIRST
WIDE = LAYOUT[1]  # chunks in the second pack (FIRST..FIRST+WIDE-1): the first of several frames


class CountingStore(LocalStore):
    """Counts HEADs: quick verify makes one per pack, not per chunk."""

    heads: list[str]

    def head(self, key: str) -> ObjectInfo | None:
        self.heads.append(key)
        return super().head(key)


@dataclass
class Published:
    store: CountingStore
    keys: LocalKeyFile
    ref: BackupRef
    key: DataKey
    manifest: Manifest


@pytest.fixture
def published(tmp_path: Path) -> Published:
    keys = LocalKeyFile.create(tmp_path / "master.key")
    (tmp_path / "repo").mkdir()
    store = CountingStore(tmp_path / "repo")
    store.heads = []
    # The pipeline requires a KMS repository; the local key file stands in for KMS (same KeyService port).
    repository = Repository.create(store, RepositoryConfig.new({"type": "kms", "key_id": keys.key_id}, utc_now()))
    ref = BackupRef.new("db")
    stage_stream(store, ref, repository.config.id, DATA, chunk=CHUNK, segment_chunks=SEGMENT_PARTS)
    prepare_backup(store, keys, ref)
    key, _ = load_data_key(store, keys, ref, repository.config.id)
    lanes = ChunkLanes(2)
    while (status := plan_next_round(store, ref, max_concurrency=1, max_chunks_per_item=SEGMENT_PARTS, poll_seconds=1, stall_seconds=60)).status != "done":
        assert status.status == "ready", status
        for item in StagingArea(store, ref).read_rounds()[-1].items:
            process_item(store, ref, item, key=key, level=3, lanes=lanes)
    finalize_step(store, keys, PlainStoreJanitor(), RecordingPublisher(), ref)
    manifest = open_manifest(store.get(manifest_key(ref)), "manifest").authenticate(key)
    return Published(store, keys, ref, key, manifest)


def restore(p: Published, tmp_path: Path) -> Path:
    out = tmp_path / "restored"
    restore_backup(p.store, p.manifest, p.key, [OutputTarget(str(out), str(out))], workers=2)
    return out


def rewrite(p: Published, key: str, change: bytes) -> None:
    """Replace a stored object behind Braid's back (storage corruption, or tampering)."""
    (p.store.root / key).chmod(0o644)
    (p.store.root / key).write_bytes(change)


def test_the_worker_stores_runs_of_chunks_per_pack_and_a_restore_is_byte_identical(published: Published, tmp_path: Path) -> None:
    objects = stored_objects(published.manifest)
    assert 2 <= K < SEGMENT_PARTS and LAYOUT == [4, 4, 4, 4, 3]
    firsts = [sum(LAYOUT[:n]) for n in range(len(LAYOUT))]
    assert [o.chunks for o in objects] == [tuple(range(first, first + size)) for first, size in zip(firsts, LAYOUT, strict=True)]
    assert [info.key for info in published.store.list(data_prefix(published.ref))] == [o.key for o in objects]
    for stored in objects:  # each pack is its frames back to back, with the checksum S3 would compute of it
        raw = published.store.get(stored.key)
        assert len(raw) == stored.size and stored_checksum(raw) == stored.checksum
    assert restore(published, tmp_path).read_bytes() == DATA
    deep = verify_backup(published.store, published.manifest, published.key, deep=True)
    assert deep.ok and deep.chunks_checked == CHUNKS, deep.failures


def test_quick_verify_checks_each_pack_once(published: Published) -> None:
    published.store.heads.clear()
    report = verify_backup(published.store, published.manifest, None, deep=False)
    assert report.ok and (report.chunks_checked, report.bytes_checked) == (CHUNKS, len(DATA)), report.failures
    assert published.store.heads == [o.key for o in stored_objects(published.manifest)]  # one HEAD per pack, not per chunk
    assert len(published.store.heads) == len(LAYOUT)


def test_a_flipped_byte_in_a_packs_second_frame_is_caught_and_the_chunk_named(published: Published, tmp_path: Path) -> None:
    pack = chunk_key(published.ref, FIRST)
    second = next(c for c in published.manifest.chunks() if c.index == FIRST + 1)
    raw = bytearray(published.store.get(pack))
    raw[second.pack_offset + second.stored_length // 2] ^= 0x01
    rewrite(published, pack, bytes(raw))

    deep = verify_backup(published.store, published.manifest, published.key, deep=True)
    assert deep.failures == [f"chunk {FIRST + 1} of backup {published.ref}: stored size or checksum mismatch (corrupt in the repository)"]
    assert deep.chunks_checked == CHUNKS - 1
    quick = verify_backup(published.store, published.manifest, None, deep=False)
    assert quick.failures == [f"pack of chunks {FIRST}-{FIRST + WIDE - 1} of backup {published.ref}: stored checksum mismatch (corrupt in the repository)"]
    with pytest.raises(IntegrityError, match=f"^chunk {FIRST + 1} of backup {published.ref}: failed authentication"):
        restore(published, tmp_path)
    assert not (tmp_path / "restored").exists()


def test_a_missing_pack_stops_a_restore_naming_its_first_chunk(published: Published, tmp_path: Path) -> None:
    published.store.delete([chunk_key(published.ref, FIRST)])  # the second pack
    with pytest.raises(IntegrityError, match=rf"^chunk {FIRST} of backup {published.ref} is missing from the repository \(its pack {chunk_key(published.ref, FIRST)} is gone\)$"):
        restore(published, tmp_path)
    assert not (tmp_path / "restored").exists()
    quick = verify_backup(published.store, published.manifest, None, deep=False)
    second = LAYOUT[1]
    assert quick.failures == [f"pack of chunks {FIRST}-{FIRST + second - 1} of backup {published.ref} is missing from the repository ({chunk_key(published.ref, FIRST)})"]


def test_a_truncated_pack_is_caught_by_size(published: Published, tmp_path: Path) -> None:
    pack = chunk_key(published.ref, SEGMENT_PARTS)  # the second segment's only pack, of its 3 chunks
    raw = published.store.get(pack)
    rewrite(published, pack, raw[:-1])
    expected = f"pack of chunks {SEGMENT_PARTS}-{CHUNKS - 1} of backup {published.ref} is {len(raw) - 1} bytes"
    quick = verify_backup(published.store, published.manifest, None, deep=False)
    assert quick.failures == [f"{expected}, manifest says {len(raw)}"]
    with pytest.raises(IntegrityError, match=f"^{expected} in the repository, the manifest says {len(raw)}; nothing was restored"):
        restore(published, tmp_path)


def tasks(first: int, count: int) -> list[ChunkTask]:
    return [ChunkTask(index=i, input_index=0, offset=i * CHUNK) for i in range(first, first + count)]


def plaintext(task: ChunkTask) -> bytes:
    return DATA[task.offset : task.offset + CHUNK]


def unspent(read: Callable[[ChunkTask], bytes]) -> Callable[[ChunkTask], tuple[bytes, None]]:
    """store_pack's reader for plaintext in buffers the codec must not write over."""
    return lambda task: (read(task), None)


def test_a_late_worker_accepts_its_pack_only_when_it_is_exactly_its_chunks(published: Published) -> None:
    pack = chunk_key(published.ref, FIRST)
    original = published.store.get(pack)
    recorded = [c for c in published.manifest.chunks() if FIRST <= c.index < FIRST + WIDE]
    codec = ChunkCodec(published.key)

    again = store_pack(codec, published.store, published.ref, tasks(FIRST, WIDE), unspent(plaintext))
    assert again == recorded  # the stored frames' own checksums and offsets, though this encoding's nonces differ
    assert published.store.get(pack) == original

    def longer(task: ChunkTask) -> bytes:
        data = plaintext(task)
        # 64 incompressible bytes in place of compressible text: the frame compresses to another length
        return data[:-64] + hashlib.shake_256(b"longer").digest(64) if task.index == FIRST + 1 else data

    last = FIRST + WIDE - 1
    with pytest.raises(IntegrityError, match=rf"^pack {pack} of backup {published.ref} \(chunks {FIRST}-{last}\) already exists with different content: {len(original)} bytes, these chunks encode to"):
        store_pack(codec, published.store, published.ref, tasks(FIRST, WIDE), unspent(longer))
    with pytest.raises(IntegrityError, match=rf"^pack {pack} of backup {published.ref} \(chunks {FIRST}-{last - 1}\) already exists with different content: {len(original)} bytes"):
        store_pack(codec, published.store, published.ref, tasks(FIRST, WIDE - 1), unspent(plaintext))  # grouped otherwise: never accepted
    assert published.store.get(pack) == original


def test_a_late_worker_with_other_plaintext_of_the_same_stored_length_is_refused_by_authentication(published: Published) -> None:
    """Incompressible chunks are stored as they are: a changed byte keeps every frame's length, and only the keyed checksum tells."""
    ref = BackupRef.new("other")
    random = {i: hashlib.shake_256(b"chunk %d" % i).digest(CHUNK) for i in range(3)}
    codec = ChunkCodec(published.key)
    stored = store_pack(codec, published.store, ref, tasks(0, 3), unspent(lambda task: random[task.index]))
    assert [e.compression for e in stored] == ["none"] * 3 and [e.pack_offset for e in stored] == [0, stored[0].stored_length, 2 * stored[0].stored_length]
    original = published.store.get(chunk_key(ref, 0))

    def changed(task: ChunkTask) -> bytes:
        return random[task.index][:-1] + bytes([random[task.index][-1] ^ 1]) if task.index == 1 else random[task.index]

    with pytest.raises(IntegrityError, match=rf"^pack {chunk_key(ref, 0)} of backup {ref} \(chunks 0-2\) already exists with different content: chunk 1 of backup {ref}: plaintext checksum mismatch$"):
        store_pack(codec, published.store, ref, tasks(0, 3), unspent(changed))
    assert published.store.get(chunk_key(ref, 0)) == original
