"""codec: the worker's chunk codec on one thread vs the zstd CLI on one thread.

Ours: `ChunkCodec.encode` over the data set cut into --chunk-size chunks (the
data is read into memory first, so no I/O is timed), one thread. That is
Poly1305 plaintext MAC + zstd + AES-256-GCM. The `worker` row adds the stored
checksum (CRC64NVME) that `store_chunk` computes for the object store.
Reference: `zstd -3 -T1 -c FILE > /dev/null` (the file is in the page cache).
Decode: `ChunkCodec.decode` (GCM decrypt, zstd decompress, Poly1305 check) vs
`zstd -d -T1 -c FILE.zst > /dev/null`.

A component breakdown (CPU seconds per GiB of plaintext for each step, timed
the same way the codec runs it) follows, so a miss can be attributed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import zstandard
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from bench_lib.context import Context, add_engine_options
from bench_lib.report import MB, Comparison, Section, Table
from bench_lib.timing import Series, interleave, measure, run_command
from braid.format.checksum import stored_checksum
from braid.format.chunk import NONCE_BYTES, TAG_BYTES, ChunkCodec
from braid.format.ids import BackupRef
from braid.format.keys import DataKey

NAME = "codec"
HELP = "ChunkCodec encode/decode on one thread vs zstd -3 -T1 / zstd -d -T1"
ORDER = 10
IN_ALL = True
TARGET = 0.90


def add_arguments(parser) -> None:
    add_engine_options(parser)
    parser.add_argument("--no-breakdown", action="store_true", help="codec: skip the per-component breakdown")


def _read(path: Path, size: int) -> bytearray:
    buf = bytearray(size)
    with open(path, "rb", buffering=0) as handle:
        view, got = memoryview(buf), 0
        while got < size:
            n = handle.readinto(view[got:])
            if not n:
                raise RuntimeError(f"{path} is shorter than {size} bytes")
            got += n
    return buf


def _reference_frame(ctx: Context, path: Path, level: int) -> Path:
    """The data set compressed by the zstd CLI, for the decode reference (cached)."""
    target = ctx.scratch("codec") / f"{path.stem}.l{level}.zst"
    if not target.exists() or target.stat().st_mtime < path.stat().st_mtime:
        tmp = target.with_suffix(".tmp")
        run_command(["zstd", f"-{level}", "-T1", "-q", "-c", str(path)], stdout=tmp)
        os.replace(tmp, target)
    return target


def run(ctx: Context) -> Section:
    args = ctx.args
    data = ctx.dataset()
    level, chunk_size = args.level, args.chunk_size
    section = Section(NAME, f"chunk codec, one thread, {chunk_size // 2**20} MiB chunks, zstd level {level}")

    buf = _read(data.path, data.size)
    view = memoryview(buf)
    chunks = [view[i : i + chunk_size] for i in range(0, data.size, chunk_size)]
    key = DataKey(os.urandom(32))
    codec = ChunkCodec(key, level)
    ref = str(BackupRef.new("bench"))
    reference_zst = _reference_frame(ctx, data.path, level)

    # Warm-up (allocates the codec's reusable output buffer) and the stored copies for decode.
    stored: list[tuple[bytes, bytes]] = []
    stored_bytes = 0
    for i, chunk in enumerate(chunks):
        encoded = codec.encode(ref, i, 0, chunk)
        stored.append((bytes(encoded.stored), encoded.plaintext_mac))
        stored_bytes += encoded.stored_length

    def encode_all() -> None:
        for i, chunk in enumerate(chunks):
            codec.encode(ref, i, 0, chunk)

    def worker_all() -> None:
        for i, chunk in enumerate(chunks):
            stored_checksum(codec.encode(ref, i, 0, chunk).stored)

    def decode_all() -> None:
        for i, (blob, mac) in enumerate(stored):
            codec.decode(blob, backup=ref, index=i, input_index=0, plaintext_length=len(chunks[i]), plaintext_mac=mac)

    enc_ours, enc_worker, enc_ref = Series(), Series(), Series()
    dec_ours, dec_ref = Series(), Series()
    zstd_enc = ["zstd", f"-{level}", "-T1", "-q", "-c", str(data.path)]
    zstd_dec = ["zstd", "-d", "-T1", "-q", "-c", str(reference_zst)]

    ctx.log(f"codec: encode, {ctx.reps} interleaved repetitions ...")
    interleave(
        ctx.reps,
        [
            lambda: enc_ours.add(measure(encode_all)[0]),
            lambda: enc_ref.add(run_command(zstd_enc)),
            lambda: enc_worker.add(measure(worker_all)[0]),
        ],
    )
    ctx.log(f"codec: decode, {ctx.reps} interleaved repetitions ...")
    interleave(ctx.reps, [lambda: dec_ours.add(measure(decode_all)[0]), lambda: dec_ref.add(run_command(zstd_dec))])

    ours_label = f"ChunkCodec.encode x{len(chunks)} chunks, 1 thread"
    section.comparisons = [
        Comparison("encode", ours_label, " ".join(zstd_enc[:-1]) + " FILE >/dev/null", data.size, enc_ours, enc_ref, TARGET),
        Comparison("worker encode", ours_label + " + CRC64NVME", " ".join(zstd_enc[:-1]) + " FILE >/dev/null", data.size, enc_worker, enc_ref),
        Comparison("decode", f"ChunkCodec.decode x{len(chunks)} chunks, 1 thread", " ".join(zstd_dec[:-1]) + " FILE.zst >/dev/null", data.size, dec_ours, dec_ref),
    ]
    ref_size = reference_zst.stat().st_size
    section.facts = {
        "stored bytes (codec)": stored_bytes,
        "zstd CLI frame bytes": ref_size,
        "stored / zstd CLI size": round(stored_bytes / ref_size, 4),
        "compression ratio (plaintext / stored)": round(data.size / stored_bytes, 3),
    }
    if not args.no_breakdown:
        ctx.log("codec: per-component breakdown ...")
        section.tables.append(_breakdown(ctx, key, codec, ref, chunks, stored, enc_ref, dec_ref, data.size))
    return section


def _breakdown(ctx, key: DataKey, codec: ChunkCodec, ref: str, chunks, stored, enc_ref: Series, dec_ref: Series, nbytes: int) -> Table:
    """Each step of encode and decode alone, and the whole codec call, chunk by chunk.

    Per repetition and chunk, every step runs back to back on the same chunk
    (so they share the machine's state at that moment); each (step, chunk)
    keeps its least thread CPU time over the repetitions, and the table sums
    those over the chunks. The whole-call rows are measured the same way, so
    "other" (what the steps do not explain) is a like-for-like difference.
    """
    compressor = zstandard.ZstdCompressor(level=codec.level)
    decompressor = zstandard.ZstdDecompressor()
    aead = AESGCM(key.encryption_key)
    nonce, aad = os.urandom(NONCE_BYTES), b"h" * 64
    payloads = [compressor.compress(c) for c in chunks]
    sealed = [aead.encrypt(nonce, p, aad) for p in payloads]
    out = bytearray(max(len(p) for p in payloads) + TAG_BYTES)
    plain_out = bytearray(max(len(c) for c in chunks))

    steps: list[tuple[str, str, object]] = [
        ("encode", "= ChunkCodec.encode (whole call)", lambda i: codec.encode(ref, i, 0, chunks[i])),
        ("encode", "Poly1305 plaintext MAC", lambda i: key.chunk_mac(i, chunks[i])),
        ("encode", f"zstd compress level {codec.level} (one-shot; encode streams into a reused buffer)", lambda i: compressor.compress(chunks[i])),
        ("encode", "AES-256-GCM encrypt_into (reused buffer)", lambda i: aead.encrypt_into(nonce, payloads[i], aad, memoryview(out)[: len(payloads[i]) + TAG_BYTES])),
        ("worker", "CRC64NVME stored checksum (store_chunk, not encode)", lambda i: stored_checksum(stored[i][0])),
        ("decode", "= ChunkCodec.decode (whole call)", lambda i: codec.decode(stored[i][0], backup=ref, index=i, input_index=0, plaintext_length=len(chunks[i]), plaintext_mac=stored[i][1])),
        ("decode", "AES-256-GCM decrypt_into (reused buffer, as decode does)", lambda i: aead.decrypt_into(nonce, sealed[i], aad, memoryview(plain_out)[: len(sealed[i]) - TAG_BYTES])),
        ("decode", "zstd decompress (one-shot; decode streams into a reused buffer)", lambda i: decompressor.decompress(payloads[i])),
        ("decode", "Poly1305 plaintext MAC check", lambda i: key.chunk_mac(i, chunks[i])),
    ]
    best = [[float("inf")] * len(chunks) for _ in steps]
    for _rep in range(ctx.reps):
        for i in range(len(chunks)):
            for s, (_phase, _name, fn) in enumerate(steps):
                cpu0 = time.thread_time()
                fn(i)  # type: ignore[operator]
                best[s][i] = min(best[s][i], time.thread_time() - cpu0)
    cpu = {name: sum(best[s]) for s, (_p, name, _f) in enumerate(steps)}
    gib = nbytes / 2**30
    enc_total = cpu["= ChunkCodec.encode (whole call)"]
    dec_total = cpu["= ChunkCodec.decode (whole call)"]
    rows: list[list[object]] = []

    def row(phase: str, name: str, seconds: float, total: float | None) -> None:
        rate = round(nbytes / seconds / MB, 1) if seconds > 0 and not name.startswith("other") else ""
        rows.append([phase, name, round(seconds / gib, 3), rate, f"{seconds / total:.1%}" if total else ""])

    for phase, name, _fn in steps:
        total = enc_total if phase in ("encode", "worker") else dec_total
        row(phase, name, cpu[name], total)
        if name.startswith("AES-256-GCM encrypt_into"):
            parts = sum(cpu[n] for p, n, _ in steps if p == "encode" and not n.startswith("="))
            row("encode", "other (header, nonce, Python; < 0: steps cost more alone)", enc_total - parts, enc_total)
        if name.startswith("Poly1305 plaintext MAC check"):
            parts = sum(cpu[n] for p, n, _ in steps if p == "decode" and not n.startswith("="))
            row("decode", "other (header, checks; < 0: steps cost more alone)", dec_total - parts, dec_total)
    row("ref", "zstd -T1 CLI compress (child CPU, from the comparison)", enc_ref.best_cpu, enc_total)
    row("ref", "zstd -d -T1 CLI decompress (child CPU, from the comparison)", dec_ref.best_cpu, dec_total)
    return Table(
        "breakdown: CPU seconds per GiB of plaintext, least per chunk over the reps; share = of the whole encode/decode call",
        ["phase", "step", "cpu s/GiB", "MB/cpu-s", "share"],
        rows,
    )
