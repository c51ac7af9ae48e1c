"""The memory check before a backup or restore starts (braid.engine.memory does the sums).

Refusals are usage errors (exit 2) naming the figure; a warning is one line
on stderr and the command goes on, since the user may know the machine has
nothing else to run.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from braid.cli.sizes import format_size
from braid.engine.memory import check_memory, cloud_backup_buffers, local_backup_buffers, restore_buffers

if TYPE_CHECKING:
    from braid.format.manifest import Manifest


def _warn(warning: str | None) -> None:
    if warning:
        print(f"braid: warning: {warning}", file=sys.stderr)


def check_backup_memory(*, cloud: bool, inputs: int, chunk_size: int, workers: int, concurrency: int | None) -> None:
    """`--workers` bounds a local backup, `--concurrency` a cloud one: the option the user can lower is named."""
    size = f"--chunk-size {format_size(chunk_size)}"
    if cloud:
        from braid.agent.limits import default_concurrency  # the cloud agent's imports are not the local path's

        uploads = concurrency or default_concurrency(inputs)
        _warn(check_memory(cloud_backup_buffers(inputs, uploads), chunk_size, f"--concurrency {uploads} with {size}"))
    else:
        _warn(check_memory(local_backup_buffers(inputs, workers), chunk_size, f"--workers {workers} with {size}"))


def check_restore_memory(manifest: Manifest, workers: int) -> None:
    buffers = restore_buffers(len(manifest.inputs), workers, manifest.chunk_count)
    _warn(check_memory(buffers, manifest.chunk_size, f"--workers {workers} for chunks of {format_size(manifest.chunk_size)}"))
