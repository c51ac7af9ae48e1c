"""Retention over incremental chains: nothing a kept backup needs is ever let go (docs/format.md, Chains).

Keep rules choose restore points among a name's readable backups, each
backup (full or incremental) counting as one. A backup restores only with
every ancestor down to its chain's full, so each backup the rules keep, and
each one Object Lock retention keeps, keeps its ancestors too: they move from
the plan's removals to its keeps. `prune --keep-last 1` on a chain therefore
keeps the whole chain of the newest backup, and the cloud prune fan-out,
which plans with the same function, never removes a parent a kept child needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from braid.errors import BackupError
from braid.format.chain import Lineage
from braid.format.ids import BackupRef
from braid.format.repository import Repository
from braid.ops.chain import chain_of

__all__ = ["keep_ancestors", "lineages_of_unreadable"]


def keep_ancestors(
    keep: Sequence[BackupRef], forget: Sequence[BackupRef], locked: Iterable[BackupRef], lineages: Mapping[BackupRef, Lineage]
) -> tuple[list[BackupRef], list[BackupRef]]:
    """(keep, forget) with every ancestor of a kept or locked backup moved from `forget` to `keep`."""
    needed = chain_of([*keep, *locked], lineages)
    return [*keep, *(ref for ref in forget if ref in needed)], [ref for ref in forget if ref not in needed]


class _Judged(Protocol):
    @property
    def ref(self) -> BackupRef: ...


def lineages_of_unreadable(repository: Repository, unreadable: Iterable[_Judged], lineages: Mapping[BackupRef, Lineage]) -> dict[BackupRef, Lineage]:
    """`lineages` and those of backups that did not authenticate but whose manifest still checks (a key the host
    lacks, a failed deep verify): never removed themselves, they keep the ancestors they name too."""
    found = dict(lineages)
    for entry in unreadable:
        try:
            found[entry.ref] = repository.load(entry.ref).manifest.lineage
        except BackupError:
            continue
    return found
