"""The chunk worker: the one function that turns plaintext into a stored chunk.

The local engine calls it from its thread pool and the Lambda worker calls it
once per map item, so both paths store byte-for-byte the same format.
"""

from __future__ import annotations

from dataclasses import dataclass

from braid.errors import AlreadyExistsError, IntegrityError
from braid.format.buffers import WritableBuffer
from braid.format.checksum import stored_checksum
from braid.format.chunk import Buffer, ChunkCodec, compression_name
from braid.format.ids import BackupRef
from braid.format.layout import chunk_key
from braid.format.manifest import ChunkEntry
from braid.ports.store import ObjectStore


@dataclass(frozen=True)
class ChunkTask:
    """Where one chunk sits in the backup: enough to encode and place it."""

    index: int
    input_index: int
    offset: int


def store_chunk(
    codec: ChunkCodec,
    store: ObjectStore,
    ref: BackupRef,
    task: ChunkTask,
    plaintext: Buffer,
    *,
    durable: bool = True,
    spent: WritableBuffer | None = None,
) -> ChunkEntry:
    """Encode and store one chunk, create-only.

    `spent`: the buffer holding the plaintext, if the caller lets the codec
    write the stored chunk over it (braid.format.chunk.ChunkCodec.encode).

    If the chunk already exists (a retried or late worker), it is accepted
    only if it authenticates under this backup's key and holds the same
    plaintext; then its own size and checksum are reported, since a second
    encoding differs by its random nonce. Anything else is an error, and the
    existing object is left as it is.
    """
    encoded = codec.encode(str(ref), task.index, task.input_index, plaintext, spent=spent)
    entry = ChunkEntry(
        index=task.index,
        input_index=task.input_index,
        offset=task.offset,
        length=len(plaintext),
        stored_length=encoded.stored_length,
        checksum=encoded.checksum,
        mac=encoded.plaintext_mac,
        compression=compression_name(encoded.compression),
    )
    key = chunk_key(ref, task.index)
    try:
        store.put(key, encoded.stored, checksum=entry.checksum, create_only=True, durable=durable)
        return entry
    except AlreadyExistsError:
        existing = store.get(key)
        try:
            codec.decode(
                existing,
                backup=str(ref),
                index=task.index,
                input_index=task.input_index,
                plaintext_length=entry.length,
                plaintext_mac=entry.mac,
            )
        except IntegrityError as exc:
            raise IntegrityError(f"chunk {task.index} of backup {ref} already exists with different content: {exc}") from None
        header = codec.peek_header(existing, key)
        return ChunkEntry(
            index=task.index,
            input_index=task.input_index,
            offset=task.offset,
            length=entry.length,
            stored_length=len(existing),
            checksum=stored_checksum(existing),
            mac=entry.mac,
            compression=compression_name(header.compression),
        )
