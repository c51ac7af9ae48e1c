"""Where each kind of object lives inside a repository (docs/format.md).

    config.json                          repository identity and settings
    manifests/NAME/ID.json               one per complete backup, written last
    data/NAME/ID/NNNNNNNNNN              stored chunks, by global chunk index
    data/NAME/ID/lease                   a running local backup's heartbeat (braid.format.lease)
    data/NAME/ID/metadata/KIND           encrypted metadata a stream carried, e.g. backup_manifest (braid.format.metadata)
    staging/NAME/ID/...                  cloud path only: raw parts, plan, results
    policies/NAME.json                   a name's stored retention policy (braid.format.policy)
    prices.json                          the repository's price table, if it has its own (braid.format.prices)
    catalog/summaries/NAME/ID.json       a backup's summary, written just before its manifest (braid.format.summary)
    catalog/log/YYYYMMDD/STAMP~NAME@ID~EVENT  a marker per published or removed backup, by the writer's clock
    catalog/index/STAMP-RAND.json        a snapshot of the catalog (braid.format.catalog)
    rekey/NAME/ID.json                   braid rekey: a re-wrapped manifest, verified here before it replaces the manifest
    verify/NAME/ID/STAMP~MODE~OUTCOME.json  one per verification of the backup (braid.format.verification)
    storage/NAME/ID/STAMP~CLASS          written when a backup's chunks moved to another S3 storage class (braid.format.storage_class)
    verify-runs/RUN/...                  the cloud verify's work: map items and the map's results (one execution)
    prune/RUN/{plan,items,report}.json   a scheduled prune run (braid.pipeline.prune_plan, then .sweep and .prune_tally): what it planned, its map's items, what it did
    prune/RUN/results/NNNNNN.json        one map item's outcome
    wal/NAME/archive.json                the WAL archive of NAME: its system identifier and segment size
    wal/NAME/TTTTTTTTXXXXXXXX/FILE       an archived WAL segment (.partial, .backup) in its directory
    wal/NAME/history/TTTTTTTT.history    a timeline history file
    wal-staging/NAME/FILE                cloud path only: a pushed WAL file, raw, until the WAL worker stores it under wal/
    wal-staging/NAME/SLOT.bundle         cloud path only: raw segments `wal-push --async` staged together (braid.format.wal_bundle)

Manifests sit apart from data so `list` reads a few small objects, never a
listing of every chunk. Every repository key is built and parsed here (the
staging area's own keys below `staging/NAME/ID/` in braid.format.staging):
no other module spells `data/`, `manifests/` or a chunk number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from braid.errors import UsageError
from braid.format.ids import BackupRef, validate_name

if TYPE_CHECKING:
    from braid.format.wal import WalFile

CONFIG = "config.json"
MANIFESTS = "manifests/"
DATA = "data/"
STAGING = "staging/"
POLICIES = "policies/"
CATALOG = "catalog/"
REKEY = "rekey/"
PRICES = "prices.json"
VERIFICATIONS = "verify/"
VERIFY_RUNS = "verify-runs/"
STORAGE = "storage/"
SUMMARIES = "catalog/summaries/"
CATALOG_LOG = "catalog/log/"
CATALOG_INDEX = "catalog/index/"
WAL = "wal/"  # the WAL archives, one per backup name (docs/format.md, "WAL archive")
WAL_STAGING = "wal-staging/"  # cloud path: raw pushed WAL files the WAL worker has not stored yet (docs/format.md)
PUBLISHED = "published"
REMOVED = "removed"


def manifest_key(ref: BackupRef) -> str:
    return f"{MANIFESTS}{ref.name}/{ref.id}.json"


def manifest_prefix(name: str | None = None) -> str:
    return f"{MANIFESTS}{name}/" if name else MANIFESTS


def ref_from_manifest_key(key: str) -> BackupRef | None:
    if not key.startswith(MANIFESTS) or not key.endswith(".json"):
        return None
    parts = key[len(MANIFESTS) : -len(".json")].split("/")
    if len(parts) != 2:
        return None
    return _ref(parts[0], parts[1])


def _ref(name: str, ident: str) -> BackupRef | None:
    try:
        ref = BackupRef.parse(f"{name}@{ident}")
    except UsageError:
        return None
    return None if ref.is_latest else ref


def ref_under(root: str, key: str) -> BackupRef | None:
    """The backup a `data/` or `staging/` object belongs to (`ROOT` NAME/ID/...), or None for any other key."""
    if root not in (DATA, STAGING) or not key.startswith(root):
        return None
    parts = key[len(root) :].split("/")
    if len(parts) < 3:
        return None
    return _ref(parts[0], parts[1])


def data_prefix(ref: BackupRef) -> str:
    return f"{DATA}{ref.name}/{ref.id}/"


def chunk_key(ref: BackupRef, index: int) -> str:
    return f"{data_prefix(ref)}{index:010d}"


LEASE = "lease"


def lease_key(ref: BackupRef) -> str:
    """The heartbeat a running backup refreshes, beside its chunks.

    Under the backup's own data prefix so that everything removing a
    backup's data (a failed backup's discard, prune, forget) removes it too;
    it is never a chunk name (those are ten digits), and nothing that checks
    chunks lists the prefix expecting only chunks.
    """
    return f"{data_prefix(ref)}{LEASE}"


def metadata_key(ref: BackupRef, kind: str) -> str:
    """A backup metadata object (braid.format.metadata): under the data prefix, so removal and Object Lock treat it as the backup's data."""
    return f"{data_prefix(ref)}metadata/{kind}"


