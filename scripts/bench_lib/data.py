"""The shared benchmark data set: a deterministic, database-like byte stream.

What it looks like, per 8 KiB page, interleaved in runs:

- database pages (~70%): a page header (LSN, checksum, flags, free-space
  pointers), a line-pointer array, row-like tuples (tuple header, sequential
  ids, timestamps, amounts, status codes, and text drawn from a fixed
  vocabulary of pseudo-words) packed from the end of the page, and free space
  (zeros) in between. These compress ~3x with `zstd -3`.
- random regions (~30%): runs of incompressible bytes standing in for
  encrypted columns and already-compressed LOBs.

Pages come from a pool of distinct pages generated once (larger than zstd -3's
2 MiB window, so a repeated pool page is almost never in reach), and every
page written gets a fresh header and a few mutated bytes in its tuples, so no
two pages of the file are identical.

It is deterministic: the same seed and size give the same bytes on every
machine (Python's `random.Random` for decisions; AES-256-CTR keystream under a
key derived from the seed for the random bytes, which runs at GB/s where
`random.randbytes` manages a few hundred MB/s). A 512 MiB file takes a few
seconds; it is cached in the work directory by size, seed and generator
version.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import struct
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

GENERATOR_VERSION = 1
PAGE = 8192
POOL_PAGES = 2048  # 16 MiB of distinct pages, 8x zstd -3's window
RANDOM_SHARE = 0.30
_WRITE_BLOCK = 16 << 20

_PAGE_HEADER = struct.Struct("<QHHHHHHI")  # lsn, checksum, flags, lower, upper, special, version, prune xid
_LINE_POINTER = struct.Struct("<HH")
_TUPLE_HEADER = struct.Struct("<IIIHHHHHB")  # xmin, xmax, cid, ctid block hi/lo, ctid pos, infomask2, infomask, hoff
_ROW_FIXED = struct.Struct("<qiqiH")  # id, customer, created (µs), amount (cents), status


@dataclass(frozen=True)
class DataSet:
    path: Path
    size: int
    seed: int
    random_bytes: int
    page_bytes: int
    generation_seconds: float | None  # None when taken from the cache

    @property
    def random_share(self) -> float:
        return self.random_bytes / self.size if self.size else 0.0

    def describe(self) -> dict[str, object]:
        doc = asdict(self)
        doc["path"] = str(self.path)
        doc["random_share"] = round(self.random_share, 4)
        doc["generator_version"] = GENERATOR_VERSION
        return doc


class _Keystream:
    """Deterministic random bytes: AES-256-CTR over zeros under a seeded key."""

    def __init__(self, seed: int, label: bytes) -> None:
        key = hashlib.sha256(b"braid-bench/%d/" % seed + label).digest()
        self._enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        self._zeros = bytes(1 << 20)

    def read(self, n: int) -> bytes:
        if n <= len(self._zeros):
            return self._enc.update(memoryview(self._zeros)[:n])
        return b"".join(self.read(min(n - i, len(self._zeros))) for i in range(0, n, len(self._zeros)))


def _vocabulary(rng: random.Random, n: int = 3000) -> list[bytes]:
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou", "er", "an", "in")]
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(syllables) for _ in range(rng.choice((1, 2, 2, 3, 3, 4)))))
    return sorted(w.encode() for w in words)


class _PageMaker:
    """Builds distinct database-like pages for the pool."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.words = _vocabulary(rng)
        # Zipf-ish word popularity: common words dominate, as in real text columns.
        self.cum_weights = list(itertools.accumulate(1.0 / (i + 1) ** 0.9 for i in range(len(self.words))))
        self.row_id = rng.randrange(1, 1 << 40)
        self.clock = 1_700_000_000_000_000 + rng.randrange(1 << 36)
        self.cities = [b"Amsterdam", b"Berlin", b"Chicago", b"Lisbon", b"Osaka", b"Toronto", b"Nairobi", b"Lima"]
        self.statuses = [b"NEW", b"PAID", b"SHIPPED", b"CANCELLED", b"RETURNED"]

    def _row(self, block: int, pos: int) -> bytes:
        rng = self.rng
        self.row_id += 1
        self.clock += rng.randrange(1, 5_000_000)
        text = b" ".join(rng.choices(self.words, cum_weights=self.cum_weights, k=rng.randrange(3, 14)))
        email = rng.choice(self.words) + b"." + rng.choice(self.words) + b"@example.com"
        status = rng.randrange(len(self.statuses))
        varlena = b"".join(
            (
                bytes((len(text) + 1,)) if len(text) < 127 else struct.pack("<H", len(text) | 0x8000),
                text,
                bytes((len(email),)),
                email,
                rng.choice(self.cities),
                b"\x00",
                self.statuses[status],
            )
        )
        header = _TUPLE_HEADER.pack(
            rng.randrange(1_000_000, 1_050_000), 0, 0, block >> 16, block & 0xFFFF, pos, 7, 0x0902, 24
        )
        fixed = _ROW_FIXED.pack(self.row_id, rng.randrange(1, 250_000), self.clock, rng.randrange(100, 2_000_000), status)
        return header + fixed + varlena

    def page(self, block: int) -> bytes:
        rng = self.rng
        free = rng.randrange(0, PAGE // 5)  # leave 0-20% free space between pointers and tuples
        rows: list[bytes] = []
        upper = PAGE
        lower = _PAGE_HEADER.size
        while True:
            row = self._row(block, len(rows) + 1)
            size = (len(row) + 7) & ~7
            if upper - size < lower + _LINE_POINTER.size * (len(rows) + 1) + free:
                break
            upper -= size
            rows.append(row.ljust(size, b"\x00"))
        lower += _LINE_POINTER.size * len(rows)
        page = bytearray(PAGE)
        offset = PAGE
        pointers = []
        for row in rows:
            offset -= len(row)
            page[offset : offset + len(row)] = row
            pointers.append(_LINE_POINTER.pack(offset, len(row)))
        page[_PAGE_HEADER.size : lower] = b"".join(pointers)
        page[: _PAGE_HEADER.size] = _PAGE_HEADER.pack(0, 0, 0, lower, upper, PAGE, 0x2004, 0)
        return bytes(page)


def _generate(path: Path, size: int, seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    noise = _Keystream(seed, b"random-regions")
    maker = _PageMaker(random.Random(seed * 7919 + 1))
    pool = [maker.page(i) for i in range(POOL_PAGES)]
    written = random_bytes = page_bytes = 0
    lsn = rng.randrange(1 << 40)
    block = 0
    out = bytearray()
    mutations = noise.read(1 << 20)  # bytes for per-page mutations, reused cyclically with offsets
    m = 0
    last_run = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as handle:
        while written < size:
            # A run of pages, then a random region sized to keep the random share near RANDOM_SHARE.
            pages = min(rng.randrange(8, 512), (size - written + PAGE - 1) // PAGE)
            for _ in range(pages):
                page = bytearray(rng.choice(pool))
                lsn += rng.randrange(1, 1 << 16)
                block += 1
                page[:12] = struct.pack("<QHH", lsn, rng.randrange(1 << 16), 0)
                # Updated columns: a few 8-byte spots in the tuple area change per page.
                upper = struct.unpack_from("<H", page, 14)[0]
                for _ in range(rng.randrange(4, 12)):
                    at = rng.randrange(upper, PAGE - 8)
                    page[at : at + 8] = mutations[m : m + 8]
                    m = (m + 8) % (len(mutations) - 8)
                out += page
            page_bytes += pages * PAGE
            run = int(pages * PAGE * RANDOM_SHARE / (1 - RANDOM_SHARE) * rng.uniform(0.5, 1.5))
            run = max(PAGE, run - run % PAGE)
            out += noise.read(run)
            random_bytes += run
            last_run = run
            written += pages * PAGE + run
            if len(out) >= _WRITE_BLOCK or written >= size:
                handle.write(out)
                out.clear()
        handle.truncate(size)
    overshoot = written - size
    random_bytes -= min(overshoot, last_run)
    os.replace(tmp, path)
    return random_bytes, size - random_bytes


def ensure_dataset(workdir: Path, size: int, seed: int, log=lambda msg: None) -> DataSet:
    """The cached data file for (size, seed), generated if missing."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"data-v{GENERATOR_VERSION}-seed{seed}-{size}.bin"
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists() and path.stat().st_size == size:
        doc = json.loads(meta.read_text())
        return DataSet(path, size, seed, int(doc["random_bytes"]), int(doc["page_bytes"]), None)
    log(f"generating {size / 2**20:.0f} MiB of benchmark data (seed {seed}) in {path} ...")
    started = time.perf_counter()
    random_bytes, page_bytes = _generate(path, size, seed)
    elapsed = time.perf_counter() - started
    meta.write_text(json.dumps({"random_bytes": random_bytes, "page_bytes": page_bytes, "seconds": elapsed}) + "\n")
    log(f"generated in {elapsed:.1f} s ({random_bytes / size:.0%} random)")
    return DataSet(path, size, seed, random_bytes, page_bytes, elapsed)
