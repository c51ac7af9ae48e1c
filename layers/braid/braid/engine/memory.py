"""How much memory a backup or restore holds, and whether this machine has it.

Both engines bound memory by whole chunk buffers, so `--workers`,
`--concurrency` and `--chunk-size` multiply: `--workers 200` at 64 MiB is
about 13 GiB. A setting the machine cannot hold would end in the OOM killer
(on a database host, possibly the database); one that takes most of it
starves the database. So the CLI asks here before it starts: refuse what
exceeds the machine's memory, warn above half of it.

The pool's size comes from the engines' own `pool_size`, so a change to
how they pool buffers changes the check with it.
"""

from __future__ import annotations

import os
from pathlib import Path

from braid.errors import UsageError

# cgroup v2 (and v1) limits: a container's memory, not the host's.
_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def backup_buffers(inputs: int, workers: int) -> int:
    """Chunk buffers a backup's pool holds at most, as both engines size it
    (`pool_size(inputs, workers + 1)`, braid.engine.stream): one to read
    into per input, and the chunks in flight."""
    from braid.engine.stream import pool_size  # the readers' module: a restore, which checks its memory here too, has none

    return pool_size(inputs, workers + 1)


def local_backup_buffers(inputs: int, workers: int) -> int:
    """Chunk-sized buffers a local backup holds at most: the pool, and per worker
    the codec's two (the zstd frame, the stored chunk; braid.format.chunk),
    which incompressible data fills. Measured: --workers 4 at 16 MiB peaks at
    14 chunks above the interpreter's own memory."""
    return backup_buffers(inputs, workers) + 2 * workers


def cloud_backup_buffers(inputs: int, concurrency: int) -> int:
    """The agent only reads and uploads raw parts: its pool is all it holds."""
    return backup_buffers(inputs, concurrency)


def restore_buffers(outputs: int, workers: int, chunks: int) -> int:
    """Chunk buffers a restore holds at most (braid.ops.restore): a stored chunk per
    decoding thread, and (outputs + workers + 1) plaintext chunks: each output's
    next one, and workers + 1 read ahead. Threads start only as chunks need them."""
    threads = max(1, min(workers, chunks))
    return threads + min(chunks, outputs + workers + 1)


def machine_memory() -> int | None:
    """Physical memory, or the cgroup's limit when lower; None when neither can be read."""
    found: list[int] = []
    try:
        found.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not a POSIX sysconf name here
        pass
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) > 0:
            found.append(int(text))
    return min(found) if found else None


def _size(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"


def check_memory(buffers: int, chunk_size: int, setting: str, available: int | None = None) -> str | None:
    """Refuse (UsageError) a bound above the machine's memory; return a warning above half of it, else None.

    `setting` names what the user can lower, e.g. "--workers 200 with --chunk-size 64 MiB".
    """
    memory = machine_memory() if available is None else available
    if memory is None:
        return None
    needed = buffers * chunk_size
    if needed > memory:
        raise UsageError(
            f"{setting} needs up to {_size(needed)} of chunk buffers ({buffers} x {_size(chunk_size)}),"
            f" more than this machine's {_size(memory)} of memory: lower it"
        )
    if needed > memory // 2:
        return f"{setting} may use up to {_size(needed)} of chunk buffers, more than half of this machine's {_size(memory)} of memory"
    return None