def staging_prefix(ref: BackupRef) -> str:
    return f"{STAGING}{ref.name}/{ref.id}/"


def name_prefixes(name: str) -> tuple[str, str, str]:
    """Every prefix holding objects of backups of `name`: manifests, data, staging."""
    return f"{MANIFESTS}{name}/", f"{DATA}{name}/", f"{STAGING}{name}/"


def policy_key(name: str) -> str:
    return f"{POLICIES}{name}.json"


def name_from_policy_key(key: str) -> str | None:
    """The backup name a `policies/NAME.json` key is for, or None for any other key."""
    if not key.startswith(POLICIES) or not key.endswith(".json"):
        return None
    name = key[len(POLICIES) : -len(".json")]
    return name if _valid_name(name) else None


def _valid_name(name: str) -> bool:
    try:
        validate_name(name)
    except UsageError:
        return False
    return True


def summary_key(ref: BackupRef) -> str:
    return f"{SUMMARIES}{ref.name}/{ref.id}.json"


def ref_from_summary_key(key: str) -> BackupRef | None:
    if not key.startswith(SUMMARIES) or not key.endswith(".json"):
        return None
    parts = key[len(SUMMARIES) : -len(".json")].split("/")
    return _ref(parts[0], parts[1]) if len(parts) == 2 else None


def log_day_prefix(stamp: str) -> str:
    """The log prefix of one UTC day; `stamp` is a catalog stamp (YYYYMMDDTHHMMSS.ffffffZ)."""
    return f"{CATALOG_LOG}{stamp[:8]}/"


def log_marker_key(stamp: str, ref: BackupRef, event: str) -> str:
    """A catalog log marker: empty; its key says when (the writer's clock), which backup and what happened.

    Grouped by day, so a reader lists only the days since its snapshot
    instead of every marker ever written (no store offers "list after").
    """
    if event not in (PUBLISHED, REMOVED):
        raise ValueError(f"unknown catalog event {event!r}")
    return f"{log_day_prefix(stamp)}{stamp}~{ref}~{event}"


