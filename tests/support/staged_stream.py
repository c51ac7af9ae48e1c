"""A stream staged as the cloud agent leaves it: the session, its segments with their part CRCs, and the stream end.

For tests that run the pipeline's steps (plan, worker, Finalize) over a
store without an agent; one input, `segment_chunks` chunks per segment.
"""

from __future__ import annotations

from pathlib import Path

from braid.adapters.local.keys import LocalKeyFile
from braid.adapters.local.store import LocalStore
from braid.format.checksum import crc64nvme, encode_crc64nvme, stored_checksum
from braid.format.ids import BackupRef
from braid.format.repository import Repository, RepositoryConfig
from braid.format.staging import SegmentRecord, SessionRecord, StagingArea, StreamEnd, segment_key
from braid.format.timestamps import utc_now
from braid.ports.store import ObjectStore


def kms_repository(tmp_path: Path) -> tuple[LocalStore, LocalKeyFile, str]:
    """A local repository of the kind the pipeline requires (KMS; the local key file stands in for KMS): store, keys, id."""
    keys = LocalKeyFile.create(tmp_path / "master.key")
    (tmp_path / "repo").mkdir()
    store = LocalStore(tmp_path / "repo")
    repository = Repository.create(store, RepositoryConfig.new({"type": "kms", "key_id": keys.key_id}, utc_now()))
    return store, keys, repository.config.id


def stage_stream(store: ObjectStore, ref: BackupRef, repository_id: str, data: bytes, *, chunk: int, segment_chunks: int) -> None:
    area = StagingArea(store, ref)
    area.write_session(SessionRecord(str(ref), repository_id, chunk, segment_chunks, 3, ["pipe0"], utc_now()))
    size = chunk * segment_chunks
    offsets = range(0, len(data), size)
    for number, offset in enumerate(offsets):
        segment = data[offset : offset + size]
        key = segment_key(ref, 0, number)
        store.put(key, segment)
        parts = [encode_crc64nvme(crc64nvme(segment[p : p + chunk])) for p in range(0, len(segment), chunk)]
        area.write_segment_record(SegmentRecord(0, number, key, offset, len(segment), len(parts), stored_checksum(segment), parts))
    area.write_stream_end(StreamEnd([len(data)], [len(offsets)]))
