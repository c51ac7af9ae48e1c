"""Retention: which backups to keep, and collecting what a policy lets go.

A policy keeps the union of its rules, per backup name, with restic's
`forget --keep-*` semantics: `keep_last` N, the newest N; `keep_hourly`,
`keep_daily`, `keep_weekly` (ISO weeks), `keep_monthly`, `keep_yearly` N,
the newest backup of each of the last N hours/days/weeks/months/years that
have a backup, counting back from the newest backup (not from now);
`keep_within` DURATION, every backup started after the newest one's start
minus DURATION. Buckets are UTC calendar periods, and a backup's time is the
UTC start its id records. Braid's own `keep_days` D keeps every backup
started in the last D days, measured from now. The rules come from the
command line (or schedule), or, per name, from the policy stored in the
repository (`policies/NAME.json`, braid.format.policy); a name without a
stored policy is left alone. Three guarantees come before any rule:

- Only a backup whose manifest loads and authenticates under its data key
  counts towards a rule. An unreadable one (corrupt, truncated, re-sealed
  under another key, or failing a deep verify the caller ran) is never
  counted, so it can never push a good backup out, and never removed: it
  is reported, and `braid forget` removes it once a person has looked.
- The newest readable backup of each name is always kept: a policy never
  empties a name (`--keep-days` alone would, once backups stop); removing
  it is `braid forget`'s job.
- A backup still under the repository's Object Lock retention (its start
  plus the lock's days, braid.format.lock) is not removed, whatever the
  rules say: it is reported as locked, with its date, and goes in the
  first prune after that date. Nothing of it is touched before, so a
  backup is never left with a manifest and no chunks, or the reverse.
- Pruning removes a backup's manifest first (from that moment the backup
  no longer exists, so a crash mid-prune never leaves a listed backup with
  missing chunks), then its chunks.

Leftovers of backups that never published, and temporary files of
interrupted writes, are collected by the rules in braid.ops.leftovers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from braid.errors import BackupError, IntegrityError, KeyAccessError, NotFoundError, PermissionDeniedError, UsageError
from braid.format.chain import Lineage
from braid.format.ids import BackupRef
from braid.format.layout import POLICIES, data_prefix, name_from_policy_key, name_prefixes, policy_key, staging_prefix
from braid.format.lock import ObjectLock
from braid.format.manifest import Manifest
from braid.format.policy import KeepRules, keep_reasons, parse_policy, policy_bytes
from braid.format.repository import Repository
from braid.format.storage_class import StoragePolicy
from braid.format.timestamps import format_timestamp
from braid.ops.catalog import CatalogLeftovers, catalog_leftovers, collect_catalog_leftovers, parallel, read_catalog
from braid.ops.catalog import Unreadable as CatalogUnreadable
from braid.ops.chain_retention import keep_ancestors, lineages_of_unreadable
from braid.ops.forget import remove_manifest
from braid.ops.leftovers import MIN_ORPHAN_GRACE_HOURS, collect_leftover, collect_temporary, find_leftovers, find_temporary, leftover_candidates
from braid.ops.open import open_backup
from braid.ports.keys import KeyService

__all__ = [
    "MIN_ORPHAN_GRACE_HOURS",
    "Locked",
    "PrunePlan",
    "RetentionPolicy",
    "Unreadable",
    "delete_policy",
    "execute_prune",
    "load_policies",
    "plan_prune",
    "remove_manifest",
    "save_policy",
    "select_kept",
    "split_locked",
    "unreadable_error",
]


@dataclass(frozen=True)
class RetentionPolicy:
    """Keep rules (or `stored`: each name's policy stored in the repository) and the leftovers' grace."""

    rules: KeepRules = field(default_factory=KeepRules)
    orphan_grace_hours: float = 48.0
    stored: bool = False

    @classmethod
    def of(cls, *, orphan_grace_hours: float = 48.0, stored: bool = False, **rules: Any) -> RetentionPolicy:
        """A policy from keep rules given by name (`keep_last=7, keep_daily=14`)."""
        return cls(KeepRules(**rules), orphan_grace_hours, stored)

    def __post_init__(self) -> None:
        if self.stored and not self.rules.is_empty:
            raise UsageError("a policy either gives --keep-* rules or uses the stored policies, not both")
        if not self.stored and self.rules.is_empty:
            raise UsageError(
                "a retention policy needs --keep-last N and/or --keep-days D, or another --keep-* rule"
                " (--keep-hourly/--keep-daily/--keep-weekly/--keep-monthly/--keep-yearly N, --keep-within DURATION)"
            )
        if not math.isfinite(self.orphan_grace_hours) or self.orphan_grace_hours < MIN_ORPHAN_GRACE_HOURS:
            raise UsageError(
                f"--orphan-grace-hours must be at least {MIN_ORPHAN_GRACE_HOURS:g} (got {self.orphan_grace_hours}): a shorter grace"
                " could take a running backup's data (a stalled producer, clock skew between hosts) for leftovers"
            )

    @property
    def grace(self) -> timedelta:
        return timedelta(hours=self.orphan_grace_hours)


@dataclass(frozen=True)
class Unreadable:
    """A published backup that counts towards no rule and is never removed by one."""

    ref: BackupRef
    error: BackupError

    def to_json(self) -> dict[str, str]:
        return {"backup": str(self.ref), "error": str(self.error)}


@dataclass(frozen=True)
class Locked:
    """A backup the rules let go that its Object Lock retention keeps until `until`."""

    ref: BackupRef
    until: datetime

    def to_json(self) -> dict[str, str]:
        return {"backup": str(self.ref), "until": format_timestamp(self.until)}


@dataclass
class PrunePlan:
    now: datetime  # when the plan was made: leftover ages are measured from here
    grace: timedelta
    keep: list[BackupRef] = field(default_factory=list)
    forget: list[BackupRef] = field(default_factory=list)
    orphans: list[BackupRef] = field(default_factory=list)  # data or staging without a manifest, idle past the grace period
    unreadable: list[Unreadable] = field(default_factory=list)
    temporary: list[str] = field(default_factory=list)  # keys of interrupted writes' temporary files, idle past the grace
    spared: list[BackupRef] = field(default_factory=list)  # orphans that showed life again just before deletion
    unmanaged: list[str] = field(default_factory=list)  # names left alone: no stored policy (stored mode only)
    locked: list[Locked] = field(default_factory=list)  # let go by the rules, kept by Object Lock retention until their date
    # The catalog's superseded snapshots and folded log days (braid.ops.catalog); whole-repository plans only.
    catalog: CatalogLeftovers = field(default_factory=lambda: CatalogLeftovers([], []))
    chunks: dict[BackupRef, int] = field(default_factory=dict)  # chunk counts the catalog recorded (from_catalog plans)
    reasons: dict[BackupRef, list[str]] = field(default_factory=dict)  # why each kept backup is kept: the rules that matched

    def to_json(self) -> dict[str, Any]:
        return {
            "locked": [entry.to_json() for entry in self.locked],
            "unmanaged": list(self.unmanaged),
            "keep": [str(r) for r in self.keep],
            "reasons": {str(r): list(self.reasons[r]) for r in self.keep if r in self.reasons},
            "forget": [str(r) for r in self.forget],
            "orphans": [str(r) for r in self.orphans],
            "unreadable": [u.to_json() for u in self.unreadable],
            "temporary": list(self.temporary),
            "spared": [str(r) for r in self.spared],
            "catalog": self.catalog.to_json(),
        }


def _authenticate(repository: Repository, keys: KeyService, ref: BackupRef) -> Manifest | BackupError | None:
    """The backup's authenticated manifest, the error that stopped it, or None (no manifest now)."""
    try:
        return open_backup(repository, ref, keys).manifest
    except NotFoundError:
        return None  # removed since the listing (another prune, a forget): nothing to keep or count
    except BackupError as exc:
        return exc


@dataclass
class _Candidates:
    """Published backups as a plan sees them: `created` by ref, and which of them have been authenticated.

    A host's prune authenticates every manifest up front. The scheduled
    prune in the cloud starts from the catalog's summaries (checksummed, not
    authenticated) and authenticates only the backups its judgement keeps or
    removes, judging again whenever one fails (braid.ops.retention.plan_prune).
    """

    created: dict[BackupRef, str]
    authenticated: set[BackupRef]
    unreadable: list[Unreadable]
    published: set[BackupRef]
    chunks: dict[BackupRef, int] = field(default_factory=dict)
    lineages: dict[BackupRef, Lineage] = field(default_factory=dict)  # chains (braid.ops.chain_retention)

    def counted(self, ref: BackupRef, manifest: Manifest) -> None:
        self.created[ref] = manifest.created
        self.lineages[ref] = manifest.lineage
        self.authenticated.add(ref)


def _authenticate_all(repository: Repository, keys: KeyService, distrusted: Mapping[BackupRef, str]) -> _Candidates:
    """Every published backup, each manifest read and authenticated."""
    found = _Candidates({}, set(), [], set())
    for ref in repository.backups():
        found.published.add(ref)
        if ref in distrusted:
            found.unreadable.append(Unreadable(ref, IntegrityError(distrusted[ref])))
            continue
        outcome = _authenticate(repository, keys, ref)
        if isinstance(outcome, Manifest):
            found.counted(ref, outcome)
        elif outcome is not None:
            found.unreadable.append(Unreadable(ref, outcome))
    return found


def _from_catalog(repository: Repository, distrusted: Mapping[BackupRef, str]) -> _Candidates:
    """Published backups from the catalog (snapshot + log: a handful of reads), none authenticated yet."""
    found = _Candidates({}, set(), [], set())
    for entry in read_catalog(repository, write=False).entries:
        if isinstance(entry, CatalogUnreadable):
            found.published.add(entry.ref)
            found.unreadable.append(Unreadable(entry.ref, entry.error))
            continue
        ref = BackupRef.parse(entry.backup)
        found.published.add(ref)
        if ref in distrusted:
            found.unreadable.append(Unreadable(ref, IntegrityError(distrusted[ref])))
        else:
            found.created[ref] = entry.created
            found.chunks[ref] = entry.chunks
            found.lineages[ref] = entry.lineage
    return found


def select_kept(started_newest_first: Sequence[datetime], rules: KeepRules, now: datetime) -> list[bool]:
    """Which of one name's backups (start times, newest first) the rules keep, as restic's `forget --keep-*`
    (braid.format.policy.keep_reasons says why). The guarantee that the newest is always kept is the caller's."""
    return [bool(reasons) for reasons in keep_reasons(started_newest_first, rules, now)]


def plan_prune(
    repository: Repository,
    policy: RetentionPolicy,
    keys: KeyService,
    now: datetime | None = None,
    *,
    distrusted: Mapping[BackupRef, str] | None = None,
    name: str | None = None,
    from_catalog: bool = False,
) -> PrunePlan:
    """What a prune would do; removes nothing.

    `distrusted`: backups the caller found bad (a failed deep verify), with
    the reason; they are treated as unreadable. `name`: judge only that
    name's backups, and collect only its leftovers. A `stored` policy takes
    each name's rules from the repository; names without one are kept whole
    and listed in `plan.unmanaged`.

    By default every manifest is read and authenticated first (a host's
    `braid prune`). `from_catalog` (the scheduled prune in the cloud, where
    reading every manifest of TiBs of backups does not fit one function)
    starts from the catalog and authenticates only the backups the rules
    keep or let go: when one fails it becomes unreadable, counts towards no
    rule and the names are judged again, until every backup the plan keeps
    or removes has authenticated. Backups of names the plan leaves alone are
    not read. Leftovers are then found from the prefixes under `data/` and
    `staging/` (a LIST with a delimiter per name), never a listing of every
    chunk; each is judged idle just before deletion (braid.ops.leftovers).
    """
    now = now or datetime.now(UTC)
    plan = PrunePlan(now=now, grace=policy.grace)
    stored = load_policies(repository) if policy.stored else {}
    distrust = distrusted or {}
    found = _from_catalog(repository, distrust) if from_catalog else _authenticate_all(repository, keys, distrust)
    while True:
        plan.reasons = {}
        plan.keep, plan.forget, plan.unmanaged = _judge(found.created, stored if policy.stored else None, policy.rules, name, now, plan.reasons)
        unchecked = [ref for ref in (*plan.keep, *plan.forget) if ref not in found.authenticated and ref.name not in plan.unmanaged]
        if not unchecked:
            break
        for ref, outcome in zip(unchecked, parallel(unchecked, lambda r: _authenticate(repository, keys, r)), strict=True):
            if isinstance(outcome, Manifest):
                found.counted(ref, outcome)
                continue
            del found.created[ref]
            if outcome is not None:
                found.unreadable.append(Unreadable(ref, outcome))
    plan.unreadable = [u for u in found.unreadable if name is None or u.ref.name == name]
    plan.forget, plan.locked = split_locked(repository.object_lock, plan.forget, now)
    held = [entry.ref for entry in plan.locked] + [u.ref for u in found.unreadable]
    plan.keep, plan.forget = keep_ancestors(plan.keep, plan.forget, held, lineages_of_unreadable(repository, found.unreadable, found.lineages))
    plan.chunks = {ref: found.chunks[ref] for ref in plan.forget if ref in found.chunks}
    if from_catalog:
        plan.orphans = [ref for ref in leftover_candidates(repository.store, found.published, now, policy.grace) if name is None or ref.name == name]
    else:
        plan.orphans = [leftover.ref for leftover in find_leftovers(repository.store, found.published, now, policy.grace)]
        plan.orphans = [ref for ref in plan.orphans if name is None or ref.name == name]
    plan.temporary = find_temporary(repository.store, now, policy.grace)
    if name is not None:
        plan.temporary = [key for key in plan.temporary if key.startswith(name_prefixes(name))]
    else:
        plan.catalog = catalog_leftovers(repository, now)
    plan.keep.sort()
    plan.forget.sort()
    plan.unmanaged.sort()
    plan.unreadable.sort(key=lambda u: u.ref)
    return plan


def split_locked(lock: ObjectLock | None, refs: Sequence[BackupRef], now: datetime) -> tuple[list[BackupRef], list[Locked]]:
    """(the backups that may go now, those still under `lock`'s retention with their dates).

    In the planning, not the execution, so every prune (the host's, the
    scheduled one in the cloud) keeps a locked backup whole and says until when.
    """
    if lock is None:
        return list(refs), []
    free = [ref for ref in refs if not lock.holds(ref, now)]
    held = [Locked(ref, lock.until(ref)) for ref in refs if lock.holds(ref, now)]
    return free, sorted(held, key=lambda entry: entry.ref)
def _judge(
    created: Mapping[BackupRef, str],
    stored: Mapping[str, KeepRules] | None,
    rules: KeepRules,
    name: str | None,
    now: datetime,
    reasons: dict[BackupRef, list[str]] | None = None,
) -> tuple[list[BackupRef], list[BackupRef], list[str]]:
    """(keep, forget, unmanaged names) for the counted backups: each name's rules, and its newest always kept;
    `reasons` gets, for each backup a rule keeps, the rules that matched."""
    keep: list[BackupRef] = []
    forget: list[BackupRef] = []
    unmanaged: list[str] = []
    by_name: dict[str, list[BackupRef]] = {}
    for ref in created:
        if name is None or ref.name == name:
            by_name.setdefault(ref.name, []).append(ref)
    for backup_name, refs in by_name.items():
        # Newest first as `NAME@latest` resolves: id's millisecond, then the manifest's own start time.
        newest_first = sorted(refs, key=lambda r: (r.id.partition("-")[0], created[r], r.id), reverse=True)
        name_rules = stored.get(backup_name) if stored is not None else rules
        if name_rules is None:
            unmanaged.append(backup_name)
            keep.extend(newest_first)
            continue
        why = keep_reasons([ref.started for ref in newest_first], name_rules, now)
        why[0] = why[0] or [f"the newest of {backup_name} (always kept)"]
        for ref, keep_it in zip(newest_first, why, strict=True):
            (keep if keep_it else forget).append(ref)
            if keep_it and reasons is not None:
                reasons[ref] = keep_it
    return keep, forget, unmanaged


def load_policies(repository: Repository) -> dict[str, KeepRules]:
    """Every name's stored policy; IntegrityError if any is malformed (then nothing is pruned)."""
    policies: dict[str, KeepRules] = {}
    for info in repository.store.list(POLICIES):
        policy_name = name_from_policy_key(info.key)
        if policy_name is None:
            continue  # not a policy (a temporary file of an interrupted write)
        try:
            raw = repository.store.get(info.key)
        except NotFoundError:
            continue  # removed since the listing
        policies[policy_name] = parse_policy(raw, policy_name, f"{repository.url}/{info.key}")
    return policies


def save_policy(repository: Repository, name: str, rules: KeepRules, storage: StoragePolicy | None = None) -> str:
    """Store `rules` (and a storage class setting) as NAME's policy (replacing any); returns the key."""
    key = policy_key(name)
    repository.store.put(key, policy_bytes(name, rules, storage))
    return key


def delete_policy(repository: Repository, name: str) -> bool:
    """Remove NAME's stored policy; False if it had none."""
    key = policy_key(name)
    if repository.store.head(key) is None:
        return False
    repository.store.delete([key])
    return True


def execute_prune(repository: Repository, plan: PrunePlan) -> None:
    """Carry out a plan: forget what the policy let go, collect leftovers still idle.

    Orphans that show life again (a manifest appeared, or new activity)
    move from `plan.orphans` to `plan.spared`; temporary files touched
    since leave `plan.temporary`; so the plan reports what was done.
    """
    store = repository.store
    for ref in plan.forget:
        remove_manifest(store, ref)
        store.delete(info.key for info in store.list(data_prefix(ref)))
        store.delete(info.key for info in store.list(staging_prefix(ref)))
    collected = []
    for ref in plan.orphans:
        if collect_leftover(store, ref, plan.now, plan.grace):
            collected.append(ref)
        else:
            plan.spared.append(ref)
    plan.orphans = collected
    plan.temporary = collect_temporary(store, plan.temporary, plan.now, plan.grace)
    collect_catalog_leftovers(repository, plan.catalog)


def unreadable_error(plan: PrunePlan) -> BackupError | None:
    """The one-line error a prune that met unreadable backups ends with (None: it met none).

    A key error when every one of them failed for want of a key (the key
    service, not the backups, needs fixing); an integrity error otherwise.
    """
    if not plan.unreadable:
        return None
    first = plan.unreadable[0]
    count = len(plan.unreadable)
    reason = str(first.error)
    if not reason.startswith(f"backup {first.ref}"):  # most errors name the backup already
        reason = f"{first.ref}: {reason}"
    if isinstance(first.error, PermissionDeniedError):  # not damage: a run as another user left files this one cannot read
        hint = f"fix permissions: chown -R the repository's files to its owner; nothing is wrong with {first.ref} itself"
    else:
        hint = f"look at it with 'braid verify {first.ref} --deep'; remove it with 'braid forget {first.ref}'"
    message = f"{count} backup(s) could not be read and were neither counted nor removed; first: {reason} ({hint})"
    if all(isinstance(u.error, PermissionDeniedError) for u in plan.unreadable):
        return PermissionDeniedError(message)
    if all(isinstance(u.error, KeyAccessError) for u in plan.unreadable):
        return KeyAccessError(message)
    return IntegrityError(message)
