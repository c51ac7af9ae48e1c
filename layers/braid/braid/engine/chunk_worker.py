"""The chunk worker: the functions that turn plaintext into stored chunks.

The local engine stores each chunk as its own object (`store_chunk`, from its
thread pool: a disk bills no request, and a lone chunk restores through
reused buffers). The Lambda worker stores a few consecutive chunks as one
*pack* (`store_pack`, docs/format.md, Packs): S3 bills a PUT per object, so
k chunks per object divide that cost by k. A pack of one chunk is exactly
what `store_chunk` writes; both produce the same frames.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from braid.errors import AlreadyExistsError, IntegrityError
from braid.format.buffers import WritableBuffer
from braid.format.checksum import stored_checksum
from braid.format.chunk import Buffer, ChunkCodec, EncodedChunk, compression_name
from braid.format.ids import BackupRef
from braid.format.layout import chunk_key
from braid.format.manifest import ChunkEntry
from braid.format.stored import pack_checksum
from braid.ports.store import ObjectStore, put_pieces


@dataclass(frozen=True)
class ChunkTask:
    """Where one chunk sits in the backup: enough to encode and place it."""

    index: int
    input_index: int
    offset: int


def _entry(task: ChunkTask, length: int, encoded: EncodedChunk, *, pack: int = -1, pack_offset: int = 0) -> ChunkEntry:
    """The manifest entry of a chunk just encoded (`pack` -1: alone in its object)."""
    return ChunkEntry(
        index=task.index,
        input_index=task.input_index,
        offset=task.offset,
        length=length,
        stored_length=encoded.stored_length,
        checksum=encoded.checksum,
        mac=encoded.plaintext_mac,
        compression=compression_name(encoded.compression),
        pack=pack,
        pack_offset=pack_offset,
    )


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
    entry = _entry(task, len(plaintext), encoded)
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


def store_pack(
    codec: ChunkCodec,
    store: ObjectStore,
    ref: BackupRef,
    tasks: Sequence[ChunkTask],
    read: Callable[[ChunkTask], tuple[Buffer, WritableBuffer | None]],
) -> list[ChunkEntry]:
    """Encode consecutive chunks and store their frames back to back as one object, create-only.

    `read` gives each task's plaintext, asked for one at a time, and the
    buffer it lies in if the codec may write the frame over it (the caller
    then gives each chunk of the pack its own buffer), else None. A frame
    left in the codec's reused buffer (no such buffer, or a chunk stored
    uncompressed) is copied out unless it is the last, since the next encode
    overwrites it. See `put_pack` for the object and a retried pack.
    """
    frames = []
    for position, task in enumerate(tasks):
        plaintext, spent = read(task)
        frames.append(encode_frame(codec, ref, task, plaintext, spent, keep=position < len(tasks) - 1))
    return put_pack(lambda: codec, store, ref, frames)


def encode_frame(
    codec: ChunkCodec, ref: BackupRef, task: ChunkTask, plaintext: Buffer, spent: WritableBuffer | None, *, keep: bool = True
) -> tuple[ChunkEntry, Buffer]:
    """One chunk of a pack, encoded: its entry (placed in its pack by `put_pack`) and its frame.

    The frame is written over `spent` where it fits (the caller's buffer,
    which then holds it until the pack's PUT); `keep`: a frame left in the
    codec's own buffer is copied out, since the codec's next encode reuses it.
    """
    encoded = codec.encode(str(ref), task.index, task.input_index, plaintext, spent=spent)
    return _entry(task, len(plaintext), encoded), _kept(encoded.stored, spent, last=not keep)


def put_pack(codec: Callable[[], ChunkCodec], store: ObjectStore, ref: BackupRef, frames: Sequence[tuple[ChunkEntry, Buffer]]) -> list[ChunkEntry]:
    """Store encoded consecutive chunks (`encode_frame`) back to back as one object, create-only; their entries, placed.

    The object is sent from the frames' own buffers without joining them
    (braid.ports.store.put_pieces). The pack's key is its first chunk's.

    If the pack already exists (a retried or late worker), it is accepted
    only if it is exactly these chunks: frames of the same lengths (zstd at
    one level is deterministic, so the same plaintext compresses to the same
    length whatever the nonce), each authenticating under this backup's key
    as the same plaintext. Then the existing frames' sizes and checksums are
    reported. Anything else is an IntegrityError, and the object is left as
    it is. `codec` gives the codec that check decodes with (only then).
    """
    if not frames:
        return []
    first = frames[0][0].index
    entries: list[ChunkEntry] = []
    offset = 0
    for entry, _ in frames:
        entries.append(replace(entry, pack=first, pack_offset=offset))
        offset += entry.stored_length
    key = chunk_key(ref, first)
    checksum = pack_checksum((e.checksum, e.stored_length) for e in entries)
    try:
        put_pieces(store, key, [frame for _, frame in frames], checksum=checksum, create_only=True)
        return entries
    except AlreadyExistsError:
        return _existing_pack(codec(), store, ref, key, entries)


def _kept(frame: memoryview, spent: WritableBuffer | None, last: bool) -> Buffer:
    """The frame where it stays valid until the pack's PUT: the caller's buffer (written over by the codec,
    or, for a chunk stored uncompressed, copied there once its plaintext was encrypted), else a copy
    unless it is the last (the codec's own buffer is overwritten by the next encode)."""
    if spent is not None:
        if frame.obj is spent:
            return frame
        if len(spent) >= len(frame):
            kept = memoryview(spent)[: len(frame)]
            kept[:] = frame
            return kept
    return frame if last else bytes(frame)


def _existing_pack(codec: ChunkCodec, store: ObjectStore, ref: BackupRef, key: str, entries: list[ChunkEntry]) -> list[ChunkEntry]:
    """The entries of an already stored pack, if it holds exactly these chunks (see store_pack); else IntegrityError."""
    existing = memoryview(store.get(key))
    what = f"pack {key} of backup {ref} (chunks {entries[0].index}-{entries[-1].index})"
    total = sum(e.stored_length for e in entries)
    if len(existing) != total:
        raise IntegrityError(f"{what} already exists with different content: {len(existing)} bytes, these chunks encode to {total}")
    found = []
    for entry in entries:
        frame = existing[entry.pack_offset : entry.pack_offset + entry.stored_length]
        try:
            codec.decode(
                frame, backup=str(ref), index=entry.index, input_index=entry.input_index, plaintext_length=entry.length, plaintext_mac=entry.mac
            )
        except IntegrityError as exc:
            raise IntegrityError(f"{what} already exists with different content: {exc}") from None
        header = codec.peek_header(frame, key)
        found.append(replace(entry, checksum=stored_checksum(frame), compression=compression_name(header.compression)))
    return found
