"""Large reusable buffers (chunk-sized: 64 MiB by default), mapped rather than zero-filled.

`bytearray(n)` zero-fills all n bytes one page fault at a time while
holding the GIL, so no other thread can hand a chunk to a worker meanwhile.
Here an anonymous mapping is made through ctypes (which releases the GIL
around the call) and its pages populated in a few calls, or left to fault
in where the buffer is filled by a call that releases the GIL anyway (a
read from disk). Pages are given back on a background thread, not in the
middle of publishing a backup. (Measured costs, and why not `mmap.mmap`
or huge pages: docs/design/2026-11-cloud-figures.md.)

Callers size buffers by what they will fill, and reuse them from chunk to
chunk: a buffer is made once per worker or pool slot.
"""

from __future__ import annotations

import mmap
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

WritableBuffer = bytearray | mmap.mmap | memoryview
"""What the codec, the stores and the pools write into: a bytearray, or a mapped buffer (a byte memoryview)."""

_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
_MADV_POPULATE_WRITE = 23  # Linux 5.14
_POPULATE_STEP = 4 * 1024 * 1024
_SMALL = 64 * 1024  # below this a mapping's system calls cost more than zero-filling

_lock = threading.Lock()
_mapper: Callable[[int, bool], memoryview] | None = None
_mapper_tried = False


class _ReadsInto(Protocol):
    def readinto(self, buffer: Any, /) -> int | None: ...


def read_full(handle: _ReadsInto, view: memoryview) -> int:
    """Fill `view` from `handle` unless its end comes first; the bytes read.

    Files and pipes may return short reads, so one `readinto` is not enough;
    every reader of a whole chunk (the stream cutter, the local store) fills
    its buffer through this.
    """
    filled = 0
    while filled < len(view):
        n = handle.readinto(view[filled:])
        if not n:
            break
        filled += n
    return filled


def new_buffer(size: int, *, populate: bool = True) -> WritableBuffer:
    """A writable buffer of `size` zero bytes.

    `populate`: its pages are made now, as cheaply as the kernel can (the
    buffer will be filled); otherwise each page is made when first written,
    for buffers that are often filled only in part or by a slow read.
    """
    if size < _SMALL:
        return bytearray(size)
    mapper = _ctypes_mapper()
    if mapper is None:  # no libc through ctypes: the same mapping, made holding the GIL
        return mmap.mmap(-1, size, flags=_FLAGS | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0))
    return mapper(size, populate)


def grown(old: WritableBuffer, size: int, bound: int, *, populate: bool = True) -> WritableBuffer:
    """A reusable buffer for `size` bytes in place of `old`, which is too small.

    For buffers that hold a compressed chunk, whose size is known only
    chunk by chunk, up to `bound`: the first is an eighth larger than the
    chunk needs (a stream's chunks compress alike, and pages never made
    cost nothing, where a full chunk's would cost as much again for data
    that is half its size); a later one is `bound`, so it is the last.
    """
    if len(old):
        return new_buffer(max(size, bound), populate=populate)
    return new_buffer(max(size, min(bound, size + size // 8)), populate=populate)


def _ctypes_mapper() -> Callable[[int, bool], memoryview] | None:
    global _mapper, _mapper_tried
    if _mapper_tried:
        return _mapper
    with _lock:
        if not _mapper_tried:
            _mapper = _load_ctypes_mapper()
            _mapper_tried = True
    return _mapper


def _load_ctypes_mapper() -> Callable[[int, bool], memoryview] | None:
    """libc's mmap through ctypes (which releases the GIL around foreign calls), or None."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        c_mmap: Any = libc.mmap
        c_munmap: Any = libc.munmap
        c_madvise: Any = libc.madvise
    except (ImportError, OSError, AttributeError):
        return None
    c_mmap.restype = ctypes.c_void_p
    c_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    c_munmap.restype = ctypes.c_int
    c_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    c_madvise.restype = ctypes.c_int
    c_madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    failed = ctypes.c_void_p(-1).value
    protection = mmap.PROT_READ | mmap.PROT_WRITE
    unmapping: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()

    def unmap_forever() -> None:
        while True:
            address, size = unmapping.get()
            # A step at a time, as pages are populated: munmap holds the memory
            # map lock for writing, and a thread being started meanwhile (the
            # publishing step starts a few) waited for all 64 MiB.
            for offset in range(0, size, _POPULATE_STEP):
                c_munmap(address + offset, min(_POPULATE_STEP, size - offset))

    unmapper = threading.Thread(target=unmap_forever, name="braid-unmap", daemon=True)
    unmapper.start()

    def mapped(size: int, populate: bool) -> memoryview:
        address = c_mmap(None, size, protection, _FLAGS, -1, 0)
        if address is None or address == failed:
            raise MemoryError(f"cannot map {size} bytes: {ctypes.get_errno()}")
        # Populated a step at a time: the kernel holds the process's memory
        # map lock while it populates, and a thread being started (its
        # stack is a mapping) would wait for all 64 MiB (measured: a worker
        # started 30 ms late). Before Linux 5.14 the pages fault in on use.
        for offset in range(0, size if populate else 0, _POPULATE_STEP):
            if c_madvise(address + offset, min(_POPULATE_STEP, size - offset), _MADV_POPULATE_WRITE) != 0:
                break
        array = (ctypes.c_ubyte * size).from_address(address)
        # Unmapped (by the background thread) once nothing refers to it:
        # every view of the returned memoryview keeps `array` alive. Never
        # at exit, when a daemon thread may still be reading into it: the
        # process's end frees it.
        weakref.finalize(array, unmapping.put, (address, size)).atexit = False
        return memoryview(array).cast("B")

    return mapped
