"""Where each kind of object lives inside a repository (docs/format.md).

    config.json                          repository identity and settings
    manifests/NAME/ID.json               one per complete backup, written last
    data/NAME/ID/NNNNNNNNNN              stored chunks, by global chunk index
    staging/NAME/ID/...                  cloud path only: raw parts, plan, results

Manifests sit apart from data so `list` reads a few small objects, never a
listing of every chunk.
"""

from __future__ import annotations

from braid.format.ids import BackupRef

CONFIG = "config.json"
MANIFESTS = "manifests/"
DATA = "data/"
STAGING = "staging/"


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
    try:
        return BackupRef.parse(f"{parts[0]}@{parts[1]}")
    except Exception:
        return None


def data_prefix(ref: BackupRef) -> str:
    return f"{DATA}{ref.name}/{ref.id}/"


def chunk_key(ref: BackupRef, index: int) -> str:
    return f"{data_prefix(ref)}{index:010d}"


def staging_prefix(ref: BackupRef) -> str:
    return f"{STAGING}{ref.name}/{ref.id}/"
