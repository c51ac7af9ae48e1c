"""Keeping a running backup's lease fresh (braid.format.lease says why it exists).

A context manager around the whole backup: the lease is written before the
first chunk, rewritten every `interval` seconds by a daemon thread while the
stream and finalize run, however long the producer stalls, and removed
once the backup has published or been discarded. A refresh that fails is
retried at the next tick rather than failing the backup: the chunks' own
modification times still show activity, and a repository that refuses a
small write will fail the backup's chunk writes anyway.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import TracebackType

from braid.errors import BackupError
from braid.format.ids import BackupRef
from braid.format.layout import lease_key
from braid.format.lease import LEASE_REFRESH_SECONDS, LeaseRecord
from braid.format.timestamps import utc_now
from braid.ports.store import ObjectStore


def _hostname() -> str:
    """This host's name, as socket.gethostname() gives it (the kernel's node name), without loading socket."""
    return os.uname().nodename


class BackupLease:
    def __init__(
        self,
        store: ObjectStore,
        ref: BackupRef,
        interval: float = LEASE_REFRESH_SECONDS,
        *,
        key: str | None = None,
        remove_on_exit: bool = True,
        wanted: Callable[[float], bool] | None = None,
    ) -> None:
        """`key`: where the lease lives (default: beside the chunks, braid.format.layout.lease_key).
        `remove_on_exit=False` leaves it for whoever removes the rest (the cloud
        agent's lease stays in staging, which the pipeline removes when done).
        `wanted(seconds since the last refresh)`, asked before each renewal:
        False stops renewing for good (the cloud agent's execution failed, and
        its staging may be gone: a renewal would write into removed staging)."""
        self._store = store
        self._ref = ref
        self._interval = interval
        self._key = key or lease_key(ref)
        self._remove_on_exit = remove_on_exit
        self._wanted = wanted
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0  # how many times the lease was written (tests and diagnostics)

    @property
    def key(self) -> str:
        return self._key

    def refresh(self) -> None:
        record = LeaseRecord(backup=str(self._ref), refreshed=utc_now(), host=_hostname(), pid=os.getpid())
        # Not fsynced: after a host crash the chunks' own times still show
        # when the backup was last alive, and no fsync stalls the backup.
        self._store.put(self.key, record.to_bytes(), durable=False)
        self.refreshes += 1

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stopped.wait(self._interval):
            try:
                if self._wanted is not None and not self._wanted(time.monotonic() - last):
                    return
                self.refresh()
                last = time.monotonic()
            except BackupError:
                continue  # see the module docstring

    def __enter__(self) -> BackupLease:
        self.refresh()  # before any chunk: a repository that refuses this refuses the backup
        self._thread = threading.Thread(target=self._run, name=f"braid-lease-{self._ref.id}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        if not self._remove_on_exit:
            return
        try:
            self._store.delete([self.key])
        except BackupError:
            # Harmless where it stays: beside a published backup's chunks it
            # goes with them (prune, forget), beside a failed one's it only
            # dates that backup's leftovers. Failing a published backup
            # over it would report a good backup as lost.
            pass