def parse_log_marker(key: str) -> tuple[str, BackupRef, str] | None:
    """(stamp, backup, event) of a log marker key, or None for any other key."""
    if not key.startswith(CATALOG_LOG):
        return None
    parts = key[len(CATALOG_LOG) :].split("/")
    if len(parts) != 2:
        return None
    fields = parts[1].split("~")
    if len(fields) != 3 or fields[2] not in (PUBLISHED, REMOVED) or not fields[0].startswith(parts[0]):
        return None
    name, _, ident = fields[1].partition("@")
    ref = _ref(name, ident)
    return None if ref is None else (fields[0], ref, fields[2])


def index_key(stamp: str, token: str) -> str:
    return f"{CATALOG_INDEX}{stamp}-{token}.json"


def rekey_key(ref: BackupRef) -> str:
    """Where `braid rekey` writes and checks a manifest's new version before switching (braid.ops.rekey)."""
    return f"{REKEY}{ref.name}/{ref.id}.json"


def verification_prefix(ref: BackupRef | None = None) -> str:
    """Where a backup's verify records live (every backup's, without `ref`)."""
    return f"{VERIFICATIONS}{ref.name}/{ref.id}/" if ref is not None else VERIFICATIONS


def verification_key(ref: BackupRef, stamp: str, mode: str, outcome: str) -> str:
    """A verify record's key; `stamp` is a catalog stamp (YYYYMMDDTHHMMSS.ffffffZ), so key order is time order.

    The mode and outcome are in the key so `braid list` reads every
    backup's newest result from a LIST of `verify/` alone.
    """
    return f"{verification_prefix(ref)}{stamp}~{mode}~{outcome}.json"


def parse_verification_key(key: str) -> tuple[BackupRef, str, str, str] | None:
    """(backup, stamp, mode, outcome) of a verify record key, or None for any other key."""
    if not key.startswith(VERIFICATIONS) or not key.endswith(".json"):
        return None
    parts = key[len(VERIFICATIONS) : -len(".json")].split("/")
    if len(parts) != 3:
        return None
    fields = parts[2].split("~")
    ref = _ref(parts[0], parts[1])
    if ref is None or len(fields) != 3 or not all(fields):
        return None
    return ref, fields[0], fields[1], fields[2]


def storage_prefix(ref: BackupRef | None = None) -> str:
    """Where a backup's storage class records live (every backup's, without `ref`)."""
    return f"{STORAGE}{ref.name}/{ref.id}/" if ref is not None else STORAGE


def storage_record_key(ref: BackupRef, stamp: str, storage_class: str) -> str:
    """An empty object whose key says when (a catalog stamp) the backup's chunks all reached `storage_class`.

    The class is in the key so `list` reads every backup's placement from one LIST of `storage/`.
    """
    return f"{storage_prefix(ref)}{stamp}~{storage_class}"


def parse_storage_record_key(key: str) -> tuple[BackupRef, str, str] | None:
    """(backup, stamp, class) of a storage record key, or None for any other key."""
    if not key.startswith(STORAGE):
        return None
    parts = key[len(STORAGE) :].split("/")
    if len(parts) != 3:
        return None
    stamp, tilde, storage_class = parts[2].partition("~")
    ref = _ref(parts[0], parts[1])
    return (ref, stamp, storage_class) if ref is not None and tilde and stamp and storage_class else None


def verify_run_prefix(run: str) -> str:
    """The cloud verify's work objects of one run (an execution name): items for the map, its results."""
    if not run or "/" in run:
        raise UsageError(f"invalid verify run name {run!r}")
    return f"{VERIFY_RUNS}{run}/"
PRUNE = "prune/"


def prune_run_prefix(run: str) -> str:
    """Everything one scheduled prune run writes (braid.pipeline.prune_plan plans it); `run` is its id."""
    if not run or "/" in run or run.startswith("."):
        raise ValueError(f"invalid prune run id {run!r}")
    return f"{PRUNE}{run}/"


def prune_plan_key(run: str) -> str:
    return f"{prune_run_prefix(run)}plan.json"


