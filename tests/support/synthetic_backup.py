"""A real, complete backup written directly (chunks, then Finalize's publish), started at a chosen time.

Retention is judged by the start time a backup's id records; a calendar of
backups through the CLI would need a clock that can be set. These are the
same objects a backup writes (encoded chunks, summary, log marker, sealed
manifest), on any repository and key service.
"""

from __future__ import annotations

import os
from datetime import datetime

from braid.engine.chunk_worker import ChunkTask, store_chunk
from braid.engine.finalize import InputRecord, finalize_backup
from braid.format.chunk import ChunkCodec
from braid.format.ids import BackupRef
from braid.format.keys import encryption_context
from braid.format.pg_backup import WalInfo
from braid.format.repository import Repository
from braid.format.timestamps import utc_now
from braid.ports.keys import KeyService

CHUNK = 1024


def write_backup(repository: Repository, keys: KeyService, name: str, when: datetime, chunks: int = 1, wal: WalInfo | None = None) -> BackupRef:
    """`wal`: the manifest's `wal` field (where a PostgreSQL base backup's WAL starts), recorded as it is."""
    ref = BackupRef.new(name, now=when)
    key, wrapped = keys.generate_data_key(encryption_context(repository.config.id, str(ref)))
    codec = ChunkCodec(key, 3)
    entries = [store_chunk(codec, repository.store, ref, ChunkTask(i, 0, i * CHUNK), os.urandom(CHUNK)) for i in range(chunks)]
    finalize_backup(
        repository.store, ref=ref, repository_id=repository.config.id, key=key, wrapped=wrapped, chunk_size=CHUNK,
        inputs=[InputRecord(0, "stdin", CHUNK * chunks)], entries=entries, level=3, created=utc_now(), timings={}, engine="local", wal=wal,
    )
    return ref
