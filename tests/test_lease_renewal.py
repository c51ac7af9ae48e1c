"""A lease stops being renewed for good once its owner no longer wants it (issue 21, N7).

The cloud agent's lease lives in staging: after its execution failed (and
Cleanup removed the staging), an agent resumed from SIGSTOP must not write
it back. `wanted(idle seconds)` is asked before each renewal.
"""

from __future__ import annotations

import threading
from pathlib import Path

from braid.adapters.local.store import LocalStore
from braid.engine.lease import BackupLease
from braid.format.ids import BackupRef


def test_a_lease_its_owner_no_longer_wants_is_not_renewed_again(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    ref = BackupRef.new("db")
    asked: list[float] = []
    refused = threading.Event()

    def wanted(idle: float) -> bool:
        asked.append(idle)
        if len(asked) >= 3:
            refused.set()
            return False
        return True

    lease = BackupLease(store, ref, 0.01, key="staging/db/lease", remove_on_exit=False, wanted=wanted)
    with lease:
        assert refused.wait(60), "the lease never asked"
        assert lease._thread is not None
        lease._thread.join(60)  # it ends by itself once refused
        assert not lease._thread.is_alive()
        store.delete(["staging/db/lease"])  # Cleanup removed the staging
    assert lease.refreshes == 3  # on entry, then the two renewals it was allowed
    assert len(asked) == 3 and all(idle >= 0 for idle in asked)
    assert not list(store.list("staging/"))  # nothing written back