def prune_items_key(run: str) -> str:
    return f"{prune_run_prefix(run)}items.json"


def prune_results_prefix(run: str) -> str:
    return f"{prune_run_prefix(run)}results/"


def prune_result_key(run: str, item: int) -> str:
    return f"{prune_results_prefix(run)}{item:06d}.json"


def prune_report_key(run: str) -> str:
    return f"{prune_run_prefix(run)}report.json"


# -- the WAL archive (braid.format.wal names its files) --


def wal_prefix(name: str) -> str:
    """Everything the WAL archive of backup name `name` holds."""
    return f"{WAL}{validate_name(name)}/"


def archive_info_key(name: str) -> str:
    return f"{wal_prefix(name)}archive.json"


def history_prefix(name: str) -> str:
    from braid.format.wal import HISTORY  # WAL names' parsers: not for a backup's keys

    return f"{wal_prefix(name)}{HISTORY}/"


def directory_prefix(name: str, segment: str) -> str:
    """The directory of the segments sharing `segment`'s first 16 digits (timeline and high half)."""
    return f"{wal_prefix(name)}{segment[:16]}/"


def timeline_prefix(name: str, timeline: int) -> str:
    """The prefix every segment directory of `timeline` starts with (a string prefix, as on S3)."""
    return f"{wal_prefix(name)}{timeline:08X}"


def wal_key(name: str, file: WalFile) -> str:
    """Where the archived `file` of `name` is stored."""
    if file.segment is None:
        return f"{history_prefix(name)}{file.name}"
    return f"{directory_prefix(name, file.segment)}{file.name}"


def wal_file_of_key(name: str, key: str) -> WalFile | None:
    """The WAL file an archive key holds, or None for any other key (archive.json, temporary files)."""
    prefix = wal_prefix(name)
    if not key.startswith(prefix):
        return None
    directory, slash, base = key[len(prefix) :].partition("/")
    if not slash or "/" in base:
        return None
    from braid.format.wal import HISTORY, WalFile

    try:
        file = WalFile.parse(base)
    except UsageError:
        return None
    expected = HISTORY if file.segment is None else file.segment[:16]
    return file if directory == expected else None


def wal_staging_prefix(name: str) -> str:
    """The cloud path's raw pushed WAL files of `name` (never beside the encrypted archive: its own IAM grants and lifecycle)."""
    return f"{WAL_STAGING}{validate_name(name)}/"


def wal_staging_key(name: str, file: WalFile) -> str:
    """Where a pushed `file` of `name` waits, raw, for the WAL worker (flat: one object per file name)."""
    return f"{wal_staging_prefix(name)}{file.name}"


def wal_staging_bundle_key(name: str, slot: str) -> str:
    """Where the bundle of segment slot `slot` (its first segment's name, braid.format.wal_bundle.bundle_slot) waits."""
    return f"{wal_staging_prefix(name)}{slot}.bundle"


def wal_staged_bundle(key: str) -> tuple[str, WalFile] | None:
    """The (name, slot's first segment) a `wal-staging/NAME/SLOT.bundle` key holds, or None for any other key."""
    if not key.startswith(WAL_STAGING) or not key.endswith(".bundle"):
        return None
    found = wal_staged_file(key[: -len(".bundle")])
    from braid.format.wal import SEGMENT

    return None if found is None or found[1].kind != SEGMENT else found


def wal_staged_file(key: str) -> tuple[str, WalFile] | None:
    """The (name, file) a `wal-staging/NAME/FILE` key holds, or None for any other key."""
    if not key.startswith(WAL_STAGING):
        return None
    name, slash, base = key[len(WAL_STAGING) :].partition("/")
    if not slash or "/" in base or not _valid_name(name):
        return None
    from braid.format.wal import WalFile

    try:
        return name, WalFile.parse(base)
    except UsageError:
        return None
