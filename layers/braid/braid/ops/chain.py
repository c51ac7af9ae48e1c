"""Incremental chains: a backup's parent, its ancestors, its children (docs/format.md, Chains).

An incremental restores only on top of every ancestor down to its chain's
full, so every path that relies on one walks the chain here first and stops
on the first link that is missing or does not authenticate (IntegrityError,
exit 6), before a byte is written or a producer started: a missing parent
never silently turns an incremental into a full, and a broken chain never
half-restores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from braid.errors import BackupError, IntegrityError, NotFoundError, UsageError
from braid.format.chain import Lineage
from braid.format.ids import BackupRef
from braid.format.repository import Repository
from braid.ops.open import OpenedBackup, open_backup
from braid.ports.keys import KeyService

T = TypeVar("T")

__all__ = ["ancestors", "chain_of", "check_chain", "descendants", "open_chain", "parent_lineage", "resolve_parent"]


def resolve_parent(repository: Repository, name: str, given: str | None, keys: KeyService) -> OpenedBackup:
    """The parent of a new incremental of `name`: `given` (NAME@ID or NAME@latest), or the newest complete backup of `name`.

    Its whole chain is opened and authenticated: IntegrityError (exit 6) when
    any link is missing or unreadable, or `name` has no backup to build on.
    """
    parent = _parent(name, given, lambda ref: open_backup(repository, ref, keys))
    open_chain(repository, BackupRef.parse(parent.manifest.backup), keys, opened=parent, purpose="the incremental's parent")
    return parent


def parent_lineage(repository: Repository, name: str, given: str | None) -> Lineage:
    """The lineage of a new incremental of `name` on `given` (or the newest complete backup of `name`), without a key:
    the parent and every ancestor checked present and matching its manifest's checksum (a cloud agent's view; the
    pipeline authenticates the chain before the producer starts). IntegrityError (exit 6) as `resolve_parent`."""
    manifest = _parent(name, given, lambda ref: repository.load(ref).manifest)
    parent = BackupRef.parse(manifest.backup)
    check_chain(repository, parent, None)
    return Lineage.incremental(parent, manifest.lineage)


def _parent(name: str, given: str | None, load: Callable[[BackupRef], T]) -> T:
    """`load` of the parent `given` (or NAME@latest), its failures as the refusal of the incremental (exit 6)."""
    ref = BackupRef.parse(given) if given else BackupRef(name, "latest")
    if ref.name != name:
        raise UsageError(f"--incremental={ref}: the parent must be a backup of {name} (a chain never mixes names)")
    try:
        return load(ref)
    except NotFoundError as exc:
        what = f"{ref}" if given else f"a complete backup of {name}"
        raise IntegrityError(
            f"the incremental's parent is missing: {what} not found ({exc}); refusing the incremental"
            " (take a full backup without --incremental first)"
        ) from None
    except BackupError as exc:
        raise IntegrityError(f"the incremental's parent {ref} is unreadable: {exc}; refusing the incremental") from None


def open_chain(
    repository: Repository, ref: BackupRef, keys: KeyService, *, opened: OpenedBackup | None = None, purpose: str = "the chain"
) -> list[OpenedBackup]:
    """Every link of `ref`'s chain, oldest (the full) first, each manifest authenticated; `ref` itself last.

    IntegrityError (exit 6) naming the first link that is missing, unreadable,
    or does not name the parent its child expects; NotFoundError only for `ref` itself.
    """
    head = opened or open_backup(repository, ref, keys)
    links = [head]
    expected_full = head.manifest.lineage.full_of(head.manifest.backup)
    while links[-1].manifest.lineage.is_incremental:
        child = links[-1].manifest
        parent_ref = BackupRef.parse(str(child.lineage.parent))
        try:
            parent = open_backup(repository, parent_ref, keys)
        except BackupError as exc:
            state = "missing" if isinstance(exc, NotFoundError) else "unreadable"
            raise IntegrityError(
                f"{purpose} {head.manifest.backup} needs {parent_ref} (the parent of {child.backup}), which is {state}: {exc}"
            ) from None
        if parent.manifest.lineage.full_of(parent.manifest.backup) != expected_full:
            raise IntegrityError(f"{parent_ref} belongs to another chain than {child.backup} says ({expected_full})")
        links.append(parent)
    return links[::-1]


def ancestors(ref: BackupRef, lineages: Mapping[BackupRef, Lineage]) -> list[BackupRef]:
    """`ref`'s ancestors by the given lineages, parent first; stops where a link is not in `lineages`."""
    found: list[BackupRef] = []
    lineage = lineages.get(ref)
    while lineage is not None and lineage.parent is not None:
        parent = BackupRef.parse(lineage.parent)
        if parent in found:
            break  # a cycle cannot be sealed (parents are older), but never loop on one
        found.append(parent)
        lineage = lineages.get(parent)
    return found


def descendants(ref: BackupRef, lineages: Mapping[BackupRef, Lineage]) -> list[BackupRef]:
    """Every backup whose chain goes through `ref`, oldest first."""
    children: dict[BackupRef, list[BackupRef]] = {}
    for child, lineage in lineages.items():
        if lineage.parent is not None:
            children.setdefault(BackupRef.parse(lineage.parent), []).append(child)
    found: list[BackupRef] = []
    todo = [ref]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return sorted(found)


def chain_of(refs: Iterable[BackupRef], lineages: Mapping[BackupRef, Lineage]) -> set[BackupRef]:
    """`refs` and every ancestor they need, by the given lineages."""
    closed = set(refs)
    for ref in list(closed):
        closed.update(ancestors(ref, lineages))
    return closed


def check_chain(repository: Repository, ref: BackupRef, keys: KeyService | None) -> list[BackupRef]:
    """`ref`'s ancestors, oldest first, each checked present and readable: authenticated with `keys`, else its
    manifest's checksum (a quick verify needs no key). IntegrityError (exit 6) naming the first that is not."""
    if keys is not None:
        return [BackupRef.parse(link.manifest.backup) for link in open_chain(repository, ref, keys, purpose="the backup")][:-1]
    found: list[BackupRef] = []
    lineage = repository.load(ref).manifest.lineage
    while lineage.parent is not None:
        parent = BackupRef.parse(lineage.parent)
        try:
            lineage = repository.load(parent).manifest.lineage
        except BackupError as exc:
            state = "missing" if isinstance(exc, NotFoundError) else "unreadable"
            raise IntegrityError(f"the backup {ref} needs {parent}, which is {state}: {exc}") from None
        found.append(parent)
    return found[::-1]
